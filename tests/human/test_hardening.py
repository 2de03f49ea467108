"""The rating app's hardening and the organiser's controls (FastAPI TestClient, and the CLI).

Undo of the last answer (a correction; the first answer is kept), revoking and rotating links,
the body limit on the bytes read (chunked bodies too), the Origin/Referer check on posts, HEAD,
``--root-path``, one redacted log line and a retry page when the database fails mid-run, a
database that is read-only or not reachable refused at start, and every database failure of a
``human`` command as one ``error:`` line with exit code 2.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3

import pandas as pd
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from pcpo_eval.errors import UserError
from pcpo_eval.human import RESPONSE_COLUMNS, db
from pcpo_eval.human import app as app_module
from pcpo_eval.human.app import MAX_BODY, create_app
from tests.support.human import KEY_RE, PROGRESS_RE, UNDO_RE, free_port, make_human_dir, shown_pair


@pytest.fixture
def study(tmp_path):
    layout = make_human_dir(tmp_path / "HUMAN", n_prompts=4, n_seeds=3, n_checks=2, per_rater=6)
    app = create_app(layout.root)
    url = layout.database_url
    (_, token_a), (_, token_b) = db.add_raters(url, ["alice", "bob"])
    yield layout, TestClient(app, follow_redirects=False), url, token_a, token_b
    db.dispose(url)


#: The answer key last served for each design pair (pages carry keys, not pair ids).
_KEYS: dict[str, str] = {}


def page(client: TestClient, token: str) -> tuple[str | None, int | None, str]:
    """(design pair id, k, html) of the rater's current page (None, None, html on the thank-you page);
    the pair id is read server side and its page's answer key remembered for :func:`answer`."""
    html = client.get(f"/r/{token}").text
    m, p = KEY_RE.search(html), PROGRESS_RE.search(html)
    pid = shown_pair(client, token) if m else None
    if m:
        _KEYS[pid] = m.group(1)
    return pid, (int(p.group(1)) if p else None), html


def answer(client: TestClient, token: str, pair_id: str, choice: str, **headers: str):
    """Post ``choice`` with the answer key of the page last served for ``pair_id``."""
    return client.post(f"/r/{token}/answer", data={"key": _KEYS.get(pair_id, ""), "choice": choice,
                                                   "reason": choice}, headers=headers)


def _rater_id(client: TestClient, token: str) -> int:
    return db.rater_by_token(client.app.state.human.url, token).id


def undo_target(client: TestClient, token: str, html: str) -> str | None:
    """The design pair the page's undo button withdraws (None: no undo button)."""
    m = re.search(r'<form method="post" action="[^"]*/undo" id="undo"[^>]*>\s*<input type="hidden" '
                  r'name="undo_key" value="([0-9a-f]+)"', html)
    return client.app.state.human.undo_pair(_rater_id(client, token), m.group(1)) if m else None


def undo(client: TestClient, token: str, pair_id: str, **headers: str):
    """Post the undo of ``pair_id`` with the key its undo button would carry."""
    key = client.app.state.human.undo_key(_rater_id(client, token), pair_id)
    return client.post(f"/r/{token}/undo", data={"undo_key": key}, headers=headers)


