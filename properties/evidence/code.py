"""The code a certificate certifies: per kernel, a digest of its module and of what that module imports
from its own package or folder, and the installed distribution it comes from.

``record(module)`` is ``{"digest", "files", "within", "distribution"}``:

* ``files``: module name -> SHA-256 of the file it is loaded from (source, bytecode or extension), for
  the kernel's module and every module it reaches by ``import`` statements read from the sources
  (``ast``: those inside functions too), transitively, that lies *within* the kernel's own code:
  for a module of a package, the modules of the same top-level package (and the ``__init__`` of each
  package above them, which runs on import); for a top-level module (``mykern.py`` in a folder), the
  modules found in the folder it was loaded from.  A module of an installed release (a distribution
  pip installed whose ``.dist-info/RECORD`` lists the module's file; not an editable one) is named by the distribution's version and
  its own file alone: walking a released package costs what its size does (torch.nn.functional
  reaches 1,699 files of torch, 69 s on a loaded 2-core machine), and code under development, which
  is what changes between two shards' runs, is a folder, a checkout (an ``.egg-info`` beside it
  included) or an editable install, all walked (``_holds``);
* ``digest``: SHA-256 of the lines "<sha256>  <module name>" sorted by name (``sha256sum``'s form):
  it names the code by content and module name alone, not by path, so the same code checked out in
  two places has one digest, and any edit of any file listed gives another;
* ``within``: that scope in words ("package mylib", "folder of mykern.py", "module alone (installed
  liger_kernel 0.5.2)");
* ``distribution``: ``{"name", "version"}`` of the installed distribution that holds the kernel's
  module (the distribution named as its top-level package, else those
  ``importlib.metadata.packages_distributions`` names for it; the module's file among the
  distribution's files or under an editable install's project folder), else null.

Why the imports are read from the sources and not taken from ``sys.modules`` after the run: what a
run has loaded depends on what it ran (a helper imported lazily on one property's path is loaded in
the shard that ran that property only), so two shards of the same code would differ; the import
statements are a function of the code alone, the same in every shard, worker and machine.  What this
does not see: a module imported by a computed name (``importlib.import_module(f"...")``) and a file
the kernel reads itself (a CUDA source compiled at run time, a JSON of configs).  Nothing is
imported or run to find the files: a module not yet loaded is located by the import system's finders.

``changes(a, b)`` says, in words, how two such records differ (the files added, removed or edited and
the distribution's version): ``shards.problems`` refuses to merge shards whose code differs and
``presentation.compare`` lists it.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from importlib import metadata
from importlib.machinery import PathFinder
from urllib.parse import unquote, urlparse


def of(targets: dict[str, str]) -> dict[str, dict]:
    """Kernel id -> ``record`` of the module of its target ("MODULE:ATTR", "MODULE:ATTR@CONVENTION")."""
    reader = _Reader()
    found = {m: reader.record(m) for m in {target.partition(":")[0] for target in targets.values()}}
    return {kid: found[target.partition(":")[0]] for kid, target in targets.items()}


def record(module: str) -> dict:
    """The code of ``module`` (an imported module's name), as the module docstring describes it."""
    return _Reader().record(module)


def changes(a: dict | None, b: dict | None) -> list[str]:
    """How the code record ``b`` differs from ``a`` (``record``), one phrase each; [] where they name
    the same code.  A missing record (a certificate before normcert-certificate/10) is a difference:
    the code cannot be told the same."""
    if not a or not b:
        return [] if a == b else ["no code digest recorded " + ("before" if not a else "after")
                                  + " (a certificate before normcert-certificate/10)"]
    out = []
    x, y = a.get("files", {}), b.get("files", {})
    out += [f"{n} edited (sha256 {x[n][:12]} -> {y[n][:12]})" for n in sorted(x.keys() & y.keys()) if x[n] != y[n]]
    out += [f"{n} added" for n in sorted(y.keys() - x.keys())]
    out += [f"{n} removed" for n in sorted(x.keys() - y.keys())]
    if a.get("distribution") != b.get("distribution"):
        out.append(f"distribution {_dist(a.get('distribution'))} -> {_dist(b.get('distribution'))}")
    if not out and a.get("digest") != b.get("digest"):
        out.append(f"digest {str(a.get('digest'))[:12]} -> {str(b.get('digest'))[:12]}")
    return out


def short(code: dict | None) -> str:
    """A code record in one line: its digest's first 12 digits, its files and its distribution."""
    if not code:
        return "not recorded"
    digest = str(code.get("digest") or "none")[:12]
    return (f"sha256 {digest}, {len(code.get('files', {}))} file(s) of the {code.get('within', '')}"
            + (f", {_dist(code['distribution'])}" if code.get("distribution") else ""))


def _dist(d: dict | None) -> str:
    return f"{d['name']} {d['version']}" if d else "none"


def _spec(name: str, folder: str | None = None):
    """The module spec of ``name``, imported or not (found by the import system's finders without
    running anything: a package above it not yet imported is located the same way); None where none
    is found.  For a kernel that is a top-level module, ``folder`` is the folder it was loaded from,
    and a top-level name not yet imported is looked for there alone."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None)
    parent, _, _ = name.rpartition(".")
    if parent:
        above = _spec(parent, folder)
        if above is None or above.submodule_search_locations is None:
            return None
        path = list(above.submodule_search_locations)
    elif folder is not None:
        path = [folder]
    else:
        path = None
    finders = [f for f in sys.meta_path if hasattr(f, "find_spec")] if parent or folder is None else []
    for finder in finders or [PathFinder]:
        try:
            spec = finder.find_spec(name, path)
        except (ImportError, ValueError, AttributeError, TypeError):
            continue
        if spec is not None:
            return spec
    return None


def _file(spec) -> str | None:
    """The file a module is loaded from, None for one without (built in, a namespace package)."""
    origin = getattr(spec, "origin", None) if spec is not None and getattr(spec, "has_location", False) else None
    return origin if origin and os.path.isfile(origin) else None


def _inside(name: str, folder: str) -> bool:
    """Is module ``name`` (a top-level module's import) loaded from ``folder``?"""
    spec = _spec(name, folder)
    where = [_file(spec)] if _file(spec) else list(getattr(spec, "submodule_search_locations", None) or [])
    root = os.path.realpath(folder)
    return bool(where) and all(os.path.realpath(w).startswith(root + os.sep) for w in where)


def _imports(name: str, spec, path: str, data: bytes) -> set[str]:
    """The modules the source ``data`` of module ``name`` imports (each package above an imported
    module too: its ``__init__`` runs), read with ``ast``; none for a module without Python source."""
    if not path.endswith(".py"):
        return set()
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError):
        return set()
    package = name if spec.submodule_search_locations is not None else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts) or not parts:
                    continue
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if not base:
                continue
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if a.name != "*")  # where it names a submodule
    return {".".join(n.split(".")[:k]) for n in out for k in range(1, n.count(".") + 2)}


