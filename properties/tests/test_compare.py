"""``normcert compare``: the cells whose outcome or error / bound changed between two certificates,
added and removed cells too, as text, Markdown and HTML."""
from __future__ import annotations

import copy
import json
import re

from normcert import cli

from ..presentation import compare
from . import report_samples

KERNEL = "rms_norm:example:rms_norm"


def _pair():
    before = report_samples.certified()
    after = copy.deepcopy(before)
    after["results"][0].update(outcome="fail", worst_units=2.5)  # accuracy float32: pass 0.42 -> fail
    after["results"][1]["worst_units"] = "nan"  # accuracy bfloat16: 0.42 -> nan
    gone = after["results"].pop(4)  # determinism float32: removed
    after["results"].append(report_samples.row(KERNEL, "gradients", "float64"))  # added
    after["not_run"] = [f"{KERNEL} served float16"]  # added, as a check that did not run
    return before, after, gone


def test_changed_added_and_removed_cells_and_nothing_else():
    before, after, gone = _pair()
    found = {(c.property, c.dtype): c for c in compare.changes(before, after)}
    assert set(found) == {("accuracy", "float32"), ("accuracy", "bfloat16"), (gone["property"], gone["dtype"]),
                          ("gradients", "float64"), ("served", "float16")}
    assert found["accuracy", "float32"].kind == "outcome" and found["accuracy", "float32"].ratio == "x5.95"
    assert found["accuracy", "bfloat16"].kind == "error / bound"
    assert found[gone["property"], gone["dtype"]].kind == "removed"
    assert found["gradients", "float64"].kind == found["served", "float16"].kind == "added"
    assert compare.changes(after, copy.deepcopy(after)) == []  # NaN is the same as NaN


def test_the_three_formats(tmp_path, capsys):
    before, after, _ = _pair()
    paths = []
    for name, cert in (("a.json", before), ("b.json", after)):
        paths.append(str(tmp_path / name))
        (tmp_path / name).write_text(json.dumps(cert))
    assert cli.main(["compare", *paths]) == 1  # accuracy float32 went pass -> fail: a regression
    text = capsys.readouterr().out
    lines = [re.split(r"\s{2,}", line) for line in text.splitlines()]
    assert "5 cell(s) changed" in text and [KERNEL, "accuracy", "float32", "pass 0.42", "fail 2.5", "outcome x5.95"] in lines
    assert cli.main(["compare", *paths, "--format", "markdown"]) == 1
    md = capsys.readouterr().out
    assert "| rms_norm:example:rms_norm | accuracy | float32 | pass 0.42 | fail 2.5 | outcome x5.95 |" in md
    out = tmp_path / "c.html"
    assert cli.main(["compare", *paths, "--format", "html", "-o", str(out)]) == 1
    page = out.read_text()
    assert page.count('<tr class="change"') == 5 and f'data-cell="{KERNEL}|accuracy|float32"' in page
    capsys.readouterr()
    assert cli.main(["compare", paths[0], str(tmp_path / "none.json")]) == cli.USAGE
    assert capsys.readouterr().err.startswith(f"normcert compare: {tmp_path / 'none.json'}: No such file")


def _written(folder, name, cert) -> str:
    path = str(folder / name)
    with open(path, "w") as f:
        json.dump(cert, f)
    return path