def test_undo_reasks_the_last_pair_and_keeps_the_first_answer(study):
    layout, client, url, token, _ = study
    first, k, html = page(client, token)
    assert k == 1 and undo_target(client, token, html) is None  # nothing to undo yet
    assert html.index('id="reason"') < html.index('id="choose-left"')  # the reason comes before the buttons
    assert answer(client, token, first, "left").status_code == 303
    second, k, html = page(client, token)
    assert k == 2 and undo_target(client, token, html) == first
    assert first not in html and UNDO_RE.search(html)  # the undo button names no design pair id
    r = undo(client, token, first)
    assert r.status_code == 303 and r.headers["location"] == f"/r/{token}"
    again, k, html = page(client, token)
    assert (again, k) == (first, 1) and undo_target(client, token, html) is None  # one step back at a time
    assert undo(client, token, first).status_code == 303  # a second click: no-op
    assert db.export_responses(url).empty  # withdrawn, not yet answered again
    assert answer(client, token, first, "right").status_code == 303
    assert answer(client, token, first, "tie").status_code == 303  # a resubmit changes nothing again
    df = db.export_responses(url)
    assert tuple(df.columns) == RESPONSE_COLUMNS
    assert df[["pair_id", "choice", "first_choice", "corrections"]].values.tolist() == [[first, "right", "left", 2]]
    with db.get_engine(url).connect() as conn:  # the first answer itself is never changed
        assert conn.exec_driver_sql("SELECT choice FROM responses").all() == [("left",)]
        assert conn.exec_driver_sql("SELECT seq, choice FROM corrections ORDER BY seq").all() == [(1, None),
                                                                                                   (2, "right")]
    # only the last answer can be undone; an older one or a foreign pair is refused or ignored
    assert answer(client, token, second, "left").status_code == 303
    undo(client, token, first)
    assert page(client, token)[1] == 3
    assert client.post(f"/r/{token}/undo", data={"undo_key": "0" * 32}).status_code == 400
    assert client.post(f"/r/{token}/undo", data={"undo_pair_id": first}).status_code == 400
    assert db.progress(url, 6)["answered"].tolist() == [2, 0]


def test_undo_on_the_thank_you_page(study):
    _, client, url, token, _ = study
    for _ in range(6):
        pid, _, _ = page(client, token)
        answer(client, token, pid, "left")
    pid_none, _, html = page(client, token)
    assert pid_none is None and "Thank you" in html and undo_target(client, token, html) == pid
    undo(client, token, pid)
    assert page(client, token)[:2] == (pid, 6)


def test_revoke_and_rotate_links(study, cli):
    layout, client, url, token_a, token_b = study
    pid, _, _ = page(client, token_a)
    answer(client, token_a, pid, "left")
    res = cli("human", "raters", layout.root, "--revoke", "alice", "--rotate", "bob", "--base-url",
              "https://rate.example.org/s", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["rater"]: r for r in json.loads(res.stdout)}
    assert rows["alice"]["link"] == "revoked" and rows["alice"]["revoked"] and rows["alice"]["answered"] == 1
    new_b = rows["bob"]["link"].removeprefix("https://rate.example.org/s/r/")
    assert new_b != token_b and len(new_b) == len(token_b)
    for old in (token_a, token_b):
        assert client.get(f"/r/{old}").status_code == 404
        assert answer(client, old, pid, "right").status_code == 404
    assert client.get(f"/r/{new_b}").status_code == 200
    assert db.export_responses(url)["choice"].tolist() == ["left"]  # alice's answer is kept
    res = cli("human", "raters", layout.root, "--rotate", "alice", "--json")  # the address is remembered
    alice = next(r for r in json.loads(res.stdout) if r["rater"] == "alice")
    assert alice["link"].startswith("https://rate.example.org/s/r/") and not alice["revoked"]
    assert page(client, alice["link"].rsplit("/", 1)[1])[1] == 2  # reinstated, resumes
    res = cli("human", "raters", layout.root, "--revoke", "carol")
    assert res.returncode == 2 and res.stderr.startswith("error: no rater named 'carol'")
    # one bad name refuses the whole call: nothing of it is applied (frank was added, bob revoked, before)
    before = cli("human", "raters", layout.root, "--json").stdout
    for args in (("--add", "frank", "--revoke", "nobody"), ("--revoke", "bob", "--revoke", "typo"),
                 ("--add", "dave", "--revoke", "dave", "--rotate", "dave"), ("--add", "bob")):
        res = cli("human", "raters", layout.root, *args)
        assert res.returncode == 2 and "nothing was changed" in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
    assert cli("human", "raters", layout.root, "--json").stdout == before
    res = cli("human", "raters", layout.root, "--revoke", "bob", "--rotate", "bob")
    assert res.returncode == 2 and "given to both --revoke and --rotate" in res.stderr


