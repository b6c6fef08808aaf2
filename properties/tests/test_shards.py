"""Shards of a run and their merge (``evidence.shards``, ``normcert merge``).

* ``--shard K/N`` splits the sorted checks round-robin: every check in exactly one shard, whatever
  order the checks come in; bad arguments are a one-line usage error, exit 4;
* a shard's verdict is at best "shard passed", never "certified", on its own and as a page reads it;
* merging the shards of one run gives the whole run's verdict and cells; a missing or duplicated
  shard, or a shard of other settings, gives "not certified" saying which;
* ``normcert merge`` writes by the rules for normcert's files (not over an input, not over a file
  it did not write), end to end, and, on a cheap scope, the merge of 3 real shard runs is the
  unsplit run's verdict and cells.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import jsonschema
import pytest

from ..evidence import shards, verdict
from ..evidence.certificate import SCHEMA, badge, headline, schema, to_json
from ..presentation import report
from . import report_samples

KERNEL = "rms_norm:example:rms_norm"


def _split(whole: dict, n: int) -> list[tuple[str, dict]]:
    """The shard certificates a run of ``whole``'s checks under ``--shard K/n`` writes, K = 1..n."""
    checks = sorted({verdict.key(r) for r in whole["results"]} | set(whole["not_run"]))
    out = []
    for k in range(1, n + 1):
        record = shards.record((k, n), checks)
        mine = set(record["checks"])
        cert = copy.deepcopy(whole)
        cert.update(results=[r for r in cert["results"] if verdict.key(r) in mine], shard=record,
                    not_run=[c for c in cert["not_run"] if c in mine])
        cert["verdict"] = verdict.rejudge(cert)
        jsonschema.validate(cert, schema())
        out.append((f"s{k}.json", cert))
    return out


def _cells(cert: dict) -> list[tuple]:
    return sorted((r["impl"], r["property"], r["dtype"], r["outcome"], r["worst_units"]) for r in cert["results"])


def test_a_shard_is_every_nth_check_of_the_sorted_list_and_every_check_lies_in_one():
    checks = [f"k{i % 5} p{i % 7} d{i % 3}" for i in range(105)]
    for n in (1, 2, 3, 7):
        parts = [shards.assigned(checks, (k, n)) for k in range(1, n + 1)]
        assert sorted(c for p in parts for c in p) == sorted(checks)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert parts == [shards.assigned(list(reversed(checks)), (k, n)) for k in range(1, n + 1)]
    assert shards.identity(checks) == shards.identity(reversed(checks)) != shards.identity(checks[1:])


@pytest.mark.parametrize("text", ["0/3", "4/3", "x", "3", "-1/3", "1/0", "1/3/5", ""])
def test_bad_shards_are_refused(text):
    with pytest.raises(ValueError, match=f"--shard {text}: expected K/N"):
        shards.parse(text)


def test_a_shard_whose_checks_all_pass_is_not_certified():
    for _, cert in _split(report_samples.certified(), 3):
        assert cert["verdict"] == verdict.rejudge(cert) == "shard passed"
        assert headline(cert).startswith(f"shard {cert['shard']['index']}/3 passed: its ")
        assert "certified" not in headline(cert).split(":")[0]
        hacked = {**cert, "verdict": "certified"}  # a page judges the rows, whatever the file says
        assert verdict.rejudge(hacked) == "shard passed"
        emptied = {**cert, "results": [], "not_run": []}  # its checks are named in its shard record
        assert verdict.rejudge(emptied) == "not certified"
    page = report.render(cert)
    assert '<div class="verdict shard-passed" id="verdict">' in page and "shard 3/3 passed: its " in page
    assert badge(cert) == {"schemaVersion": 1, "label": "normcert", "message": "shard passed", "color": "blue"}


def test_three_shards_merge_into_the_whole_runs_verdict_and_cells():
    whole = report_samples.certified()
    merged = shards.merge(_split(whole, 3), SCHEMA)
    jsonschema.validate(json.loads(to_json(merged)), schema())
    assert merged["verdict"] == verdict.rejudge(merged) == whole["verdict"] == "certified"
    assert _cells(merged) == _cells(whole) and merged["not_run"] == [] and merged["run"] == "complete"
    assert [m["shard"] for m in merged["merged_from"]] == ["1/3", "2/3", "3/3"]
    reordered = _split(whole, 3)[::-1]
    assert _cells(shards.merge(reordered, SCHEMA)) == _cells(whole)