def test_fail_on_chooses_what_exits_1(tmp_path, capsys):
    """``--fail-on regression`` (the default): a cell pass -> FAIL, or the rows no longer certifying;
    ``any-change``: any cell, the judged verdict or a fact of the run, as ``diff`` does; ``never``: 0."""
    before, after, _ = _pair()
    fixed = copy.deepcopy(before)
    fixed["results"][0]["worst_units"] = 0.1  # a number moved, nothing got worse
    profile = copy.deepcopy(before)
    profile["environment"]["profile"] = "dev"  # no cell changed, but what they were checked with did
    a, worse, moved, dev = (_written(tmp_path, n, c) for n, c in
                            (("a.json", before), ("b.json", after), ("c.json", fixed), ("d.json", profile)))
    expected = {"regression": (1, 0, 0, 0), "any-change": (1, 1, 1, 0), "never": (0, 0, 0, 0)}
    for fail_on, codes in expected.items():
        got = tuple(cli.main(["compare", a, b, "--fail-on", fail_on]) for b in (worse, moved, dev, a))
        assert got == codes, fail_on
    capsys.readouterr()
    assert cli.main(["compare", a, dev, "--fail-on", "any-change"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"normcert compare: {dev} changed from {a}: profile changed"]
    assert tuple(compare.FAIL_ON) == cli._parser()._subparsers._group_actions[0].choices["compare"]._option_string_actions[
        "--fail-on"].choices


def test_fail_on_takes_only_its_words(tmp_path, capsys):
    a = _written(tmp_path, "a.json", report_samples.certified())
    try:
        code = cli.main(["compare", a, a, "--fail-on", "sometimes"])
    except SystemExit as e:  # argparse; ``cli.entry`` maps its 2 to normcert's usage status
        code = cli.USAGE if e.code == 2 else e.code
    assert code == cli.USAGE
    assert "--fail-on: invalid choice: 'sometimes'" in capsys.readouterr().err


def test_a_code_change_is_listed_naming_the_kernel_and_its_files(tmp_path, capsys):
    """The code a kernel ran is a fact of the run: a changed file is named; the default ``--fail-on``
    (a regression) does not count it (a comparison is usually made across one), ``any-change`` does."""
    before = report_samples.certified()
    after = copy.deepcopy(before)
    after["implementations"][KERNEL]["code"] = report_samples.code({"example": "kernel source v2",
                                                                     "example_helpers": "helpers v1", "more": "x"})
    a, b = _written(tmp_path, "a.json", before), _written(tmp_path, "b.json", after)
    assert cli.main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    old, new = (c["implementations"][KERNEL]["code"]["files"]["example"][:12] for c in (before, after))
    assert f"code of {KERNEL} changed: example edited (sha256 {old} -> {new}); more added" in out
    assert cli.main(["compare", a, b, "--fail-on", "any-change"]) == 1
    assert capsys.readouterr().err.strip() == f"normcert compare: {b} changed from {a}: code of {KERNEL} changed"
    assert cli.main(["compare", a, a, "--fail-on", "any-change"]) == 0
    assert "code of" not in capsys.readouterr().out


def test_a_run_whose_process_was_kept_alive_is_judged_not_certified_again(tmp_path, capsys):
    """``normcert certify``'s parent ends a process a kernel's thread keeps alive after the run, and
    records why in the run state (``cli._state``), which the verdict is judged from: comparing that
    certificate judges it "not certified" too, a regression from a certified one (exit 1)."""
    run = {"run": "complete", "pytest_exit_status": 0}
    ending = "the kernel's process did not exit within 5 s of the end of its run (...): ended by normcert"
    assert cli._state(run, 0, "") == "complete"
    assert cli._state(run, 0, ending) == f"complete, but then {ending}"
    assert cli._state(run, 3, "").startswith("complete, but then the kernel's process exited with status 3")
    assert cli._state({"run": "complete", "pytest_exit_status": 1}, 1, "") == "complete"  # a failing run, as it said
    before = report_samples.certified()
    kept = {**copy.deepcopy(before), "run": cli._state(run, 0, ending), "verdict": "not certified"}
    report_samples.validate(kept)
    assert compare.rejudge(kept) == "not certified"
    a, b = _written(tmp_path, "a.json", before), _written(tmp_path, "b.json", kept)
    assert cli.main(["compare", a, b]) == 1
    said = capsys.readouterr()
    assert "verdict: certified -> not certified (judged from the rows)" in said.out
    assert "its rows no longer certify (certified -> not certified)" in said.err