def test_export_records_revocation_and_analyze_drops_answers_after_it(study):
    """The export says whose link is revoked and since when; ``human analyze`` drops an answer stored at
    or after that time (a submit that was in flight when the link was revoked: stored here through
    :func:`db.submit`, past the app's token check) and keeps the earlier ones, unless
    ``exclude_revoked``, which drops every answer of a revoked rater. A rotate reinstates the rater and
    keeps the record of the revocation."""
    import time

    from pcpo_eval.human.analysis import analyze

    layout, client, url, token_a, token_b = study
    pid_a, _, _ = page(client, token_a)
    assert answer(client, token_a, pid_a, "left").status_code == 303
    pid_b, _, _ = page(client, token_b)
    assert answer(client, token_b, pid_b, "right").status_code == 303
    alice = _rater_id(client, token_a)
    time.sleep(0.01)
    db.revoke(url, "alice")
    pairs = pd.read_parquet(layout.pairs)
    late = next(p for p in pairs.pair_id if p not in (pid_a, pid_b))
    db.submit(url, alice, late, "right")  # in flight when the link was revoked
    df = db.export_responses(url)
    assert tuple(df.columns) == RESPONSE_COLUMNS
    rows = df.set_index("pair_id")
    assert rows.loc[pid_a, "revoked"] and rows.loc[late, "revoked"] and not rows.loc[pid_b, "revoked"]
    assert rows.loc[pid_b, "revoked_at"] == "" and rows.loc[pid_a, "revoked_at"] == rows.loc[late, "revoked_at"]
    at = pd.Timestamp(rows.loc[pid_a, "revoked_at"])
    assert at.tzinfo is not None and pd.Timestamp(rows.loc[pid_a, "submitted_at"]) < at
    assert pd.Timestamp(rows.loc[late, "submitted_at"]) >= at

    res = analyze(pairs, df, bootstrap=0)
    assert res["counts"]["responses"] == 3 and res["counts"]["responses_dropped_revoked"] == 1
    assert res["counts"]["raters_revoked"] == 1 and res["counts"]["responses_used"] == 2
    (r,) = res["revoked"]["raters"]
    assert (r["rater"], r["answers"], r["after_revocation"], r["dropped"]) == ("alice", 2, 1, 1)
    res = analyze(pairs, df, bootstrap=0, exclude_revoked=True)
    assert res["counts"]["responses_dropped_revoked"] == 2 and res["counts"]["responses_used"] == 1
    assert res["settings"]["exclude_revoked"] and res["revoked"]["raters"][0]["dropped"] == 2
    assert [c["rater"] for c in res["attention_checks"]["raters"]] == ["bob"]
    # an export made before the column: nothing is known about revocation, nothing dropped
    old = analyze(pairs, df.drop(columns=["revoked", "revoked_at"]), bootstrap=0)
    assert not old["revoked"]["recorded"] and old["counts"]["responses_used"] == 3

    # a rotate reinstates alice with a new link, but keeps the record: the answer stored while her link
    # was revoked is still marked and dropped (before, the rotate cleared revoked_at and it was kept)
    time.sleep(0.01)
    db.rotate(url, "alice")
    assert not db.progress(url).set_index("rater").loc["alice", "revoked"]  # the link works again
    after = next(p for p in pairs.pair_id if p not in (pid_a, pid_b, late))
    db.submit(url, alice, after, "left")  # on the new link
    df = db.export_responses(url)
    rows = df.set_index("pair_id")
    assert rows.loc[pid_a, "revoked_at"] == rows.loc[late, "revoked_at"] == str(at.isoformat())
    assert rows.loc[late, "revoked"] and rows.loc[after, "revoked_at"] == "" and not rows.loc[after, "revoked"]
    res = analyze(pairs, df, bootstrap=0)
    assert res["counts"]["responses_dropped_revoked"] == 1 and res["counts"]["responses_used"] == 3
    (r,) = res["revoked"]["raters"]
    assert (r["rater"], r["answers"], r["after_revocation"], r["dropped"]) == ("alice", 2, 1, 1)
    res = analyze(pairs, df, bootstrap=0, exclude_revoked=True)  # the answers on the revoked link, not the new
    assert res["counts"]["responses_dropped_revoked"] == 2 and res["counts"]["responses_used"] == 2
    # revoked again: a second revocation on record, the answer on the second link is marked with it;
    # revoking twice keeps the first time
    time.sleep(0.01)
    db.revoke(url, "alice")
    first = db.export_responses(url).set_index("pair_id").loc[after, "revoked_at"]
    time.sleep(0.01)
    db.revoke(url, "alice")
    rows = db.export_responses(url).set_index("pair_id")
    assert rows.loc[after, "revoked_at"] == first and pd.Timestamp(first) > at
    assert rows.loc[late, "revoked_at"] == str(at.isoformat())


