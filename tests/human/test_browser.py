"""The rating app in a real browser: headless Debian ``/usr/bin/chromium`` driven by Playwright.

Against ``serve()`` in a subprocess: open a rater link, rate three pairs by clicking the real
buttons (one with a typed reason), undo the third and answer it again, watch the progress line,
and find the three responses (the first answers kept) in the database. Skipped (with the reason) when chromium or playwright is missing or chromium
cannot start in this sandbox; no browser is ever downloaded.
"""

from __future__ import annotations

import re

import pytest

from pcpo_eval.human import db
from tests.support.browser import playwright_chromium
from tests.support.human import free_port, make_human_dir, organiser_order, start_server, stop_server


@pytest.fixture(scope="module")
def browser():
    yield from playwright_chromium()


def test_rate_three_pairs_in_chromium(tmp_path, browser):
    layout = make_human_dir(tmp_path / "HUMAN", n_prompts=4, n_seeds=2, n_checks=2, per_rater=6)
    url, port = layout.database_url, free_port()
    db.upgrade(url)
    ((_, token),) = db.add_raters(url, ["browser-rater"])
    proc = start_server(layout.root, port, tmp_path / "server.log")
    errors: list[str] = []
    try:
        page = browser.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        page.goto(f"http://127.0.0.1:{port}/r/{token}")
        clicked = []
        for step, (button, reason) in enumerate((("#choose-left", ""), ("#choose-tie", "both look the same"),
                                                 ("#choose-right", ""))):
            assert page.inner_text("#progress") == f"Pair {step + 1} of 6"
            assert page.locator("img").count() == 2
            assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth === 16)")
            clicked.append(re.findall(r'<img src="([^"]+)"', page.content()))  # a pair's image URLs are stable
            if reason:
                page.fill("#reason", reason)
            with page.expect_navigation():
                page.click(button)
        assert page.inner_text("#progress") == "Pair 4 of 6"
        with page.expect_navigation():  # a misclick on the third pair: undo it and answer again
            page.click("#undo-last")
        assert page.inner_text("#progress") == "Pair 3 of 6"
        assert re.findall(r'<img src="([^"]+)"', page.content()) == clicked[2]
        with page.expect_navigation():
            page.click("#choose-left")
        assert page.inner_text("#progress") == "Pair 4 of 6"
        assert errors == []
    finally:
        stop_server(proc)
    df = db.export_responses(url)
    assert df.pair_id.tolist() == organiser_order(layout, 1)[:3]
    assert df.choice.tolist() == ["left", "tie", "left"]  # Chromium's own Origin header was accepted
    assert df.first_choice.tolist() == ["left", "tie", "right"] and df.corrections.tolist() == [0, 0, 2]
    assert df.reason.tolist() == ["", "both look the same", ""]
    db.dispose(url)
