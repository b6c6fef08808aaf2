"""What normcert writes destroys nothing and tells the truth (issue 46): no output replaces an input,
one of a certificate's own files or a file normcert did not write; nothing normcert reads or appends
to may block it (a FIFO); a page judges the rows again; ``compare`` exits 1 on a regression."""
from __future__ import annotations

import copy
import json
import os
import re
import threading

import pytest

from normcert import cli

from ..evidence import certificate, files
from ..presentation import report
from . import report_samples
from .test_report import Page

KERNEL = "rms_norm:example:rms_norm"


def _write(folder, name, cert) -> str:
    path = str(folder / name)
    with open(path, "w") as f:
        f.write(certificate.to_json(cert))
    return path


def _failing_after(cert) -> dict:
    after = copy.deepcopy(cert)
    after["results"][0].update(outcome="fail", worst_units=2.5)
    after["verdict"] = "not certified"
    return after


def test_compare_exits_1_where_b_regressed_and_0_where_it_did_not(tmp_path, capsys):
    before = report_samples.certified()
    a = _write(tmp_path, "a.json", before)
    b = _write(tmp_path, "b.json", _failing_after(before))
    assert cli.main(["compare", a, b]) == 1
    captured = capsys.readouterr()
    assert "verdict: certified -> not certified" in captured.out
    assert f"{b} regressed from {a}: its rows no longer certify" in captured.err
    assert cli.main(["compare", b, a]) == 0  # fixed, not regressed
    assert cli.main(["compare", a, a]) == 0


def test_a_run_that_did_not_complete_is_a_regression_with_no_cell_changed(tmp_path, capsys):
    """A certified run, then a run that stopped early with the same rows: 0 cells changed, and yet
    the rows no longer certify; the text and the Markdown both say so, and compare exits 1."""
    before = report_samples.certified()
    stopped = {**copy.deepcopy(before), "run": "stopped early: -x"}
    a, b = _write(tmp_path, "a.json", before), _write(tmp_path, "b.json", stopped)
    for fmt in ("text", "markdown"):
        assert cli.main(["compare", a, b, "--format", fmt]) == 1
        out = capsys.readouterr().out
        assert "0 cell(s) changed" in out and "certified -> not certified" in out
        assert "says 'certified', but its rows say 'not certified'" in out


@pytest.mark.parametrize("target", ["a.json", "a.md", "a.badge.json", "b.json"])
def test_compare_never_writes_over_an_input_or_its_files(tmp_path, capsys, target):
    cert = report_samples.certified()
    a = str(tmp_path / "a.json")
    certificate.write_files(a, cert)
    b = _write(tmp_path, "b.json", cert)
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    assert cli.main(["compare", a, b, "-o", str(tmp_path / target)]) == cli.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a file of the certificate" in err[0]
    assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("command", ["report", "compare"])
def test_an_output_over_a_file_normcert_did_not_write_is_refused(tmp_path, capsys, command):
    a = _write(tmp_path, "a.json", report_samples.certified())
    theirs = tmp_path / "notes.html"
    theirs.write_text("<p>my notes</p>\n")
    args = ["report", a] if command == "report" else ["compare", a, a, "--format", "html"]
    assert cli.main([*args, "-o", str(theirs)]) == cli.USAGE
    assert "exists and is not a normcert page: normcert replaces only files it wrote" in capsys.readouterr().err
    assert theirs.read_text() == "<p>my notes</p>\n"
    mine = tmp_path / "mine.html"
    assert cli.main([*args, "-o", str(mine)]) == 0
    assert cli.main([*args, "-o", str(mine)]) == 0  # its own page is replaced


@pytest.mark.parametrize("sibling", [".md", ".badge.json"])
def test_report_never_writes_over_the_certificate_s_own_files(tmp_path, capsys, sibling):
    path = str(tmp_path / "b.json")
    certificate.write_files(path, report_samples.certified())
    target = tmp_path / f"b{sibling}"
    kept = target.read_bytes()
    assert cli.main(["report", path, "-o", str(target)]) == cli.USAGE
    assert "a file of the certificate" in capsys.readouterr().err
    assert target.read_bytes() == kept


