"""One rule for every path normcert writes (issue 46, item 1): ``files.why_not_writable``, asked by every
writer (the certificate's three files, the report, compare's output, the CI job summary, a replay file),
and by the commands before their run."""
from __future__ import annotations

import ast
import os
import pathlib

import pytest

from normcert import cli

from ..evidence import certificate, files

KERNEL = "rms_norm=normcert.impls.eager:rms_norm"
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", [*files.MARKS, *files.APPENDED])
def test_every_kind_is_refused_a_folder_a_link_a_fifo_and_a_taken_path(tmp_path, kind):
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "input.json").write_text("{}")
    assert files.why_not_writable(str(tmp_path / "new"), kind) == ""
    assert files.why_not_writable(str(tmp_path / "folder"), kind) == "is a folder, expected a file path"
    for name in ("link", "fifo"):
        assert files.why_not_writable(str(tmp_path / name), kind).startswith("exists and is not a regular file")
    taken = {str(tmp_path / "input.json"): "an input of this command"}
    assert files.why_not_writable(str(tmp_path / "." / "input.json"), kind, taken) == \
        f"is {tmp_path / 'input.json'}, an input of this command: choose another path"
    assert files.why_not_writable(str(tmp_path / "none" / "x"), kind).startswith("folder ")


@pytest.mark.parametrize("kind", list(files.MARKS))
def test_somebody_else_s_file_is_refused_for_every_kind_normcert_owns(tmp_path, kind):
    (tmp_path / "theirs").write_bytes(b"somebody else's\n")
    (tmp_path / "ours").write_bytes(files.MARKS[kind] + b" and the rest")
    assert "is not a normcert " in files.why_not_writable(str(tmp_path / "theirs"), kind)
    assert files.why_not_writable(str(tmp_path / "ours"), kind) == ""


def test_the_job_summary_is_appended_to_whoever_wrote_it(tmp_path):
    (tmp_path / "summary").write_text("an earlier step's summary\n")
    assert files.why_not_writable(str(tmp_path / "summary"), "job summary") == ""


@pytest.mark.parametrize("summary, says", [
    ("fifo", "exists and is not a regular file"),
    ("c.md", "is {tmp}/c.md, a file of the certificate"),
])
def test_certify_refuses_a_job_summary_it_cannot_append_to_before_the_run(tmp_path, capsys, monkeypatch, summary,
                                                                         says):
    """A FIFO as ``$GITHUB_STEP_SUMMARY`` once hung normcert after the run, before its verdict; one of
    the command's own outputs would be written twice.  Refused at once, exit 4, nothing written."""
    os.mkfifo(tmp_path / "fifo")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / summary))
    code = cli.main(["certify", KERNEL, "--certificate", str(tmp_path / "c.json"), "--report", str(tmp_path / "r.html")])
    assert code == cli.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"normcert certify: $GITHUB_STEP_SUMMARY={tmp_path / summary}: ")
    assert says.format(tmp=tmp_path) in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_certify_refuses_a_report_at_the_job_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    code = cli.main(["certify", KERNEL, "--certificate", str(tmp_path / "c.json"),
                     "--report", str(tmp_path / "summary.md")])
    assert code == cli.USAGE
    assert "the CI job summary ($GITHUB_STEP_SUMMARY)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_certificate_refusal_names_the_file_beside_it(tmp_path):
    (tmp_path / "c.badge.json").mkdir()
    with pytest.raises(pytest.UsageError, match=f"--certificate {tmp_path / 'c.json'}: {tmp_path / 'c.badge.json'} "
                                                f"is a folder, expected a file path"):
        certificate.check_writable(str(tmp_path / "c.json"))


WRITERS = ("evidence/certificate.py", "evidence/replay.py", "presentation/report_cli.py")


def test_no_writer_has_a_rule_of_its_own():
    """The writers ask ``files.why_not_writable``; none reads a file's mark or kind itself (``foreign``,
    ``regular_or_absent``, ``os.path.islink``), which is how the rules drifted apart before."""
    own = {"foreign", "regular_or_absent", "islink", "lexists"}
    for name in WRITERS:
        tree = ast.parse((ROOT / name).read_text())
        called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                  for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert "why_not_writable" in called or "why_not_written" in called, name
        assert not own & called, (name, own & called)
