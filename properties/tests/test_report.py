"""The HTML report (``report.render``) of hand-built certificates: a heat map cell per expected check
with its outcome's class, a card per failing row with its replay command, non-finite numbers, HTML
escaping, the failing input row drawn from a replay file, the failing output's elements (error /
bound strip and top-k table; ulps apart for ``--agree``), and ``normcert report``'s command line."""
from __future__ import annotations

import json
import os
from html.parser import HTMLParser

import numpy as np
import pytest

from normcert import cli

from ...oracle.assessment import TOP_K, WINDOW, worst_elements

from ..presentation import report
from ..evidence.certificate import SCHEMA
from . import report_samples
from ..harness.measure import PropertyFailure, Worst, check_pair
from ..presentation.report_replay import elements_view
from .report_samples import HOSTILE


class Page(HTMLParser):
    """What the tests look for in a page: cells (data-cell -> classes and link), failure cards
    (id -> classes), ids, the text of each card, and every script's text."""

    def __init__(self, html: str):
        super().__init__()
        self.cells, self.cards, self.ids, self.card_text, self.scripts = {}, {}, set(), {}, []
        self._card, self._script = None, False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if "data-cell" in a:
            self.cells[a["data-cell"]] = (a.get("class", "").split(), a.get("href", ""), a.get("title", ""))
        if tag == "section" and "failure" in a.get("class", ""):
            self.cards[a["id"]] = a["class"].split()
            self._card = a["id"]
            self.card_text[self._card] = ""
        self._script = tag == "script"

    def handle_endtag(self, tag):
        if tag == "section":
            self._card = None
        self._script = False

    def handle_data(self, data):
        if self._card:
            self.card_text[self._card] += data
        if self._script:
            self.scripts.append(data)


def test_a_certified_certificate_has_a_cell_per_check_with_its_outcome():
    cert = report_samples.certified()
    page = Page(report.render(cert))
    expected = report_samples.expected_cells(cert)
    assert {k: v[0] for k, v in page.cells.items()} == {k: ["cell", o] for k, o in expected.items()}
    assert all(href.lstrip("#") in page.ids for _, href, _ in page.cells.values())
    assert list(page.cards.values()) == [["failure", "warn"]]  # the warning's note, and no failure


def test_each_failing_row_has_a_card_with_its_replay_command(tmp_path):
    cert = report_samples.failing(str(tmp_path))
    html = report.render(cert)
    page = Page(html)
    assert {k: v[0][1] for k, v in page.cells.items()} == report_samples.expected_cells(cert)
    failing = [r for r in cert["results"] if r["outcome"] in report.CARD_OUTCOMES]
    assert len(page.cards) == len(failing) == 4
    for r in failing:  # each failing cell links to its own card, and the card holds its replay field
        classes, href, title = page.cells["|".join((r["impl"], r["property"], r["dtype"]))]
        card = href.lstrip("#")
        assert page.cards[card] == ["failure", r["outcome"]]
        assert r["replay"] in page.card_text[card] and r["outcome"] in title
    first = page.card_text[page.cells["rms_norm:example:k|accuracy|float32"][1].lstrip("#")]
    assert "bucket" in first and "odd 3x40" in first and "4294967295" in first
    assert "input x, row 1" in " ".join(first.split()) and "30000" in first  # the row drawn from the replay file
    assert '<svg class="strip"' in html
    assert "could not be read (ValueError: no such file)" in html  # the replay file that is not there
    for entry in cert["not_run"]:  # a hatched cell, linked to its line in the list of checks that did not run
        classes, href, _ = page.cells["|".join(entry.rsplit(" ", 2))]
        assert classes == ["cell", "not-run"] and href.lstrip("#") in page.ids


def test_non_finite_numbers_render_and_hostile_text_is_escaped(tmp_path):
    html = report.render(report_samples.failing(str(tmp_path)))
    page = Page(html)
    _, _, title = page.cells[f"{HOSTILE}|accuracy|float64"]
    assert "error/bound inf, inf ulp" in title
    assert "error/bound nan, inf ulp" in page.cells[f"{HOSTILE}|accuracy|float32"][2]
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#34;message&#34;)" in html
    assert len(page.scripts) == 1 and "alert" not in page.scripts[0]  # the sort script alone
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html


def test_colours_follow_the_log_scale_with_one_as_the_threshold():
    assert report.colour("pass", 1e-9) == report.colour("pass", 1e-4) != report.colour("pass", 0.5)
    assert report.colour("pass", 1.0) == "#%02x%02x%02x" % report.PASS_SCALE[-1][1]
    assert report.colour("fail", 1.5) != report.colour("fail", 1e3) == report.colour("fail", 1e3)
    assert report.colour("fail", "inf") == report.colour("error", 0.1) == "#%02x%02x%02x" % report.FAIL_SCALE[-1][1]
    assert report.colour("not-supported", 0) == report.GREY["not-supported"]


