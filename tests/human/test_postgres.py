"""The rating app on a live PostgreSQL server (``--database-url postgresql+psycopg://...``).

A private PostgreSQL cluster is created in a temporary folder (Debian's ``postgresql`` package;
``make test`` installs it as root), started on a Unix socket, and the whole database path runs
against it: migrations (twice), pairs, raters, the app in-process, a resubmit, 8 threads submitting
the same pair at once, the export. Skipped with the reason when PostgreSQL, the ``psycopg`` driver
or a user to run the server as (PostgreSQL refuses to run as root) is missing.
"""

from __future__ import annotations

import concurrent.futures as cf
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from pcpo_eval.human import RESPONSE_COLUMNS, db
from pcpo_eval.registry import optional_module
from tests.support.human import KEY_RE, make_human_dir, shown_pair

BINDIRS = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
psycopg = optional_module("psycopg")


def _server_user() -> str | None:
    """Who runs the server: this user if not root, else the ``postgres`` system user."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres").pw_name
    except KeyError:
        return ""


pytestmark = [
    pytest.mark.skipif(not BINDIRS, reason="PostgreSQL not installed (apt-get install postgresql; `make test` "
                                           "installs it as root)"),
    pytest.mark.skipif(psycopg is None, reason="the psycopg driver is not installed (pip install 'psycopg[binary]')"),
    pytest.mark.skipif(_server_user() == "", reason="running as root without a 'postgres' user to run the server"),
]


def _as_user(cmd: list[str]) -> list[str]:
    user = _server_user()
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


@pytest.fixture
def pg_url():
    """A running private cluster; yields its SQLAlchemy URL; stops and removes it afterwards.

    Its folder is a fresh one under the system temp dir (pytest's own is private to this user,
    and the server may run as ``postgres``)."""
    bindir = Path(BINDIRS[-1])
    root = Path(tempfile.mkdtemp(prefix="pcpo-pg-", dir=os.environ.get("PCPO_EVAL_TEST_SYSTEM_TMPDIR")))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    user = _server_user()
    if user:
        os.chmod(root, 0o755)
        shutil.chown(root, user)
        shutil.chown(sock, user)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(_as_user([str(bindir / "initdb"), "-D", str(data), "-U", "pcpo", "-A", "trust"]), check=True,
                   capture_output=True)
    opts = f"-p {port} -k {sock} -c listen_addresses=''"
    subprocess.run(_as_user([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-w", "-l", str(root / "log"),
                             "start"]), check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://pcpo@/postgres?host={sock}&port={port}"
    finally:
        subprocess.run(_as_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_the_app_runs_on_postgresql(tmp_path, pg_url):
    from fastapi.testclient import TestClient

    from pcpo_eval.human.app import create_app

    layout = make_human_dir(tmp_path / "HUMAN", n_prompts=4, n_seeds=3, n_checks=2, per_rater=6)
    db.upgrade(pg_url)
    db.upgrade(pg_url)  # idempotent
    assert db.schema_diff(pg_url) == []
    app = create_app(layout.root, pg_url)
    (_, tok_a), (_, tok_b) = db.add_raters(pg_url, ["ann", "bo"])
    client = TestClient(app, follow_redirects=False)
    for _ in range(3):
        key = KEY_RE.search(client.get(f"/r/{tok_a}").text).group(1)
        assert client.post(f"/r/{tok_a}/answer", data={"key": key, "choice": "left"}).status_code == 303
    # a resubmit of the last pair changes nothing
    assert client.post(f"/r/{tok_a}/answer", data={"key": key, "choice": "right"}).status_code == 303
    pid_b = shown_pair(client, tok_b)
    rater_b = db.rater_by_token(pg_url, tok_b)
    with cf.ThreadPoolExecutor(8) as pool:  # 8 simultaneous submits of one pair: one row
        list(pool.map(lambda c: db.submit(pg_url, rater_b.id, pid_b, c), ["tie", "left"] * 4))
    out = db.export_responses(pg_url)
    assert tuple(out.columns) == RESPONSE_COLUMNS and len(out) == 4
    assert (out[out.rater == "ann"].choice == "left").all()
    assert out.groupby(["rater_id", "pair_id"]).size().max() == 1
    prog = db.progress(pg_url, per_rater=6).set_index("rater")
    assert prog.loc["ann", "answered"] == 3 and prog.loc["bo", "answered"] == 1
    db.dispose(pg_url)