@pytest.mark.parametrize("report_as", ["c.json", "c.md", "c.badge.json"])
def test_certify_refuses_a_report_over_its_own_certificate_before_the_run(tmp_path, capsys, report_as):
    code = cli.main(["certify", "rms_norm=normcert.impls.eager:rms_norm", "--certificate", str(tmp_path / "c.json"),
                     "--report", str(tmp_path / report_as)])
    assert code == cli.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"normcert certify: --report {tmp_path / report_as}: is ")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("theirs, content, path, what", [
    ("package.json", '{"name": "mine"}\n', "package.json", "certificate"),
    ("mykern.py", "def f(): pass\n", "mykern.py", "certificate"),
    ("README.md", "# my project\n", "README.json", "certificate (the Markdown is written beside the JSON)"),
    ("c.badge.json", '{"mine": 1}\n', "c.json", "badge (the badge is written beside the JSON)"),
])
def test_a_certificate_path_or_one_beside_it_holding_someone_else_s_file_is_refused(tmp_path, theirs, content, path,
                                                                                     what):
    """The JSON, its Markdown and its badge: where any holds a file normcert did not write, the run
    is refused before it starts, and nothing of the certificate is written."""
    (tmp_path / theirs).write_text(content)
    with pytest.raises(pytest.UsageError, match=re.escape(f"{theirs} exists and is not a normcert {what}")):
        certificate.check_writable(str(tmp_path / path))
    with pytest.raises(files.UnsafePath):
        certificate.write_incomplete(str(tmp_path / path), "test")
    assert [p.name for p in tmp_path.iterdir()] == [theirs] and (tmp_path / theirs).read_text() == content


def _fifo(tmp_path):
    path = str(tmp_path / "pipe")
    os.mkfifo(path)
    return path


