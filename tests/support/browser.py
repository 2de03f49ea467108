"""Headless Debian ``/usr/bin/chromium`` driven by Playwright, shared by the browser tests (a helper
module, not a test module). Never downloads a browser: a missing chromium or playwright, or a sandbox
that forbids launching one, skips the test with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"


def playwright_chromium() -> Iterator[Any]:
    """Yield a launched Playwright browser on the system chromium (use as a fixture's body)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} absent: run `make browser` (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install playwright)")
    with sync_api.sync_playwright() as pw:
        try:
            chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                          args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        except Exception as exc:  # the sandbox may forbid a browser
            pytest.skip(f"chromium failed to launch here: {str(exc).splitlines()[0]}")
        yield chromium
        chromium.close()