def test_raters_needs_an_address(tmp_path, cli):
    layout = make_human_dir(tmp_path / "H", n_prompts=2, n_seeds=1, n_checks=0)
    res = cli("human", "raters", layout.root, "--add", "ann")
    assert res.returncode == 2 and "--base-url" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert db.progress(layout.database_url).empty  # nobody was added
    res = cli("human", "raters", layout.root, "--add", "ann", "--base-url", "rate.example.org")
    assert res.returncode == 2 and "--base-url 'rate.example.org'" in res.stderr
    res = cli("human", "raters", layout.root, "--add", "ann", "--base-url", "http://10.0.0.5:8000/")
    assert res.returncode == 0 and "ann: http://10.0.0.5:8000/r/" in res.stdout
    # a refused command (ann exists) keeps the remembered address: nothing is written before the work succeeds
    res = cli("human", "raters", layout.root, "--add", "ann", "--base-url", "https://other.example.org")
    assert res.returncode == 2 and res.stderr.startswith("error: ")
    assert json.loads(layout.server.read_text()) == {"base_url": "http://10.0.0.5:8000"}
    db.dispose(layout.database_url)


def test_body_limit_holds_without_content_length(study):
    _, client, url, token, _ = study
    pid, _, _ = page(client, token)
    form = f"key={_KEYS[pid]}&choice=left&reason=".encode()

    def chunks(total: int):
        yield form
        for _ in range(total // 8192):
            yield b"x" * 8192

    for total in (200 * 1024, 1024 * 1024):
        r = client.post(f"/r/{token}/answer", content=chunks(total),
                        headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 413, total
        assert r.request.headers.get("transfer-encoding") == "chunked"
        assert "content-length" not in r.request.headers
    big = client.post(f"/r/{token}/answer", content=form + b"x" * MAX_BODY,
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert big.status_code == 413
    assert db.export_responses(url).empty
    assert answer(client, token, pid, "left").status_code == 303  # a normal answer still goes through


def test_cross_origin_posts_are_refused(study):
    _, client, url, token, _ = study
    pid, _, _ = page(client, token)
    for headers in ({"origin": "https://evil.example"}, {"origin": "null"},
                    {"referer": "https://evil.example/page"}, {"origin": "http://testserver.evil.example"}):
        r = answer(client, token, pid, "left", **headers)
        assert r.status_code == 403 and "another site" in r.text, headers
        assert undo(client, token, pid, **headers).status_code == 403
    assert db.export_responses(url).empty
    assert answer(client, token, pid, "left", origin="http://testserver").status_code == 303
    pid2, _, _ = page(client, token)
    assert answer(client, token, pid2, "tie", referer=f"http://testserver/r/{token}").status_code == 303
    assert len(db.export_responses(url)) == 2
    html = client.get(f"/r/{token}")
    assert html.headers["referrer-policy"] == "same-origin" and 'content="same-origin"' in html.text


def test_the_remembered_public_address_is_accepted(tmp_path, cli):
    """`human raters --base-url` remembers the public address; `serve` without --base-url accepts answers from it
    (behind a proxy forwarding its own Host, every answer was refused) and still refuses other sites."""
    layout = make_human_dir(tmp_path / "H", n_prompts=2, n_seeds=2, n_checks=0)
    res = cli("human", "raters", layout.root, "--add", "ann", "--base-url", "https://rate.example.org/study")
    assert res.returncode == 0, res.stderr
    token = res.stdout.split("/r/", 1)[1].split()[0]
    client = TestClient(create_app(layout.root), follow_redirects=False)
    pid, _, _ = page(client, token)
    assert answer(client, token, pid, "left", origin="https://evil.example").status_code == 403
    assert answer(client, token, pid, "left", origin="https://rate.example.org").status_code == 303
    assert len(db.export_responses(layout.database_url)) == 1
    db.dispose(layout.database_url)


def test_head_and_root_path(tmp_path):
    layout = make_human_dir(tmp_path / "H", n_prompts=2, n_seeds=2, n_checks=0)
    client = TestClient(create_app(layout.root, root_path="/rate/"), follow_redirects=False)
    ((_, token),) = db.add_raters(layout.database_url, ["ann"])
    for prefix in ("/rate", ""):  # the proxy may or may not strip the prefix
        assert client.head(f"{prefix}/").status_code == 200
        r = client.get(f"{prefix}/r/{token}")
        assert r.status_code == 200 and client.head(f"{prefix}/r/{token}").status_code == 200
        links = re.findall(r'(?:src|href|action)="([^"]+)"', r.text)
        assert links and all(u.startswith("/rate/") for u in links), links
        img = next(u for u in links if "/img/" in u)
        assert client.get(img).status_code == 200 and client.head(img).status_code == 200
        assert client.get(f"{prefix}/static/style.css").status_code == 200
    posted = client.post(f"/rate/r/{token}/answer", data={"key": KEY_RE.search(r.text).group(1), "choice": "left"})
    assert posted.status_code == 303 and posted.headers["location"] == f"/rate/r/{token}"
    with pytest.raises(UserError, match="--root-path"):
        create_app(layout.root, root_path="rate here")
    db.dispose(layout.database_url)


def test_database_failure_mid_run_is_a_retry_page_and_one_redacted_line(study, monkeypatch, caplog):
    _, client, url, token, _ = study
    pid, _, _ = page(client, token)

    def down(*_args, **_kwargs):
        raise OperationalError("INSERT INTO responses ...", {"token": token}, sqlite3.OperationalError(
            f"unable to open database file while serving /r/{token}"))

    monkeypatch.setattr(app_module.db, "submit", down)
    with caplog.at_level(logging.ERROR, logger="pcpo_eval.human.app"):
        r = answer(client, token, pid, "left")
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert "try again" in r.text.lower() and f'href="/r/{token}"' in r.text and "Traceback" not in r.text
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0] and token not in lines[0] and "OperationalError" in lines[0]
    monkeypatch.setattr(app_module.db, "rater_state", down)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="pcpo_eval.human.app"):
        assert client.get(f"/r/{token}").status_code == 503
    assert caplog.records and all(token not in rec.getMessage() for rec in caplog.records)
    monkeypatch.undo()
    assert page(client, token)[0] == pid  # nothing was stored: the same pair is asked again
    assert db.export_responses(url).empty


def test_unexpected_error_log_hides_the_token(study, monkeypatch, caplog):
    _, client, _, token, _ = study

    def boom(*_args, **_kwargs):
        raise RuntimeError(f"lookup of {token} failed")

    monkeypatch.setattr(app_module.db, "rater_state", boom)
    with caplog.at_level(logging.ERROR, logger="pcpo_eval.human.app"):
        assert client.get(f"/r/{token}").status_code == 500
    assert len(caplog.records) == 1 and token not in caplog.records[0].getMessage()
    assert caplog.records[0].exc_info is None  # one line, no traceback


def _read_only_url(layout) -> str:
    return f"sqlite:///file:{layout.database}?mode=ro&uri=true"


def test_read_only_database_is_refused_at_start(tmp_path):
    layout = make_human_dir(tmp_path / "H", n_prompts=2, n_seeds=1, n_checks=0)
    create_app(layout.root)  # migrated, pairs loaded
    db.dispose(layout.database_url)
    with pytest.raises(UserError, match="read-only"):
        create_app(layout.root, database_url=_read_only_url(layout))
    db.dispose(_read_only_url(layout))


@pytest.mark.parametrize("case", ["read-only", "not sqlite", "unreachable postgres", "missing driver",
                                  "no such folder"])
@pytest.mark.parametrize("command", ["raters", "export", "analyze", "serve"])
def test_database_failures_are_one_line_through_the_cli(tmp_path, cli, case, command):
    layout = make_human_dir(tmp_path / "H", n_prompts=2, n_seeds=1, n_checks=0)
    extra: list[str] = []
    if case == "read-only":
        create_app(layout.root)
        db.dispose(layout.database_url)
        extra = ["--database-url", _read_only_url(layout)]
    elif case == "not sqlite":
        layout.database.write_bytes(b"this is not a database, it is a text file " * 50)
    elif case == "unreachable postgres":
        extra = ["--database-url", "postgresql+psycopg://rater:secret-pw@127.0.0.1:9/human"]
    elif case == "missing driver":
        extra = ["--database-url", "postgresql+pg8000://rater@127.0.0.1:9/human"]
    else:
        extra = ["--database-url", f"sqlite:///{tmp_path}/no/such/h.db"]
    args = {"raters": ["--base-url", "http://h:1", "--add", "ann"], "export": [], "analyze": [],
            "serve": ["--port", str(free_port())]}[command]
    before = {p: p.read_bytes() for p in layout.root.rglob("*") if p.is_file()}
    res = cli("human", command, layout.root, *args, *extra)
    lines = res.stderr.strip().splitlines()
    if case == "read-only" and command in ("export", "analyze"):  # reading a read-only database is fine
        assert res.returncode == 0 if command == "export" else "no responses" in res.stderr, res
    else:
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), (case, res)
        assert any(w in lines[0] for w in ("database", "driver", "does not exist")), lines[0]
    assert "secret-pw" not in res.stderr and "Traceback" not in res.stderr
    after = {p: p.read_bytes() for p in before if p.exists()}
    assert after == before  # nothing lost or changed
    db.dispose(layout.database_url)