def test_a_failing_check_in_one_shard_fails_the_merge():
    whole = report_samples.certified()
    whole["results"][0].update(outcome="fail", worst_units=3.0)
    parts = _split(whole, 3)
    assert sorted(c["verdict"] for _, c in parts) == ["not certified", "shard passed", "shard passed"]
    merged = shards.merge(parts, SCHEMA)
    assert merged["verdict"] == "not certified" and merged["run"] == "complete" and _cells(merged) == _cells(whole)


def _why(parts) -> str:
    merged = shards.merge(parts, SCHEMA)
    assert merged["verdict"] == verdict.rejudge(merged) == "not certified"
    assert merged["run"].startswith("merged with problems: ")
    return merged["run"]


def test_a_missing_or_duplicated_shard_is_not_certified_saying_which():
    parts = _split(report_samples.certified(), 3)
    assert "shard 2/3 is missing" in _why([parts[0], parts[2]])
    assert "shard 3/3 is given 2 times" in _why([*parts, ("again.json", parts[2][1])])
    doubled = copy.deepcopy(parts[1])  # shard 2 claiming a check of shard 1 too
    doubled[1]["results"].append(parts[0][1]["results"][0])
    assert "1 check(s) have results in two shards, e.g. " in _why([parts[0], doubled, parts[2]])
    assert "whole.json is not a shard" in _why([*parts, ("whole.json", report_samples.certified())])
    other = _split({**report_samples.certified(), "not_run": [f"{KERNEL} served float16"]}, 3)
    assert "another set of checks than s1.json" in _why([parts[0], other[1], parts[2]])
    halves = _split(report_samples.certified(), 2)
    assert "s2.json: another shard count than s1.json" in _why([parts[0], halves[1], parts[2]])


@pytest.mark.parametrize("field, value", [("normcert", "0.0.9"), ("seed", 7), ("profile", "dev"),
                                          ("device", "cuda"), ("device_name", "NVIDIA H100")])
def test_a_shard_of_other_settings_is_not_certified_saying_which(field, value):
    parts = _split(report_samples.certified(), 3)
    parts[1][1]["environment"][field] = value
    assert f"s2.json: {field} {value!r}, but s1.json has" in _why(parts)


def test_a_shard_of_another_scope_or_other_kernels_is_not_certified():
    parts = _split(report_samples.certified(), 3)
    parts[2][1]["scope"] = {"properties": ["accuracy"], "dtypes": "all"}
    assert "s3.json: its scope differ from s1.json's" in _why(parts)


def test_shards_of_two_versions_of_a_kernel_are_not_certified_naming_the_change():
    """Shard 1/2 run on version 1, shard 2/2 on version 2 (the kernel fixed between the runs): each
    shard passed, but no run checked either version whole, so the merge is not certified and names
    the kernel and the file that changed; a shard that names no code (a certificate before /10)
    cannot be told the same and is refused too."""
    parts = _split(report_samples.certified(), 2)
    impl = parts[1][1]["implementations"][KERNEL]
    old = impl["code"]["files"]["example_helpers"][:12]
    impl["code"] = report_samples.code({"example": "kernel source v1", "example_helpers": "helpers v2"})
    new = impl["code"]["files"]["example_helpers"][:12]
    assert [c["verdict"] for _, c in parts] == ["shard passed", "shard passed"]
    why = _why(parts)
    assert (f"s2.json: the code of {KERNEL} differs from s1.json's (example_helpers edited (sha256 {old} -> {new})): "
            f"shards of two versions of a kernel certify neither") in why
    assert "its implementations differ" not in why  # the code is named, not a vaguer difference
    old_format = _split(report_samples.certified(), 2)
    del old_format[0][1]["implementations"][KERNEL]["code"]
    assert f"s1.json: names no code for {KERNEL} (a certificate before normcert-certificate/10)" in _why(old_format)


def test_a_shard_with_no_check_of_its_own_passes_and_merges():
    whole = report_samples.certified()
    n = len(whole["results"]) + 1
    parts = _split(whole, n)
    assert parts[-1][1]["shard"]["checks"] == [] and parts[-1][1]["verdict"] == "shard passed"
    assert shards.merge(parts, SCHEMA)["verdict"] == "certified"


