"""The house's layout holds (docs/explanation/architecture.md): every import runs down the layers,
no module imports itself back through others, no source file outgrows a sitting, and the suite a
certify run collects is one folder that holds the family modules and nothing of normcert's tests.

The layers, bottom to top (``LAYERS``): a module may import its own layer and those below it.
Imports are read from the sources (every ``import`` statement, those inside functions too: an
import deferred for speed is still a dependency), not from what happens to be loaded.
"""
from __future__ import annotations

import ast
from pathlib import Path

import normcert

ROOT = Path(normcert.__file__).resolve().parents[1]
FOLDERS = {"normcert": "normcert", "oracle": "normcert.oracle", "impls": "normcert.impls",
           "properties": "normcert.properties"}  # pyproject's package-dir
LAYERS = ("normcert.__init__",  # the version and the source revision, nothing else
          "normcert.oracle",
          "normcert.properties.declared",
          "normcert.impls",
          "normcert.properties.search",
          "normcert.properties.harness",
          "normcert.properties.families",
          "normcert.properties.evidence",
          "normcert.properties.run",
          "normcert.properties.presentation",
          "normcert.properties.suite",
          "normcert.cli",  # the command, with normcert.__main__
          "normcert.properties.tests")
MAX_LINES = 650  # "about 600": what a newcomer reads in one sitting (architecture.md)


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int:
    if module in ("normcert", "normcert.properties"):  # the package roots: docstrings and the version
        return 0
    if module == "normcert.__main__":
        module = "normcert.cli"
    best = max((name for name in LAYERS if module == name or module.startswith(name + ".")), key=len)
    return LAYERS.index(best)


def _imports(module: str) -> set[str]:
    """The normcert modules ``module`` imports (a name imported from a package counts as its
    submodule where it is one, else as the package)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "normcert")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] != "normcert":
                continue
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in out if m in MODULES and m != module}


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_import_runs_down_the_layers():
    upward = [f"{m} (layer {LAYERS[_layer(m)]}) imports {t} (layer {LAYERS[_layer(t)]})"
              for m, targets in GRAPH.items() for t in sorted(targets) if _layer(t) > _layer(m)]
    assert not upward, "\n".join(upward)


def test_no_module_imports_itself_back():
    """No circle: the import graph (deferred imports included) has no cycle."""
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for t in sorted(GRAPH[m]):
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t):] + [m, t]) if t in stack else f"{m} -> {t}")
            elif t not in state:
                visit(t, stack + [m])
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)


def test_no_source_file_outgrows_a_sitting():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_every_module_sits_in_a_layer_and_every_layer_says_what_it_holds():
    for m in MODULES:
        _layer(m)  # raises where a module is in none
    for name in LAYERS:
        if name.startswith("normcert.properties."):
            init = ROOT / "properties" / name.split(".")[2] / "__init__.py"
            assert ast.get_docstring(ast.parse(init.read_text())), f"{init} has no docstring"


def test_the_suite_folder_holds_exactly_the_family_modules_and_the_replay_test():
    """A certify run collects one folder (``properties/suite``, by its path): the modules with a test
    marked ``normcert_family`` and the replay test, and no other module anywhere has such a test."""
    marked = {str(p.relative_to(ROOT)) for p in (ROOT / "properties").rglob("test_*.py")
              if "@pytest.mark." + "normcert_family(" in p.read_text()}
    suite = {str(p.relative_to(ROOT)) for p in (ROOT / "properties" / "suite").glob("test_*.py")}
    assert marked == suite - {"properties/suite/test_replay.py"}