def _statements(body: list):
    """Every statement of ``body`` and of the blocks inside it (functions, classes, branches,
    handlers, cases): an import is a statement, so no expression is visited (half of ``ast.walk``'s time)."""
    waiting = list(body)
    while waiting:
        node = waiting.pop()
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                waiting.extend(inner)


class _Reader:
    """Reads code records (one ``of`` call): each file hashed and parsed once, the installed
    distributions listed at most once (``distribution``)."""

    def __init__(self):
        self._by_top: dict[str, list[str]] | None = None
        self._read: dict[str, str] = {}  # path -> SHA-256
        self._imported: dict[str, set[str]] = {}  # module name -> what it imports

    def record(self, module: str) -> dict:
        spec = _spec(module)
        origin = _file(spec)
        top = module.split(".")[0]
        distribution, developed = self.distribution(top, origin)
        if distribution and not developed:  # a release: named by its version, its own file hashed
            files = {module: self.read(origin)} if origin else {}
            within = f"module alone (installed {_dist(distribution)})"
        else:
            folder = os.path.dirname(origin) if origin and "." not in module and spec.submodule_search_locations \
                is None else None
            within = f"folder of {os.path.basename(origin)}" if folder else f"package {top}"
            files = self.walk(module, top, folder)
        lines = "".join(f"{files[n]}  {n}\n" for n in sorted(files))
        return {"digest": hashlib.sha256(lines.encode()).hexdigest() if files else None,
                "files": dict(sorted(files.items())), "within": within, "distribution": distribution}

    def walk(self, module: str, top: str, folder: str | None) -> dict[str, str]:
        """Module name -> SHA-256 of ``module`` and of every module its imports reach within ``top``
        (a package) or ``folder`` (a top-level module's)."""
        files: dict[str, str] = {}
        waiting, seen = [module], {module}
        while waiting:
            name = waiting.pop()
            found = _spec(name, folder)
            path = _file(found)
            if not path:
                continue
            files[name] = self.read(path)
            for other in sorted(self.imports(name, found, path) - seen):
                if other.split(".")[0] == top if folder is None else _inside(other, folder):
                    seen.add(other)
                    waiting.append(other)
        return files

    def read(self, path: str) -> str:
        """SHA-256 of the file at ``path``."""
        if path not in self._read:
            with open(path, "rb") as f:
                self._read[path] = hashlib.sha256(f.read()).hexdigest()
        return self._read[path]

    def imports(self, name: str, spec, path: str) -> set[str]:
        """The modules module ``name``'s source at ``path`` imports (``_imports``)."""
        if name not in self._imported:
            with open(path, "rb") as f:
                self._imported[name] = _imports(name, spec, path, f.read())
        return self._imported[name]

    def distribution(self, top: str, origin: str | None) -> tuple[dict | None, bool]:
        """(``{"name", "version"}`` of the distribution that holds ``origin``, the module of top-level
        name ``top``, or None; is it code under development: ``_holds``).  The distribution named
        ``top`` is tried first (1 ms); the installed distributions are listed by top-level name
        (``packages_distributions``: 0.5 to 1.5 s on a loaded machine) only where that is not it and
        the folder ``top`` was found in holds installed metadata (a folder of one's own kernels holds
        none: an editable install named otherwise than its package is then walked, nameless)."""
        if origin is None:
            return None, False
        found = _held(top, origin)
        if found[0] is None and _installs_beside(top):
            if self._by_top is None:
                self._by_top = metadata.packages_distributions()
            found = next((f for f in (_held(name, origin) for name in self._by_top.get(top, [])) if f[0]), found)
        return found


