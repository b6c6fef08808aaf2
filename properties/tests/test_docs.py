"""The documentation site (docs/) builds with warnings as errors, and keeps to its form.

The CLI reference and the certificate's fields are generated at build time from
``normcert.cli``'s parser and the certificate's JSON Schema (docs/_ext/normcert_docs.py),
so this build also checks that those generators still work.
"""
from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

pytestmark = pytest.mark.skipif(not DOCS.is_dir(), reason="no docs/ folder here (an installed normcert, not a clone)")


def _missing() -> list[str]:
    return [name for name in ("sphinx", "furo", "myst_parser") if importlib.util.find_spec(name) is None]


def test_docs_build_without_warnings(tmp_path):
    missing = _missing()
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)} missing): pip install -e '.[docs]'")
    out = tmp_path / "html"
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                          "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"sphinx-build -W failed:\n{run.stdout}\n{run.stderr}"
    cli = (out / "reference" / "cli.html").read_text(encoding="utf-8")
    for sub in ("certify", "replay", "list", "schema"):  # the generated --help of every subcommand
        assert f"usage: normcert {sub}" in cli
    assert "--kernel-timeout" in cli
    cert = (out / "reference" / "certificate.html").read_text(encoding="utf-8")
    for field in ("scope.dtypes", "config.rootdir", "worst_units", "configs_ran_on"):  # rendered from the schema
        assert field in cert


def test_no_diary_in_the_docs():
    """Measurements are written as results: no page reads as a session's diary."""
    pages = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
    for page in pages:
        text = page.read_text(encoding="utf-8").lower()
        for phrase in ("this stop", "stop 35", "this session", "this round"):
            assert phrase not in text, f"{page.relative_to(ROOT)} says {phrase!r}"


def test_readme_is_a_quick_start():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    # the developer's test command, kept in step with .ci/run
    assert "python3 -m pytest -n 2" in readme
    assert "python3 -m pytest -n 2" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # every docs page the README links to exists (the report's screenshot comes from `normcert report`)
    for link in re.findall(r"\]\((docs/[^)#]+\.md)", readme):
        assert (ROOT / link).exists(), link


def test_the_registry_page_lists_every_registered_kernel():
    """docs/reference/registry.md shows ``normcert list``: a kernel registered since is a row there."""
    from normcert import impls

    page = (DOCS / "reference" / "registry.md").read_text()
    rows = {tuple(line.split()[:3]) for line in page.splitlines() if len(line.split()) >= 3}
    missing = [i.id for i in impls.registry() if (i.op, i.name, i.backend) not in rows]
    assert not missing, f"docs/reference/registry.md lacks {missing} (paste `normcert list`'s rows)"