def test_export_has_the_standing_answers(study):
    _, client, url, token, _ = study
    pid, _, _ = page(client, token)
    answer(client, token, pid, "left")
    df = db.export_responses(url)
    assert df[["first_choice", "corrections"]].values.tolist() == [["left", 0]]
    pd.testing.assert_frame_equal(df, df[list(RESPONSE_COLUMNS)])


def test_migration_0004_keeps_a_revocation_made_before_it(tmp_path):
    """A database revoked under migration 0003 (``raters.revoked_at`` only) gets that revocation into
    ``revocations``, so a rotate after the upgrade no longer erases it."""
    from datetime import UTC, datetime

    from alembic import command

    url = f"sqlite:///{tmp_path / 'h.db'}"
    command.upgrade(db.alembic_config(url), "0003")
    at = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    with db.get_engine(url).begin() as conn:
        conn.execute(db.Rater.__table__.insert().values(name="ann", token="t" * 32, created_at=at, revoked_at=at))
    db.upgrade(url)
    with db.get_engine(url).connect() as conn:
        rows = conn.execute(db.Revocation.__table__.select()).all()
    assert [(r.rater_id, r.reinstated_at) for r in rows] == [(1, None)]
    db.rotate(url, "ann")
    with db.get_engine(url).connect() as conn:
        (row,) = conn.execute(db.Revocation.__table__.select()).all()
    assert row.reinstated_at is not None and row.revoked_at.replace(tzinfo=UTC) == at
    db.dispose(url)


def test_analyze_on_another_designs_database_names_it(tmp_path, cli):
    """`human analyze B --database-url <A's database>` said "no responses to analyze"; the other human
    commands say the database holds a different pair set."""
    a = make_human_dir(tmp_path / "A", n_prompts=2, n_seeds=1, n_checks=0, rng_seed=1)
    b = make_human_dir(tmp_path / "B", n_prompts=2, n_seeds=1, n_checks=0, rng_seed=2)
    db.upgrade(a.database_url)
    db.load_pairs(a.database_url, pd.read_parquet(a.pairs))
    res = cli("human", "analyze", b.root, "--database-url", a.database_url)
    assert res.returncode == 2 and "already holds a different pair set" in res.stderr, res.stderr