def _held(name: str, origin: str) -> tuple[dict | None, bool]:
    """(``{"name", "version"}`` of distribution ``name`` where it holds ``origin``, else None; is it
    code under development: ``_holds``)."""
    try:
        dist = metadata.distribution(name)
    except (metadata.PackageNotFoundError, ValueError):
        return None, False
    held = _holds(dist, origin)
    return ({"name": dist.metadata["Name"], "version": dist.version} if held else None), held == "source"


def _installs_beside(top: str) -> bool:
    """Does the folder top-level module or package ``top`` was found in hold installed metadata
    (``*.dist-info``, ``*.egg-info``: a site-packages, a source checkout)?"""
    spec = getattr(sys.modules.get(top), "__spec__", None)
    where = [_file(spec)] if _file(spec) else list(getattr(spec, "submodule_search_locations", None) or [])
    for place in where:
        try:
            if any(e.endswith((".dist-info", ".egg-info")) for e in os.listdir(os.path.dirname(place))):
                return True
        except OSError:
            continue
    return False


def _holds(dist, origin: str) -> str:
    """"installed" where ``origin`` is one of the files a wheel's install of ``dist`` recorded (its
    ``.dist-info/RECORD``); "source" where it lies under ``dist``'s editable install's project folder,
    or is listed by an ``.egg-info`` (a source checkout's, ``setup.py develop``'s: code under
    development, walked); else ""."""
    real = os.path.realpath(origin)
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    if direct.get("dir_info", {}).get("editable"):
        root = os.path.realpath(unquote(urlparse(direct.get("url", "")).path))
        return "source" if real.startswith(root + os.sep) else ""
    where = os.path.relpath(real, os.path.realpath(str(dist.locate_file("")))).replace(os.sep, "/")
    record = dist.read_text("RECORD")
    if record is not None:  # a wheel's install: "path,hash,size" lines (read as text: torch's has 15,000)
        return "installed" if ("\n" + record).find(f"\n{where},") >= 0 else ""
    return "source" if where in {str(p) for p in dist.files or []} else ""