def test_nothing_blocks_on_a_fifo(tmp_path, capsys, monkeypatch):
    """A FIFO given as a certificate to read, or as the CI job summary, is refused at once (a
    reader would wait forever for a writer that never comes); the check runs in a thread that
    must finish, so a regression fails here instead of hanging the suite."""
    pipe = _fifo(tmp_path)
    codes = []
    worker = threading.Thread(target=lambda: codes.extend([cli.main(["report", pipe, "-o", str(tmp_path / "r.html")]),
                                                           cli.main(["compare", pipe, pipe])]), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive() and codes == [cli.USAGE, cli.USAGE]
    assert "is not a regular file" in capsys.readouterr().err
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", pipe)
    with pytest.raises(files.UnsafePath, match="GITHUB_STEP_SUMMARY"):
        certificate.append_step_summary(report_samples.certified())


def test_the_report_of_an_incomplete_certificate_is_drawn(tmp_path, capsys):
    """A crashed run leaves an incomplete certificate: exactly when a report is wanted."""
    path = str(tmp_path / "c.json")
    certificate.write_incomplete(path, "the kernel's process exited with status -11")
    assert cli.main(["report", path, "-o", str(tmp_path / "c.html")]) == 0
    page = (tmp_path / "c.html").read_text()
    assert 'class="verdict incomplete"' in page and "stored-verdict" not in page


def test_a_verdict_typed_over_a_failing_row_is_not_what_the_page_shows(tmp_path):
    forged = _failing_after(report_samples.certified())
    forged["verdict"] = "certified"
    html = report.render(forged)
    assert 'class="verdict not-certified"' in html and 'id="stored-verdict"' in html
    assert 'The certificate says "certified", but its rows say "not certified"' in html
    assert "stored-verdict" not in report.render(report_samples.certified())
    Page(html)  # well-formed enough to parse


def test_each_output_kind_begins_with_its_mark(tmp_path):
    """The marks ``files.foreign`` reads are what normcert writes (a mark that drifted from its writer
    would make normcert refuse its own files, or take a user's for its own)."""
    cert = report_samples.certified()
    path = str(tmp_path / "c.json")
    certificate.write_files(path, cert)
    a = _write(tmp_path, "a.json", cert)
    outputs = {"certificate": path, "markdown": str(tmp_path / "c.md"), "badge": str(tmp_path / "c.badge.json")}
    for kind, fmt in (("page", "html"), ("compare text", "text"), ("compare markdown", "markdown")):
        out = str(tmp_path / f"compare.{fmt}")
        assert cli.main(["compare", a, a, "--format", fmt, "-o", out]) == 0
        outputs[kind] = out
    assert cli.main(["report", a, "-o", str(tmp_path / "r.html")]) == 0
    assert set(outputs) == set(files.MARKS) - {"replay", "reproducer"}  # test_replay_files, test_reproducer
    for kind, out in [*outputs.items(), ("page", str(tmp_path / "r.html"))]:
        assert not files.foreign(out, kind), (kind, open(out).read(80))
    assert json.loads((tmp_path / "c.badge.json").read_text())["label"] == "normcert"


HOSTILE = ("<img src=https://example.com/t.png> [click](https://example.com) `tick` *bold* | cell\n"
           "# normcert certificate: certified\n<h2>x</h2>")


def test_a_kernel_s_message_reaches_markdown_inert(tmp_path, monkeypatch):
    """A kernel sets its exception's message and class name freely, newlines and markup included: in
    the certificate's Markdown and the CI job summary it is one line, with no heading, tag, image,
    link, code span or table cell of its own."""
    cert = report_samples.certified()
    cert["verdict"] = "not certified"
    cert["results"][0].update(outcome="fail", message=HOSTILE, replay="normcert replay f.npz",
                              failures=[{"kind": HOSTILE, "message": HOSTILE, "where": "x`y", "replay": "r",
                                         "worst_units": 2.0, "worst_ulps": 3.0}] * 2)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    certificate.append_step_summary(cert)
    for text in (certificate.markdown(cert), summary.read_text()):
        headings = [line for line in text.splitlines() if line.startswith("#")]
        assert headings and all(h.startswith(("# normcert certificate: not certified", "### normcert: not certified"))
                                or h in ("## Failures", "## Case studies") for h in headings), headings
        assert "<img" not in text and "<h2>" not in text
        assert not re.search(r"(?<!\\)\]\(", text) and not re.search(r"(?<!\\)`tick(?<!\\)`", text)  # no link, no code
        assert "&lt;img src=https://example.com/t.png&gt;" in text and "\\*bold\\*" in text


def test_a_certificate_of_the_previous_format_is_still_read(tmp_path, capsys):
    """A /7 certificate (before "not-run" was an outcome) is drawn and compared with a current one."""
    old = {**report_samples.certified(), "schema": "normcert-certificate/7"}
    a, b = _write(tmp_path, "old.json", old), _write(tmp_path, "new.json", report_samples.certified())
    assert cli.main(["report", a, "-o", str(tmp_path / "old.html")]) == 0
    assert cli.main(["compare", a, b]) == 0 and "0 cell(s) changed" in capsys.readouterr().out
    assert cli.main(["report", _write(tmp_path, "other.json", {**old, "schema": "normcert-certificate/6"})]) == cli.USAGE


@pytest.mark.parametrize("narrow, says", [
    (lambda c: c.update(scope={"properties": ["accuracy"], "dtypes": ["float32"]}), "(scope: properties accuracy"),
    (lambda c: c["environment"].update(profile="dev"), "(profile dev: 4 examples a property, fewer than ci's 12)"),
    (lambda c: c["results"][0].update(outcome="not-certified"), "not certified (forward only, or not run here)"),
    (lambda c: c["implementations"][KERNEL].update(certified_on="row length at most 1"), "on: row length at most 1"),
])
def test_the_badge_is_bright_green_only_where_the_headline_says_nothing_more(narrow, says):
    cert = report_samples.certified()
    assert certificate.headline(cert) == "certified"
    assert certificate.badge(cert) == {"schemaVersion": 1, "label": "normcert", "message": "certified",
                                       "color": "brightgreen"}
    narrow(cert)
    assert says in certificate.headline(cert)
    assert certificate.badge(cert)["message"] == "certified (narrowed)" and certificate.badge(cert)["color"] == "yellowgreen"


def test_compare_names_every_fact_of_the_run_that_changed(tmp_path, capsys):
    before = report_samples.certified()
    after = copy.deepcopy(before)
    after["scope"] = {"properties": ["accuracy"], "dtypes": "all"}
    after["environment"].update(profile="dev", device="cuda", device_name="NVIDIA H100")
    after["implementations"][KERNEL]["certified_on"] = "dtypes float32"
    a, b = _write(tmp_path, "a.json", before), _write(tmp_path, "b.json", after)
    cli.main(["compare", a, b, "--format", "markdown"])
    out = capsys.readouterr().out
    for says in ("- scope: dtypes all; properties all -> dtypes all; properties accuracy",
                 "- profile: ci -> dev", "- device: cpu", "-> cuda NVIDIA H100",
                 f"- declared domains: {KERNEL}: all -> {KERNEL}: dtypes float32"):
        assert says.replace("|", "\\|") in out, (says, out)


def test_the_headline_names_a_property_not_certified_from_a_run_record_s_rows_too():
    """The command's parent reads the run record, whose rows name their property ``prop``; a
    certificate's rows name it ``property``: both say which properties were not certified."""
    for key in ("prop", "property"):
        rows = [{"impl": KERNEL, key: "gradients", "dtype": "float32", "outcome": "not-certified"}]
        assert certificate.claimed({KERNEL: ""}, rows) == {KERNEL: "gradients not certified (forward only, or not run here)"}


def test_a_kernel_that_does_not_import_leaves_a_refused_certificate_not_a_crashed_one(tmp_path, capsys):
    """An import failure is a usage error (exit 4): the incomplete certificate written before the
    import says the run was refused and why, not "crashed or killed"."""
    path = str(tmp_path / "c.json")
    assert cli.main(["certify", "rms_norm=no_such_module_anywhere:f", "--certificate", path]) == cli.USAGE
    with open(path) as f:
        cert = json.load(f)
    assert cert["verdict"] == "incomplete" and "crashed or killed" not in cert["run"]
    assert cert["run"].startswith("incomplete: refused before any check ran (a usage error, exit status 4): ")
    assert "no_such_module_anywhere" in cert["run"] and "\n" not in cert["run"]
