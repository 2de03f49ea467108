"""The real rating server under load, killed with SIGKILL mid-study and restarted on the same database.

20 simulated raters (threads with httpx, like browsers that resubmit a form until they get an
answer) submit 450 responses in total to ``serve()`` running in a subprocess; after about 200 are
stored the server is SIGKILLed and restarted. Every fifth answer is also resubmitted with another
choice (a double click, a back-button resubmit). Afterwards the database holds exactly 450 rows, no
(rater, pair) twice, every answer a client was told was stored (303) with its first choice, and the
export says the same.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field

import httpx
import pandas as pd

from pcpo_eval.human import CHOICES, RESPONSE_COLUMNS, db
from tests.support.human import (
    KEY_RE,
    PROGRESS_RE,
    free_port,
    make_human_dir,
    organiser_order,
    start_server,
    stop_server,
)

N_RATERS, PER_RATER, KILL_AT = 20, 23, 200
QUOTAS = [23] * 10 + [22] * 10  # 450 responses in total
DEADLINE = 150.0


@dataclass
class Rater:
    """A simulated rater: answers its quota, retrying each request until the server answers."""

    token: str
    quota: int
    base: str
    stored: dict[int, str] = field(default_factory=dict)  # k (the page's "Pair k of n") -> choice
    retries: int = 0
    errors: list[str] = field(default_factory=list)

    def _until_answered(self, http: httpx.Client, method: str, path: str, **kw) -> httpx.Response:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                r = http.request(method, path, **kw)
            except httpx.TransportError:
                self.retries += 1
                time.sleep(0.05)
                continue
            if r.status_code >= 500:
                self.errors.append(f"{method} {path}: {r.status_code}")
                time.sleep(0.05)
                continue
            return r
        raise TimeoutError(f"{method} {path} unanswered for {DEADLINE} s")

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported by the test
            self.errors.append(repr(exc))

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10.0, follow_redirects=False) as http:
            while len(self.stored) < self.quota:
                page = self._until_answered(http, "GET", f"/r/{self.token}")
                match, progress = KEY_RE.search(page.text), PROGRESS_RE.search(page.text)
                if match is None:
                    self.errors.append("ran out of pairs")
                    return
                k = int(progress.group(1))  # the page names no pair: the test maps k to its pair afterwards
                choice = CHOICES[int(match.group(1).split(".")[1][:4], 16) % 3]
                form = {"key": match.group(1), "choice": choice, "reason": f"r{len(self.stored)}"}
                r = self._until_answered(http, "POST", f"/r/{self.token}/answer", data=form)
                if r.status_code != 303:
                    self.errors.append(f"answer {k}: {r.status_code}")
                    return
                self.stored[k] = choice
                if len(self.stored) % 5 == 0:  # a resubmit with another choice changes nothing
                    other = CHOICES[(CHOICES.index(choice) + 1) % 3]
                    r = self._until_answered(http, "POST", f"/r/{self.token}/answer",
                                             data={**form, "choice": other})
                    if r.status_code != 303:
                        self.errors.append(f"resubmit {k}: {r.status_code}")


def _count(url: str) -> int:
    with db.get_engine(url).connect() as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM responses").scalar())


def _kill_mid_study(url: str, proc, root, port: int, log) -> tuple[int, float, object]:
    """Wait for KILL_AT stored responses, SIGKILL the server, restart it; returns (count, downtime, new)."""
    deadline = time.monotonic() + DEADLINE
    while _count(url) < KILL_AT and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    at_kill, down = _count(url), time.monotonic()
    time.sleep(0.3)
    new = start_server(root, port, log)
    return at_kill, time.monotonic() - down, new


def test_concurrent_raters_survive_a_sigkill(tmp_path):
    layout = make_human_dir(tmp_path / "HUMAN", n_prompts=45, n_seeds=10, n_checks=0, per_rater=PER_RATER)
    url, port, log = layout.database_url, free_port(), tmp_path / "server.log"
    db.upgrade(url)
    tokens = [t for _, t in db.add_raters(url, [f"rater{i:02d}" for i in range(N_RATERS)])]
    proc = start_server(layout.root, port, log)
    raters = [Rater(t, q, f"http://127.0.0.1:{port}") for t, q in zip(tokens, QUOTAS, strict=True)]
    threads = [threading.Thread(target=r.run, daemon=True) for r in raters]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        at_kill, downtime, proc = _kill_mid_study(url, proc, layout.root, port, log)
        for t in threads:
            t.join(DEADLINE)
        elapsed = time.monotonic() - t0
    finally:
        stop_server(proc)
    assert not any(t.is_alive() for t in threads)
    assert [e for r in raters for e in r.errors] == []
    df = db.export_responses(url)
    order = {i + 1: organiser_order(layout, i + 1) for i in range(N_RATERS)}
    told = {(i + 1, order[i + 1][k - 1]): c for i, r in enumerate(raters) for k, c in r.stored.items()}
    stored = {(int(row.rater_id), row.pair_id): row.choice for row in df.itertuples()}
    duplicates = int(df.duplicated(["rater_id", "pair_id"]).sum())
    lost = [k for k, c in told.items() if stored.get(k) != c]
    print(f"\nhuman server: {len(df)} rows, {duplicates} duplicates, {len(lost)} lost, {len(told)} acknowledged, "
          f"killed at {at_kill} stored, down {downtime:.2f} s, {sum(r.retries for r in raters)} client retries, "
          f"{elapsed:.1f} s in total")
    assert KILL_AT <= at_kill < 450  # the kill really happened mid-study
    assert len(df) == 450 and duplicates == 0 and lost == [] and len(told) == 450 and stored == told
    assert tuple(df.columns) == RESPONSE_COLUMNS
    for r in raters:
        assert sorted(r.stored) == list(range(1, len(r.stored) + 1))  # in order, none skipped
    pd.testing.assert_frame_equal(db.export_parquet(url, layout.responses), pd.read_parquet(layout.responses))
    assert db.progress(url, PER_RATER)["answered"].tolist() == QUOTAS
    db.dispose(url)


def test_real_server_limits_chunked_bodies_and_checks_origin(tmp_path):
    """Against uvicorn itself: a chunked body (no Content-Length) of 200 KB or 1 MB is refused
    (413) and stores nothing, a cross-origin answer is refused (403), HEAD works, and the server
    log never holds a rater's token."""
    layout = make_human_dir(tmp_path / "HUMAN", n_prompts=3, n_seeds=2, n_checks=0)
    url, port, log = layout.database_url, free_port(), tmp_path / "server.log"
    db.upgrade(url)
    ((_, token),) = db.add_raters(url, ["ann"])
    proc = start_server(layout.root, port, log)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10.0, follow_redirects=False) as http:
            key = KEY_RE.search(http.get(f"/r/{token}").text).group(1)
            form = f"key={key}&choice=left&reason=".encode()
            for size in (200 * 1024, 1024 * 1024):
                def chunks(size=size):
                    yield form
                    for _ in range(size // 16384):
                        yield b"x" * 16384

                r = http.post(f"/r/{token}/answer", content=chunks(),
                              headers={"content-type": "application/x-www-form-urlencoded"})
                assert r.status_code == 413 and r.request.headers["transfer-encoding"] == "chunked", size
            r = http.post(f"/r/{token}/answer", content=form, headers={
                "content-type": "application/x-www-form-urlencoded", "origin": "https://evil.example"})
            assert r.status_code == 403
            assert db.export_responses(url).empty
            assert http.head("/").status_code == 200 and http.head(f"/r/{token}").status_code == 200
            r = http.post(f"/r/{token}/answer", content=form, headers={
                "content-type": "application/x-www-form-urlencoded", "origin": f"http://127.0.0.1:{port}"})
            assert r.status_code == 303 and len(db.export_responses(url)) == 1
    finally:
        stop_server(proc)
    assert token not in log.read_text()
    db.dispose(url)
