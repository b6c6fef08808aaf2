"""Every field of every record is read: a field nobody reads is a claim nobody checks.

The records are the package's dataclasses (the op, argument kind and family records, the
implementation and domain records, the case, the session, ...).  A field counts as read when
some module of the package loads it as an attribute (``x.field``) or, for a record
serialised with ``dataclasses.asdict``, by key (``r["field"]``); writing it in a
constructor does not count.  The scan covers the installed package's source, tests included
(a field only a test reads is still documented behaviour under test).
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import normcert


SUBPACKAGES = ("oracle", "impls", "properties")  # each in its own folder (pyproject's package-dir)


def _modules():
    for sub in SUBPACKAGES:
        package = importlib.import_module(f"normcert.{sub}")
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            leaf = info.name.rsplit(".", 1)[-1]
            if not leaf.startswith("test_") and leaf != "__main__":  # a __main__ runs on import
                yield importlib.import_module(info.name)


def _sources() -> list[Path]:
    roots = [Path(p) for p in normcert.__path__]
    roots += [Path(p) for sub in SUBPACKAGES for p in importlib.import_module(f"normcert.{sub}").__path__]
    return sorted({f for r in roots for f in r.rglob("*.py")})


def _attributes_read() -> set[str]:
    read = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and \
                    isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                read.add(node.slice.value)  # a record read back from its JSON (``dataclasses.asdict``)
    return read


def test_every_field_of_every_record_is_read():
    read = _attributes_read()
    records = {cls for m in _modules() for _, cls in inspect.getmembers(m, inspect.isclass)
               if dataclasses.is_dataclass(cls) and cls.__module__.startswith("normcert.")}
    assert len(records) >= 8, records  # the scan found the records
    unread = sorted(f"{cls.__module__}.{cls.__qualname__}.{f.name}"
                    for cls in records for f in dataclasses.fields(cls) if f.name not in read)
    assert not unread, "fields nobody reads: " + ", ".join(unread)
