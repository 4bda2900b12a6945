"""The web page in a real browser: Playwright driving Debian's Chromium (/usr/bin/chromium; Playwright
never downloads a browser). Fills a job, checks that the table and both SVG charts render, that the
shared URL reproduces the result, and that the page requests nothing outside the app's origin."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("FTPLAN_CHROMIUM", "/usr/bin/chromium")

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
sync_api = pytest.importorskip("playwright.sync_api")
if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

from ftplan.web import create_app  # noqa: E402

SCREENSHOT_COPY = Path(__file__).resolve().parents[2] / "benchmarks" / "notes" / "web_screenshot.png"


@pytest.fixture(scope="module")
def server():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(), log_level="warning", lifespan="off", ws="none"))
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 15
    while not srv.started:
        if time.monotonic() > deadline or not t.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(10)
    sock.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                  args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        except Exception as e:  # a broken local Chromium is an environment problem, not a bug here
            pytest.skip(f"cannot start {CHROMIUM}: {e}")
        yield b
        b.close()


def _plan_rows(page) -> list[str]:
    return page.locator("#plans tbody tr").all_inner_texts()


def _wait_results(page) -> None:
    page.wait_for_selector("#plans tbody tr", timeout=20_000)
    page.wait_for_selector("#fit-table", timeout=20_000)


def test_plan_charts_share_and_no_external_requests(server, browser, tmp_path):
    ctx = browser.new_context(viewport={"width": 1300, "height": 1000}, accept_downloads=True)
    requests: list[str] = []
    ctx.on("request", lambda r: requests.append(r.url))
    errors: list[str] = []
    page = ctx.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    # (the browser logs the intended 422 of the bad model name as "Failed to load resource")
    page.on("console", lambda m: errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource") else None)

    page.goto(server + "/")
    page.wait_for_selector("body[data-ready='1']")
    assert page.locator("#model-list option").count() >= 30  # the catalog, for the search box

    # a bad name first: the error names the field and suggests the catalog name
    page.fill("#model", "llama-70b")
    page.fill("#tokens", "20M")
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])")
    assert "did you mean" in page.inner_text("#error") and "llama-3.1-70b" in page.inner_text("#error")
    assert "invalid" in (page.get_attribute("#model", "class") or "")

    page.fill("#model", "llama-3.1-70b")
    page.select_option("#method", "qlora")
    assert page.is_visible("#quant_type") and page.is_visible("#lora_r")
    page.fill("#seq_len", "4096")
    page.click("#run")
    _wait_results(page)
    assert page.is_hidden("#error")

    rows = _plan_rows(page)
    assert len(rows) > 0
    assert page.locator("#plans tbody tr.selected").count() == 1
    assert page.locator("#mem-chart rect.seg").count() >= 3  # stacked components
    assert page.locator("#mem-chart line.cap").count() >= 1  # the capacity line
    n_points = page.locator("#scatter circle.pt[data-index]").count()
    assert n_points == page.locator("#plans tbody tr").count() or n_points > len(rows)
    assert n_points > 0
    assert page.locator("#scatter circle.pt.pareto[data-index]").count() > 0
    assert page.locator("#scatter path.frontier").count() == 1
    assert page.locator("#compare tbody tr").count() > 0
    assert page.locator("#why-not li").count() > 0
    fit = page.inner_text("#fit")
    assert "longest sequence" in fit and "largest micro-batch" in fit

    # select the third plan: the chart follows and the URL records it
    page.click("#plans tbody tr:nth-child(3)")
    page.wait_for_function("document.querySelector('#mem-title').textContent.includes('plan #3')")
    page.wait_for_function("location.hash.includes('sel=2')")
    mem_title = page.inner_text("#mem-title")
    page.wait_for_selector("#fit-table")
    fit = page.inner_text("#fit")
    share = page.input_value("#share")
    assert share.startswith(server + "/#") and "model=llama-3.1-70b" in share and "method=qlora" in share

    # download the selected plan as JSON
    with page.expect_download() as dl:
        page.click("#dl-json")
    plan = json.loads(Path(dl.value.path()).read_text())
    assert plan["offer"]["sku"] in rows[2] and plan["job"]["method"] == "qlora"

    page.screenshot(path=str(tmp_path / "web.png"), full_page=True)
    if os.environ.get("FTPLAN_SAVE_SCREENSHOT"):  # the charts, for benchmarks/notes/
        SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
        page.locator(".charts").screenshot(path=str(tmp_path / "charts.png"))
        shutil.copy(tmp_path / "charts.png", SCREENSHOT_COPY)

    # the shared URL, in a fresh page, fills the form, runs and shows the same result
    page2 = ctx.new_page()
    page2.on("pageerror", lambda e: errors.append(str(e)))
    page2.goto(share)
    _wait_results(page2)
    page2.wait_for_function("document.querySelector('#mem-title').textContent.includes('plan #3')")
    assert page2.input_value("#model") == "llama-3.1-70b"
    assert page2.input_value("#method") == "qlora"
    assert page2.input_value("#seq_len") == "4096" and page2.input_value("#tokens") == "20M"
    assert _plan_rows(page2) == rows
    assert page2.locator("#plans tbody tr.selected").inner_text() == page.locator("#plans tbody tr.selected").inner_text()
    assert page2.inner_text("#mem-title") == mem_title
    page2.wait_for_selector("#fit-table")
    assert page2.inner_text("#fit") == fit
    assert page2.locator("#scatter circle.pt[data-index]").count() == n_points

    assert not errors, errors
    foreign = [u for u in requests if not (u.startswith(server + "/") or u.split(":", 1)[0] in ("data", "blob"))]
    assert not foreign, foreign
    assert any("/api/recommend" in u for u in requests) and any("/api/fit" in u for u in requests)
    ctx.close()
