"""The report in a real browser: headless Debian ``chromium`` (installed by ``make browser``).

Checks: no console errors, a valid PNG screenshot, the tables present in the rendered DOM, and a
prompt holding ``<script>`` shown as text and never executed (the document title is unchanged).
A control page with a real script proves the console and title probes would catch a failure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from pcpo_eval.io import to_jsonable
from pcpo_eval.report.html import write_report
from tests.support.browser import playwright_chromium
from tests.support.human import make_human_dir
from tests.support.report import EVIL_PROMPT, SENTENCES, synthetic_results

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="/usr/bin/chromium absent: run `make browser` (apt-get install chromium)"
)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0",
]  # fmt: skip
CONSOLE_RE = re.compile(r"CONSOLE|Uncaught|net::ERR_", re.IGNORECASE)


def chromium(page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *extra, page.resolve().as_uri()]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp)


def console_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if CONSOLE_RE.search(ln)]


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._in_title = tag == "title"
        if (i := dict(attrs).get("id")) is not None:
            self.ids.add(i)

    def handle_endtag(self, tag):
        self._in_title = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_title:
            self.title += data


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    (root / "results.json").write_text(json.dumps(to_jsonable(synthetic_results(root))))
    return write_report(root)


def test_probes_catch_a_script(tmp_path):
    """Control: a page that runs script is detected by the title and console probes."""
    page = tmp_path / "bad.html"
    page.write_text('<html><head><title>ok</title></head><body><script>document.title="pwned";'
                    'throw new Error("boom")</script></body></html>')
    res = chromium(page, tmp_path, "--dump-dom")
    dom = _Dom()
    dom.feed(res.stdout)
    assert dom.title == "pwned"
    assert any("Uncaught" in ln for ln in console_lines(res.stderr))


def test_report_in_browser(report, tmp_path):
    res = chromium(report, tmp_path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_lines(res.stderr) == []
    dom = _Dom()
    dom.feed(res.stdout)
    # the malicious prompt is text, and its script never ran (title unchanged, no <script> element)
    assert dom.title == "pcpo-eval report: synthetic <study>"
    assert "script" not in dom.tags
    assert EVIL_PROMPT in "".join(dom.text)
    for tid in ("verdict-table", "sampler-offset-table", "health-table", "speedup-table", "selection-table",
                "raw-table", "lmm-diagnostics", "preference-table", "runs-table"):
        assert tid in dom.ids, tid
    text = "".join(dom.text)
    assert all(s in text for s in SENTENCES.values())  # the verdict sentences, rendered as text
    assert dom.tags.count("table") >= 12 and dom.tags.count("img") >= 12 + 3 + 6


def test_report_screenshot(report, tmp_path):
    shot = tmp_path / "shot.png"
    res = chromium(report, tmp_path, f"--screenshot={shot}", "--window-size=1280,2000")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_lines(res.stderr) == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(shot) as im:
        im.verify()
    with Image.open(shot) as im:
        assert im.size == (1280, 2000)
        # not a blank page: the rendered tables and plots give many distinct colors
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50


@pytest.fixture(scope="module")
def browser():
    yield from playwright_chromium()


def test_the_page_never_scrolls_sideways(tmp_path, browser):
    """At 1280 px every table fits, the human study's 17 columns too (they were 22 px too wide); at 800 px
    a wide table scrolls inside itself and the page keeps its width."""
    from pcpo_eval.human.analysis import analyze
    from pcpo_eval.human.simulate import simulate_responses

    layout = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=4, n_checks=2)
    pairs = pd.read_parquet(layout.pairs)
    out = analyze(pairs, simulate_responses(pairs, 6, 12, 0.6, rng_seed=3), bootstrap=0)
    results = {**synthetic_results(tmp_path), "human": {**out, "source": "test", "design": {}, "examples": []}}
    (tmp_path / "results.json").write_text(json.dumps(to_jsonable(results)))
    page = browser.new_page()
    page.goto(write_report(tmp_path).resolve().as_uri())
    assert page.locator("#human-table").count() == 1
    for width in (1280, 800):
        page.set_viewport_size({"width": width, "height": 900})
        sizes = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert sizes == [width, width], sizes
        fits = page.evaluate("document.querySelector('#human-table').scrollWidth <= "
                             "document.querySelector('#human-table').clientWidth")
        assert fits == (width == 1280)
    page.close()


def test_chromium_is_debian_package():
    """The browser comes from the system package manager, not a test tool's download."""
    assert shutil.which("chromium") is not None