def _normcert(args, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TRITON_")) and k != "CI"}
    return subprocess.run([sys.executable, "-m", "normcert", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _merge_here(args, cwd, monkeypatch, capsys) -> subprocess.CompletedProcess:
    """``normcert merge ARGS`` in this process, in ``cwd``, by the console script's own mapping of
    exit statuses (``cli.entry``): a subprocess's result without a subprocess's start (torch-free,
    but about a second each), for the many refusals one command's rules make."""
    from normcert.cli import USAGE, main

    monkeypatch.chdir(cwd)
    capsys.readouterr()
    try:
        code = main(["merge", *args])
    except SystemExit as e:
        code = USAGE if e.code == 2 else e.code
    said = capsys.readouterr()
    return subprocess.CompletedProcess(["normcert", "merge", *args], code, said.out, said.err)


def test_merge_command_writes_by_the_rules_and_exits_by_the_verdict(tmp_path, monkeypatch, capsys):
    """The first merge as users run it (the installed command, a process of its own); its refusals
    through the same ``main`` in this process."""
    parts = _split(report_samples.certified(), 3)
    for name, cert in parts:
        (tmp_path / name).write_text(to_json(cert))
    names = [name for name, _ in parts]
    ok = _normcert(["merge", *names, "-o", "m.json"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "normcert verdict: certified" in ok.stdout
    assert json.loads((tmp_path / "m.json").read_text())["verdict"] == "certified"
    assert (tmp_path / "m.md").read_text().startswith("# normcert certificate: certified")
    dropped = _merge_here([names[0], names[2], "-o", "m.json"], tmp_path, monkeypatch, capsys)  # replaces its own file
    assert dropped.returncode == 1 and "normcert merge: shard 2/3 is missing" in dropped.stderr
    assert json.loads((tmp_path / "m.json").read_text())["verdict"] == "not certified"
    (tmp_path / "notes.md").write_text("mine\n")
    merged_md = (tmp_path / "m.md").read_text()
    for out, problem in (("s2.json", "is s2.json, a file of the certificate s2.json"),
                         ("s1.badge.json", "is s1.badge.json, a file of the certificate s1.json"),
                         ("notes.json", "notes.md exists and is not a normcert certificate"),
                         ("m.md", "-o m.md: give the JSON path; the Markdown is written beside it as .md"),
                         ("fresh.md", "-o fresh.md: give the JSON path"),  # its Markdown would be its own path
                         ("new.MD", "-o new.MD: give the JSON path")):
        refused = _merge_here([*names, "-o", out], tmp_path, monkeypatch, capsys)
        assert refused.returncode == 4 and problem in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert (tmp_path / "notes.md").read_text() == "mine\n"
    assert (tmp_path / "m.md").read_text() == merged_md
    assert not (tmp_path / "fresh.md").exists() and not (tmp_path / "new.MD").exists()
    (tmp_path / "junk.json").write_text("{")
    for args, problem in ((["junk.json", "-o", "x.json"], "junk.json: not JSON"),
                          ([*names], "-o C.json: give the merged certificate's path")):
        refused = _merge_here(args, tmp_path, monkeypatch, capsys)
        assert refused.returncode == 4 and problem in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["0/3", "4/3", "x"])
def test_certify_with_a_bad_shard_is_a_one_line_usage_error(tmp_path, text):
    out = _normcert(["certify", "rms_norm=normcert.impls.eager:rms_norm", "--shard", text], tmp_path)
    assert out.returncode == 4
    assert out.stderr.strip() == f"normcert certify: --shard {text}: expected K/N, two whole numbers with 1 <= K <= N (e.g. 2/3)"


@pytest.mark.normcert_heavy  # four certify runs in fresh processes: the heavy tier
def test_three_real_shards_merge_into_the_unsplit_runs_verdict_and_cells(tmp_path):
    scope = ["rms_norm=normcert.impls.eager:rms_norm", "--dtype", "float32", "--profile", "dev",
             *(a for p in ("accuracy", "contract", "invariance", "extremes") for a in ("--property", p))]
    whole = _normcert(["certify", *scope, "--certificate", "whole.json"], tmp_path)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    for k in (1, 2, 3):
        part = _normcert(["certify", *scope, "--shard", f"{k}/3", "--certificate", f"s{k}.json"], tmp_path)
        assert part.returncode == 0, part.stdout[-3000:] + part.stderr[-3000:]
        assert f"normcert verdict: shard {k}/3 passed: its " in part.stdout
        assert json.loads((tmp_path / f"s{k}.json").read_text())["verdict"] == "shard passed"
    merged = _normcert(["merge", "s1.json", "s2.json", "s3.json", "-o", "m.json"], tmp_path)
    assert merged.returncode == 0, merged.stderr
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("whole.json", "m.json"))
    assert a["verdict"] == b["verdict"] == "certified" and headline(a) == headline(b)
    assert _cells(a) == _cells(b) and len(_cells(a)) == 4
    assert _normcert(["merge", "s1.json", "s3.json", "-o", "m.json"], tmp_path).returncode == 1
    assert _normcert(["merge", "s1.json", "s2.json", "s2.json", "s3.json", "-o", "m.json"], tmp_path).returncode == 1


@pytest.mark.normcert_heavy  # three certify runs in fresh processes: the heavy tier
def test_shards_of_a_kernel_edited_between_their_runs_do_not_merge(tmp_path):
    """The natural workflow, as a user runs it: shard 1/2 passes on version 1, shard 2/2 fails on it,
    the kernel's file is fixed in place and shard 2/2 run again (it passes); the merge of shard 1
    (version 1) and the new shard 2 (version 2) is not certified, naming the kernel and the file."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    body = "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n"
    version1 = ("import torch\n\n\ndef rms_norm(x, weight, eps):\n"
                "    if x.dtype == torch.float64:\n        return (x * weight).contiguous()  # forgot to normalise\n"
                + body)
    (tmp_path / "mykern.py").write_text(version1)
    scope = ["rms_norm=mykern:rms_norm", "--property", "accuracy", "--dtype", "float32", "--dtype", "float64",
             "--profile", "dev"]  # its checks, sorted: accuracy float32 (shard 1/2), accuracy float64 (shard 2/2)
    first = _normcert(["certify", *scope, "--shard", "1/2", "--certificate", "s1.json"], tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    failed = _normcert(["certify", *scope, "--shard", "2/2", "--certificate", "s2.json"], tmp_path)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    (tmp_path / "mykern.py").write_text("import torch\n\n\ndef rms_norm(x, weight, eps):\n" + body)  # fixed
    again = _normcert(["certify", *scope, "--shard", "2/2", "--certificate", "s2.json"], tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    merged = _normcert(["merge", "s1.json", "s2.json", "-o", "m.json"], tmp_path)
    assert merged.returncode == 1, merged.stdout + merged.stderr
    cert = json.loads((tmp_path / "m.json").read_text())
    assert cert["verdict"] == verdict.rejudge(cert) == "not certified"
    assert "s2.json: the code of rms_norm:mykern:rms_norm differs from s1.json's (mykern edited (sha256 " in merged.stderr
    assert cert["run"].startswith("merged with problems: s2.json: the code of rms_norm:mykern:rms_norm differs")
    assert (tmp_path / "m.md").read_text().startswith("# normcert certificate: not certified")


def test_shards_merge_their_triton_coverage_launches_added_and_not_reached_where_no_shard_reached_it():
    whole = report_samples.certified()
    parts = _split(whole, 2)
    ran = {"m:_fwd": {"launches": 3, "meta": {"BLOCK_SIZE": [64]}, "programs": [2, 300]}}
    for (_, cert), (launched, left) in zip(parts, [(ran, ["m:_bwd", "m:_fwd_blocked"]),
                                                    ({"m:_bwd": {"launches": 2, "meta": {"BLOCK_SIZE": [64, 128]}},
                                                      "m:_fwd": {"launches": 1, "meta": {"BLOCK_SIZE": [256]},
                                                                 "programs": [1, 7]}},
                                                     ["m:_fwd_blocked"])]):
        cert["implementations"][KERNEL]["triton"] = {"ran": launched, "not_reached": left}
    merged = shards.merge(parts, SCHEMA)
    assert merged["run"] == "complete" and merged["verdict"] == "certified"
    jsonschema.validate(json.loads(to_json(merged)), schema())
    assert merged["implementations"][KERNEL]["triton"] == {
        "ran": {"m:_bwd": {"launches": 2, "meta": {"BLOCK_SIZE": [64, 128]}},  # a shard's, from before programs
                "m:_fwd": {"launches": 4, "meta": {"BLOCK_SIZE": [64, 256]}, "programs": [1, 300]}},
        "not_reached": ["m:_fwd_blocked"]}
