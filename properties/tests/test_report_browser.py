"""The report in a real browser: headless Chromium (the OS package, driven by Selenium), networking
off, opens the page of a certified and of a failing certificate; no severe console message, a heat
map cell per expected check with its outcome's class, each failure's card and replay command
visible, a failing cell's link landing on its card with its input strip, its error / bound strip
and its top-k table (the elements over the bound shaded; ulps apart on the ``--agree`` card), the sort script working;
the page of an incomplete certificate (a crashed run: its verdict and why, no traceback) and of a
forged one ("certified" typed over failing rows: the rows' verdict, and a warning naming the stored
one, above everything); a screenshot of each
is saved in the test's tmp folder (and copied to $NORMCERT_REPORT_SCREENSHOTS where that is set).

Skips, saying what is missing, where Chromium, chromedriver or Selenium is not installed
(``apt-get install chromium chromium-driver``; ``pip install selenium``, in the test extra).
"""
from __future__ import annotations

import copy
import json
import os
import shutil

import pytest

from ..evidence import certificate
from ..presentation import report
from . import report_samples

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")


def _browser():
    if not CHROMIUM or not DRIVER:
        pytest.skip("no headless browser: Chromium and chromedriver are not installed "
                    "(apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="Selenium is not installed (pip install selenium)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "--no-first-run",
                "--disable-background-networking", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                                                                 "downloadThroughput": 0, "uploadThroughput": 0})
    return driver


@pytest.fixture(scope="module")
def browser():
    driver = _browser()
    yield driver
    driver.quit()


def _screenshot(driver, tmp_path, name: str) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(height, 800), 6000))
    driver.execute_script("window.scrollTo(0, 0)")
    path = tmp_path / f"report-{name}.png"
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 10_000
    folder = os.environ.get("NORMCERT_REPORT_SCREENSHOTS")
    if folder:
        shutil.copyfile(path, os.path.join(folder, path.name))


def _open(driver, tmp_path, cert: dict):
    from selenium.webdriver.common.by import By  # noqa: PLC0415 - only where the browser runs

    page = tmp_path / "report.html"
    page.write_text(report.render(cert), encoding="utf-8")
    driver.set_window_size(1400, 1000)
    driver.get(page.as_uri())
    driver.get_log("browser")  # nothing before this page
    cells = {e.get_attribute("data-cell"): e for e in driver.find_elements(By.CSS_SELECTOR, "a.cell")}
    expected = report_samples.expected_cells(cert)
    assert set(cells) == set(expected)
    for key, outcome in expected.items():
        assert cells[key].get_attribute("class").split() == ["cell", outcome] and cells[key].is_displayed()
    for r in (r for r in cert["results"] if r["outcome"] in report.CARD_OUTCOMES):
        card = cells["|".join((r["impl"], r["property"], r["dtype"]))].get_attribute("href").split("#")[1]
        section = driver.find_element(By.ID, card)
        assert section.is_displayed() and section.get_attribute("class").split() == ["failure", r["outcome"]]
        command = section.find_elements(By.CSS_SELECTOR, "code.replay-cmd")
        if r["replay"].startswith("normcert replay "):
            assert command and command[0].is_displayed() and command[0].text == r["replay"]
    return cells, By


def _no_console_errors(driver) -> None:
    severe = [m for m in driver.get_log("browser") if m["level"] == "SEVERE"]
    assert not severe, severe


def test_a_certified_report_in_chromium(browser, tmp_path):
    cells, By = _open(browser, tmp_path, report_samples.certified())
    head = browser.find_element(By.CSS_SELECTOR, "table.results th:nth-child(5)")  # error / bound
    head.click()
    values = [float(td.get_attribute("data-sort")) for td in browser.find_elements(By.CSS_SELECTOR,
                                                                                    "table.results td:nth-child(5)")]
    assert values == sorted(values)
    _no_console_errors(browser)
    _screenshot(browser, tmp_path, "certified")


def test_a_failing_report_in_chromium(browser, tmp_path):
    cert = report_samples.failing(str(tmp_path))
    cells, By = _open(browser, tmp_path, cert)
    failing = cells["rms_norm:example:k|accuracy|float32"]
    failing.click()
    target = failing.get_attribute("href").split("#")[1]
    assert browser.execute_script("return location.hash") == f"#{target}"
    assert browser.find_element(By.CSS_SELECTOR, f"#{target} svg.strip").is_displayed()
    errors = browser.find_element(By.CSS_SELECTOR, f"#{target} svg.errors")
    assert errors.is_displayed() and len(errors.find_elements(By.CSS_SELECTOR, "rect")) == 40
    rows = browser.find_elements(By.CSS_SELECTOR, f"#{target} table.top tbody tr")
    assert len(rows) == 8 and all(r.is_displayed() for r in rows)
    assert [r.get_attribute("class") for r in rows[:3]] == ["over", "over", ""]
    assert rows[0].text.split()[:2] == ["[1,", "7]"] and float(rows[0].find_elements(By.TAG_NAME, "td")[4].text) > 1
    agree = cells["rms_norm:example:k|agreement|float32"].get_attribute("href").split("#")[1]
    head = browser.find_element(By.CSS_SELECTOR, f"#{agree} table.top thead").text
    assert "ulps apart" in head and "bound" not in head
    assert browser.find_element(By.CSS_SELECTOR, f"#{agree} table.top tbody tr").text.split()[-1] == "3"
    assert browser.title.startswith("normcert report: not certified")
    assert "<script>" in browser.find_element(By.CSS_SELECTOR, "table.heat").text  # shown as text, not run
    _no_console_errors(browser)
    _screenshot(browser, tmp_path, "failing")


def test_an_incomplete_report_in_chromium(browser, tmp_path):
    """A crashed run's certificate (``certificate.write_incomplete``): exactly when a report is wanted."""
    path = str(tmp_path / "c.json")
    certificate.write_incomplete(path, "the kernel's process exited with status -11 before normcert's end of run")
    with open(path) as f:
        cert = json.load(f)
    cells, By = _open(browser, tmp_path, cert)
    assert not cells
    verdict = browser.find_element(By.ID, "verdict")
    assert verdict.is_displayed() and verdict.get_attribute("class").split() == ["verdict", "incomplete"]
    assert "exited with status -11" in verdict.text and "incomplete" in verdict.text
    assert browser.title.startswith("normcert report: incomplete")
    assert not browser.find_elements(By.ID, "stored-verdict")
    _no_console_errors(browser)
    _screenshot(browser, tmp_path, "incomplete")


def test_a_forged_report_in_chromium(browser, tmp_path):
    """"certified" typed over a certificate whose rows fail: the page is drawn from the rows, and the
    first thing under the verdict says what the file claimed."""
    forged = copy.deepcopy(report_samples.failing(str(tmp_path)))
    forged["verdict"] = "certified"
    cells, By = _open(browser, tmp_path, forged)
    verdict = browser.find_element(By.ID, "verdict")
    assert verdict.get_attribute("class").split() == ["verdict", "not-certified"]
    warning = browser.find_element(By.ID, "stored-verdict")
    assert warning.is_displayed() and warning.location["y"] > verdict.location["y"]
    assert 'The certificate says "certified", but its rows say "not certified"' in warning.text
    assert browser.title.startswith("normcert report: not certified")
    assert cells["rms_norm:example:k|accuracy|float32"].get_attribute("class").split() == ["cell", "fail"]
    _no_console_errors(browser)
    _screenshot(browser, tmp_path, "forged")