def test_normcert_report_writes_the_page_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    cert = tmp_path / "c.json"
    cert.write_text(json.dumps(report_samples.certified()))
    assert cli.main(["report", str(cert), "-o", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert cli.main(["report", str(cert)]) == 0 and (tmp_path / "c.html").is_file()  # beside it by default
    bad = tmp_path / "bad.json"
    for text, problem in (("{", "not JSON"), ('{"schema": "x"}', f"not a {SCHEMA} certificate"),
                          (json.dumps({**report_samples.certified(), "results": [{}]}), "does not fit the schema")):
        bad.write_text(text)
        capsys.readouterr()
        assert cli.main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == cli.USAGE
        err = capsys.readouterr().err
        assert err.startswith(f"normcert report: {bad}: {problem}") and err.count("\n") == 1
    assert cli.main(["report", str(cert), "-o", str(tmp_path / "no" / "r.html")]) == cli.USAGE
    assert capsys.readouterr().err.startswith(f"normcert report: -o {tmp_path / 'no' / 'r.html'}: folder")
    assert cli.main(["certify", "rms_norm=example:k", "--report", str(tmp_path / "r.html")]) == cli.USAGE
    assert "--report" in capsys.readouterr().err and not os.path.exists(tmp_path / "r.json")


@pytest.mark.parametrize("damage", [b"not a zip", b""])
def test_a_damaged_replay_file_gives_a_reason_not_an_exception(tmp_path, damage):
    cert = report_samples.failing(str(tmp_path))
    path = tmp_path / "rms_norm-k-accuracy-float32.npz"
    path.write_bytes(damage)
    assert "the replay file could not be read (ValueError: not a replay file (.npz))" in report.render(cert)


def _cards(cert: dict) -> dict:
    """(kernel, property, dtype) -> the card's data (``report.cards``)."""
    return {(c["row"]["impl"], c["row"]["property"], c["row"]["dtype"]): c for c in
            report.cards(cert, report.detail_ids(cert)[2])}


def test_a_failure_card_lists_the_top_elements_and_draws_error_over_bound(tmp_path):
    cert = report_samples.failing(str(tmp_path))
    el = _cards(cert)[("rms_norm:example:k", "accuracy", "float32")]["replay"]["elements"]
    assert el["kind"] == "oracle" and el["output"] == "y" and el["index"] == "1, 7" and el["over"] == 2
    top = el["top"]
    assert len(top) == TOP_K and [t["index"] for t in top[:2]] == ["1, 7", "1, 30"]  # over the bound first
    assert [t["over"] for t in top] == [True, True] + [False] * (TOP_K - 2)
    assert float(top[0]["units"]) > 1e3 and 1 < float(top[1]["units"]) < 10 and float(top[1]["ulps"]) > 60
    assert all(float(t["units"]) < 1 for t in top[2:])
    units = [float(t["units"]) for t in top]
    assert units == sorted(units, reverse=True)
    strip = el["strip"]  # row 1, all 40 columns, the two over the bound red, under the bound line
    assert (el["row"], el["start"], el["stop"], el["length"], el["column"]) == ("1", 0, 39, 40, 7)
    assert [k for k, b in enumerate(strip["bars"]) if b["fill"] == "#b3261e"] == [7, 30]
    assert strip["bars"][7]["y"] < strip["bound"] < strip["bars"][8]["y"]
    assert "[7] got 6.38780069" in strip["bars"][7]["title"]
    page = Page(html := report.render(cert))
    text = " ".join(page.card_text[page.cells["rms_norm:example:k|accuracy|float32"][1].lstrip("#")].split())
    assert '<svg class="errors"' in html and '<table class="top">' in html
    assert "columns 0 to 39 of 40 shown" in text and "2 shown, 2 of 120 in the whole output" in text


def test_an_agreement_card_lists_the_elements_that_differ_and_their_ulps(tmp_path):
    cert = report_samples.failing(str(tmp_path))
    el = _cards(cert)[("rms_norm:example:k", "agreement", "float32")]["replay"]["elements"]
    assert el["kind"] == "agreement" and el["over"] == 2 and el["checked"] == 120
    assert [(t["index"], t["ulps"], t["over"]) for t in el["top"][:3]] == [("0, 5", "3", True), ("2, 0", "0", True),
                                                                          ("0, 0", "0", False)]
    assert el["top"][1]["got"] == "-0" and el["top"][1]["exact"] == "0"  # the bits differ, the values do not
    assert el["strip"]["bound"] is None and el["strip"]["bars"][5]["fill"] == "#b3261e"
    page = Page(html := report.render(cert))
    text = " ".join(page.card_text[page.cells["rms_norm:example:k|agreement|float32"][1].lstrip("#")].split())
    assert "ulps apart from the kernel it must agree with" in text and "differ: 1 shown, 2 of 120" in text
    assert '<th class="num">the other</th><th class="num">ulps apart</th>' in html


def test_a_long_row_shows_a_window_around_the_worst_and_says_which():
    shape = (2, 5000)
    exact = np.linspace(1, 2, 10_000).reshape(shape)
    got, bound = exact.copy(), np.full(shape, 1e-6)
    got[1, 4990] += 1e-3
    units = np.abs(got - exact) / bound
    el = elements_view(worst_elements(
        "oracle", "y", "float64", (1, 4990), got, exact, bound, units, units, units > 1, 10_000))
    assert (el["start"], el["stop"], el["length"]) == (5000 - WINDOW, 4999, 5000)
    assert len(el["strip"]["bars"]) == WINDOW and el["column"] == 4990 and el["top"][0]["index"] == "1, 4990"


def test_a_check_of_two_calls_shows_the_other_call_as_the_reference(tmp_path):
    case, y = report_samples.sample_case(np.linspace(1, 2, 8).reshape(2, 4))
    other = y.clone()
    y[0, 2] += 1e-3
    with pytest.raises(PropertyFailure):
        check_pair("y (strided vs contiguous)", "y", y, other, np.zeros((2, 4)), case, Worst())
    assert case.elements["kind"] == "pair" and case.elements["top"][0]["index"] == [0, 2]
    html = report.render(report_samples.build(
        [report_samples.row("rms_norm:example:k", "contract", "float32", "fail", "inf", 1e4, message="y[0, 2]: got",
                            replay="normcert replay " + report_samples.write_replay(str(tmp_path), np.ones((2, 4)),
                                                                                   case.elements, "contract"))],
        {"rms_norm:example:k": report_samples.impl("rms_norm")}, "not certified"))
    assert '<th class="num">got</th><th class="num">reference</th>' in html and "[2] got " in html and "got 1.05078101, reference 1.04978096" in html


def test_damaged_per_element_data_gives_a_reason_not_an_exception(tmp_path):
    values = np.ones((2, 4), dtype=np.float32)
    for elements, problem in (({"kind": "oracle", "top": [{"got": "x"}]}, "could not convert"),
                              ({"kind": "oracle", "top": [], "row": {"units": [{}]}, "index": [0, 1]}, "not a number"),
                              ([1, 2], "not per-element data")):
        path = report_samples.write_replay(str(tmp_path), values, elements)
        view = report.replay_view(path, "", "y[1, 2]: got 1")
        assert "elements" not in view and problem in view["elements_error"]


def test_each_distinct_failure_of_a_cell_has_its_own_card_and_replay_command(tmp_path):
    cert = report_samples.failing(str(tmp_path))
    first = cert["results"][0]
    other = "normcert replay " + report_samples.write_replay(str(tmp_path), np.zeros((0, 40), np.float32), suffix="-2")
    first["failures"] = [{"message": first["message"], "where": first["worst_where"], "kind": "y: over the bound",
                          "replay": first["replay"], "worst_units": 3.6e7, "worst_ulps": 1.4e9},
                         {"message": "rms_norm:example:k raised AssertionError: x.stride(0) of an empty batch",
                          "where": "rms_norm(x: float32(0, 40), seed=12, bucket=empty)",
                          "kind": "rms_norm:example:k raised AssertionError at k.py:3", "replay": other}]
    page = Page(report.render(report_samples.build(cert["results"], cert["implementations"], cert["verdict"],
                                                    cert["not_run"])))
    assert len(page.cards) == 5  # the four failing rows, and the first one's second failure
    cell = page.cells["rms_norm:example:k|accuracy|float32"][1].lstrip("#")
    second = next(c for c in page.cards if c != cell and c.startswith(cell))
    assert first["replay"] in page.card_text[cell] and other not in page.card_text[cell]
    assert "failure 1 of 2: y: over the bound" in page.card_text[cell]
    text = " ".join(page.card_text[second].split())
    assert other in text and first["replay"] not in text and "failure 2 of 2: rms_norm:example:k raised" in text
    assert "rms_norm(x: float32(0, 40)" in text and "error / bound- ulps-" in text  # its own case; nothing measured


def test_a_card_s_figures_are_those_of_the_case_it_shows():
    """The row's worst error / bound is over every example it ran (an unshrunk case's 1.67e9); the card
    shows the shrunk case, so its figures are that case's failure entry's, and the row's are named as such."""
    k = "rms_norm:example:k"
    r = report_samples.row(k, "accuracy", "float32", "fail", 1.67e9, 4.4e12, message="y[0, 3]: got 2",
                           where="y[0, 3]: rms_norm(x: float32(1, 8), seed=5)")
    r["failures"] = [{"message": r["message"], "where": r["worst_where"], "kind": "y: past the bound",
                      "replay": "not saved", "worst_units": 1.51e7, "worst_ulps": 3.2e9}]
    cert = report_samples.build([r], {k: report_samples.impl("rms_norm")}, "not certified")
    (card,) = report.cards(cert, report.detail_ids(cert)[2])
    assert (card["row"]["worst_units"], card["row"]["worst_ulps"]) == (1.51e7, 3.2e9)
    text = " ".join(Page(report.render(cert)).card_text[card["id"]].split())
    assert "error / bound1.51e+07 (this case) ulps3.2e+09 (this case)" in text
    assert "the row's worst1.67e+09 of the bound, 4.4e+12 ulps, over every example it ran" in text
