"""Two directives that render normcert's own sources into the documentation at build time,
so that the reference cannot drift from the code:

``normcert-cli``
    the ``--help`` of the ``normcert`` command and of each subcommand, from the argparse
    parser that ``normcert.cli`` builds (``_parser``).

``normcert-schema``
    the fields of the certificate's JSON Schema
    (``properties/evidence/normcert-certificate.schema.json``), one table per object.

Both import nothing heavy: ``normcert.cli`` is torch-free at import, and the schema is JSON.
"""
from __future__ import annotations

import argparse
import json
import os

from docutils import nodes
from docutils.parsers.rst import Directive

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "..", "..", "properties", "evidence", "normcert-certificate.schema.json")


def _help(parser: argparse.ArgumentParser) -> str:
    # a fixed width, so that the page does not depend on the terminal the build runs in
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_help()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _section(name: str, title: str, body: list[nodes.Node]) -> nodes.section:
    section = nodes.section(ids=[nodes.make_id(name)], names=[nodes.fully_normalize_name(name)])
    section += nodes.title(text=title)
    for node in body:
        section += node
    return section


class CliDirective(Directive):
    has_content = False

    def run(self):
        from normcert import cli

        parser = cli._parser()
        out = [nodes.literal_block(text=_help(parser), language="text")]
        for name, sub in _subparsers(parser).items():
            out.append(_section(f"normcert-{name}", f"normcert {name}",
                                [nodes.literal_block(text=_help(sub), language="text")]))
        return out


def _type(spec: dict) -> str:
    if "$ref" in spec:
        return spec["$ref"].rsplit("/", 1)[-1]
    if "const" in spec:
        return f"constant {json.dumps(spec['const'])}"
    if "enum" in spec:
        return "one of " + ", ".join(json.dumps(v) for v in spec["enum"])
    kind = spec.get("type")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array" and isinstance(spec.get("items"), dict):
        kind = f"array of {_type(spec['items'])}"
    if "anyOf" in spec or "oneOf" in spec:
        kind = " or ".join(_type(s) for s in spec.get("anyOf", spec.get("oneOf")))
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        kind = f"object of {_type(spec['additionalProperties'])} by name"
    if "pattern" in spec:
        kind = f"{kind} matching {spec['pattern']}"
    return kind or "any"


def _rows(obj: dict, prefix: str):
    """One row per field; an object's own fields follow it as ``field.sub``."""
    required = set(obj.get("required", ()))
    for name, spec in obj.get("properties", {}).items():
        yield prefix + name, _type(spec), "yes" if name in required else "", spec.get("description", "")
        if isinstance(spec, dict) and spec.get("properties"):
            yield from _rows(spec, f"{prefix}{name}.")


def _table(obj: dict) -> nodes.table:
    rows = list(_rows(obj, ""))
    table = nodes.table()
    group = nodes.tgroup(cols=4)
    table += group
    for width in (18, 22, 8, 52):
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    body = nodes.tbody()
    group += body
    for target, cells in ((head, ("field", "type", "required", "meaning")),) + tuple((body, r) for r in rows):
        row = nodes.row()
        for i, text in enumerate(cells):
            entry = nodes.entry()
            entry += nodes.paragraph("", "", nodes.literal(text, text) if i == 0 else nodes.Text(text))
            row += entry
        target += row
    return table


class SchemaDirective(Directive):
    has_content = False

    def run(self):
        with open(SCHEMA, encoding="utf-8") as f:
            schema = json.load(f)
        out = [nodes.paragraph(text=f"Schema {schema.get('$id')}: {schema.get('description', '')}"),
               _section("certificate-top-level", "The certificate (top level)", [_table(schema)])]
        for name, spec in schema.get("$defs", {}).items():
            body = [nodes.paragraph(text=spec["description"])] if spec.get("description") else []
            if spec.get("properties"):
                body.append(_table(spec))
            else:
                body.append(nodes.paragraph(text=f"Type: {_type(spec)}."))
            out.append(_section(f"certificate-{name}", name, body))
        return out


def setup(app):
    app.add_directive("normcert-cli", CliDirective)
    app.add_directive("normcert-schema", SchemaDirective)
    # the generated pages depend on these sources: rebuild them when either changes
    app.connect("env-get-outdated", lambda app, env, added, changed, removed:
                ["reference/cli", "reference/certificate"])
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
