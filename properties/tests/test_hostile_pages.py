"""Bounded work on hostile files (issue 46): a page drawn from a certificate and the replay files its
rows name ends in seconds with a true page or one line, whatever the files hold; and a replay file is
drawn on a card only where it is the failure of the row that names it."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from normcert import cli

from ..evidence import certificate, replay_names
from ..presentation import report, report_replay
from . import report_samples
from .replay_helpers import named_as, rewrite

KERNEL = "rms_norm:example:k"


def _failing(replay: str, failures=None, prop="accuracy") -> dict:
    row = report_samples.row(KERNEL, prop, "float32", "fail", 2.0, 9.0, message="y[1, 3]: got 1",
                             replay=f"normcert replay {replay}")
    if failures is not None:
        row["failures"] = failures
    return report_samples.build([row], {KERNEL: report_samples.impl("rms_norm")}, "not certified")


def _card_views(cert) -> list[dict]:
    return [c["replay"] for c in report.cards(cert, report.detail_ids(cert)[2])]


def _write(folder, cert) -> str:
    path = str(folder / "c.json")
    with open(path, "w") as f:
        f.write(certificate.to_json(cert))
    return path


def test_a_row_said_to_be_10_to_the_15_wide_is_one_line_and_no_allocation(tmp_path, capsys):
    path = report_samples.write_replay(str(tmp_path), np.ones((2, 8)))
    rewrite(path, lambda m: m["tensors"]["x"].update(shape=[2, 10 ** 15], stride=[10 ** 15, 1]))
    (view,) = _card_views(_failing(path))
    assert "its row reaches element 1999999999999999, past the " in view["error"] and "\n" not in view["error"]
    cert = _write(tmp_path, _failing(path))
    assert cli.main(["report", cert, "-o", str(tmp_path / "c.html")]) == 0
    assert "past the" in (tmp_path / "c.html").read_text()


def test_200000_nested_arrays_are_one_line_in_a_replay_file_and_a_certificate(tmp_path, capsys):
    path = report_samples.write_replay(str(tmp_path), np.ones((2, 8)))
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["meta"] = np.frombuffer(("[" * 200_000 + "]" * 200_000).encode(), dtype=np.uint8)
    np.savez(path, **arrays)
    (view,) = _card_views(_failing(path))
    assert "nested deeper than the 32 levels" in view["error"]
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    assert cli.main(["report", str(deep), "-o", str(tmp_path / "d.html")]) == cli.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nested deeper than the 32 levels" in err[0]


def test_a_certificate_nested_within_the_recursion_limit_but_past_normcert_s_own_is_refused(tmp_path, capsys):
    cert = report_samples.certified()
    cert["environment"]["notes"] = json.loads("[" * 500 + "]" * 500)  # parsed by json, walked by every page
    path = str(tmp_path / "c.json")
    with open(path, "w") as f:
        json.dump(cert, f)
    for args in (["report", path, "-o", str(tmp_path / "r.html")], ["compare", path, path]):
        assert cli.main(args) == cli.USAGE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "nested deeper than the 32 levels" in err[0]


def test_20000_failures_naming_one_replay_file_are_capped_cards_and_one_read(tmp_path, monkeypatch):
    path = report_samples.write_replay(str(tmp_path), np.ones((2, 8)))
    entry = {"message": "y[1, 3]: got 1", "where": "y[1, 3]: seed=1", "kind": "y: past the bound",
             "replay": f"normcert replay {path}", "worst_units": 2.0, "worst_ulps": 9.0}
    cert = _failing(path, [dict(entry, kind=f"y: past the bound #{k}") for k in range(20_000)])
    reads = []
    check = report_replay._check
    monkeypatch.setattr(report_replay, "_check", lambda p: reads.append(p) or check(p))
    start = time.monotonic()
    html = report.render(cert)
    took = time.monotonic() - start
    cards = report.cards(cert, report.detail_ids(cert)[2])
    assert len(reads) == 2  # once for the page, once for the cards listed here: never once per card
    assert len(cards) == report.CARDS_PER_ROW
    assert cards[-1]["row"]["of"].endswith(f"the row's other {20_000 - report.CARDS_PER_ROW} failures are left "
                                           f"out of this page (the certificate holds them)")
    assert html.count('<section class="failure') == report.CARDS_PER_ROW
    assert took < 30, took  # 20,000 cards re-reading the file took over 200 s


def test_a_replay_file_that_is_not_the_row_s_failure_is_said_not_drawn(tmp_path):
    """The row names a file of another property, or a stamped file whose bytes changed after the run,
    or one renamed to this cell's name: the card says so in one line and draws nothing of it."""
    other = report_samples.write_replay(str(tmp_path), np.ones((2, 8)), prop="gradients")
    (view,) = _card_views(_failing(other))
    assert view["error"] == ("the replay file is not this row's failure: it holds a failure of rms_norm gradients, "
                             "the row is rms_norm accuracy; nothing of it is drawn")
    assert "strip" not in view and "meta" not in view
    plain = report_samples.write_replay(str(tmp_path), np.ones((2, 8)))
    stamped = named_as(plain, replay_names.cell("rms_norm", "example:k", "accuracy", "float32"))
    (view,) = _card_views(_failing(stamped))
    assert view["error"] == "" and "strip" in view  # its own file is drawn
    rewrite(stamped, lambda m: m["notes"].update(later="a later run's case"))
    (view,) = _card_views(_failing(stamped))
    assert "not this row's failure: its bytes are not those it was saved with" in view["error"]
    renamed = named_as(stamped, replay_names.cell("rms_norm", "example:k", "accuracy", "bfloat16"))
    (view,) = _card_views(_failing(renamed))
    assert "its name is the cell rms_norm-example_k-accuracy-bfloat16's, not rms_norm-example_k-accuracy-float32" \
        in view["error"]


@pytest.mark.parametrize("field", ["shape", "stride", "offset"])
def test_a_card_s_malformed_layout_is_one_line(tmp_path, field):
    path = report_samples.write_replay(str(tmp_path), np.ones((2, 8)))
    rewrite(path, lambda m: m["tensors"]["x"].update({field: "many" if field == "offset" else [2, "x"]}))
    (view,) = _card_views(_failing(path))
    assert view["error"].startswith("the replay file could not be read") and "\n" not in view["error"]


def test_without_jsonschema_a_row_missing_a_field_is_one_line(tmp_path, capsys, monkeypatch):
    """A plain install has no ``jsonschema``: a certificate with its required fields but a row missing
    one of its own ended in a jinja2 UndefinedError traceback."""
    monkeypatch.setitem(__import__("sys").modules, "jsonschema", None)
    cert = report_samples.certified()
    for r in cert["results"]:
        del r["modes"]  # the warning row's card shows it
    path = _write(tmp_path, cert)
    assert cli.main(["report", path, "-o", str(tmp_path / "r.html")]) == cli.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a malformed certificate (UndefinedError: " in err[0] and "modes" in err[0]
