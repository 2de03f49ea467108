"""The rating app in-process (FastAPI TestClient) and its database helpers.

A rater sees the prompt, two images and their progress; answering advances; a resubmit changes
nothing; bad input is an error page and stores nothing; prompts are escaped; raters are isolated;
no page, URL or header a rater sees names a method, a comparison or a kind; ``/img`` refuses path
traversal; the migrations are idempotent and match the models; the export has RESPONSE_COLUMNS.
"""

from __future__ import annotations

import io
import re

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from pcpo_eval.errors import UserError
from pcpo_eval.human import MAX_REASON, RESPONSE_COLUMNS, db
from pcpo_eval.human import app as app_module
from pcpo_eval.human.app import create_app
from tests.support.human import KEY_RE, PROGRESS_RE, leaks, make_human_dir, secret_strings, shown_pair

EVIL = "<script>alert(1)</script> & a cat"


@pytest.fixture
def study(tmp_path):
    """A small study (6 prompts x 3 seeds + 4 checks = 22 pairs, 10 per rater), app and two raters."""
    layout = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10,
                            prompts=[EVIL])
    app = create_app(layout.root)
    url = layout.database_url
    (_, token_a), (_, token_b) = db.add_raters(url, ["alice", "bob"])
    yield layout, TestClient(app, follow_redirects=False), url, token_a, token_b
    db.dispose(url)


def current(client: TestClient, token: str) -> tuple[str, int, int, str]:
    """(design pair_id, k, n, answer key) of the rater's current page (the pair id read server side)."""
    html = client.get(f"/r/{token}").text
    k, n = map(int, PROGRESS_RE.search(html).groups())
    return shown_pair(client, token), k, n, KEY_RE.search(html).group(1)


def rows(url: str) -> pd.DataFrame:
    return db.export_responses(url)


def test_rater_sees_prompt_two_images_and_progress(study):
    layout, client, url, token, _ = study
    r = client.get(f"/r/{token}")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    pair_id = shown_pair(client, token)
    assert pair_id not in r.text and KEY_RE.search(r.text)  # the page carries an answer key, not the pair id
    pair = pd.read_parquet(layout.pairs).set_index("pair_id").loc[pair_id]
    assert "Pair 1 of 10" in r.text and ">Left<" in r.text and ">Right<" in r.text and "Tie" in r.text
    assert f'maxlength="{MAX_REASON}"' in r.text
    srcs = re.findall(r'<img src="(/r/[^/]+/img/[0-9a-f]{32}\.png)"', r.text)
    assert len(srcs) == 2 and all(s.startswith(f"/r/{token}/img/") for s in srcs)
    assert pair.left_image not in r.text and pair.right_image not in r.text  # opaque per (rater, pair, side)
    assert pair.prompt.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in r.text
    lengths = []
    for src, side in zip(srcs, ("left_image", "right_image"), strict=True):
        img = client.get(src)
        assert img.status_code == 200 and img.headers["content-type"] == "image/png"
        assert img.headers["cache-control"] == "no-store"
        assert "last-modified" not in img.headers and "etag" not in img.headers
        assert img.content == layout.image(pair[side]).read_bytes()  # the file as written (uncompressed)
        lengths.append(int(img.headers["content-length"]))
    assert lengths[0] == lengths[1]  # one length for both sides of a pair
    _, _, _, _, token_b = study
    assert client.get(srcs[0].replace(token, token_b)).status_code == 404  # another rater's image URL


def test_answering_advances_to_the_end_and_resumes(study):
    layout, client, url, token, _ = study
    seen = []
    for step in range(1, 11):
        pair_id, k, n, key = current(client, token)
        assert (k, n) == (step, 10) and pair_id not in seen
        seen.append(pair_id)
        r = client.post(f"/r/{token}/answer", data={"key": key, "choice": "left", "reason": ""})
        assert r.status_code == 303 and r.headers["location"] == f"/r/{token}"
        if step == 5:  # a restarted app resumes exactly where the rater left off
            fresh = TestClient(create_app(layout.root), follow_redirects=False)
            assert current(fresh, token)[0] == current(client, token)[0]
    done = client.get(f"/r/{token}")
    assert done.status_code == 200 and "Thank you" in done.text and "10 of 10" in done.text
    assert sorted(rows(url)["pair_id"]) == sorted(seen)
    state = client.app.state.human
    assert seen == db.assignment(list(db.pairs_frame(url)["pair_id"]), state.settings.order_seed, 1, 10, state.kinds)
    assert rows(url)["seconds"].between(0, 60).all()  # seconds from serving the page to the answer


def test_resubmit_keeps_the_first_answer(study):
    _, client, url, token, _ = study
    _, _, _, key = current(client, token)
    for choice, reason in (("left", "sharper"), ("right", "changed my mind"), ("left", "sharper")):
        r = client.post(f"/r/{token}/answer", data={"key": key, "choice": choice, "reason": reason})
        assert r.status_code == 303
    df = rows(url)
    assert len(df) == 1 and (df.choice[0], df.reason[0]) == ("left", "sharper")


def test_bad_input_is_an_error_page_and_stores_nothing(study):
    _, client, url, token_a, token_b = study
    pair_a, _, _, key_a = current(client, token_a)
    _, _, _, key_b = current(client, token_b)
    state = client.app.state.human
    foreign = next(p for p in db.pairs_frame(url)["pair_id"] if p not in state.assignment(1))
    cases = [
        ({"key": key_a, "choice": "both"}, 422, "Choose Left, Right or Tie"),
        ({"key": key_a}, 422, "Choose Left, Right or Tie"),
        ({"key": key_b, "choice": "left"}, 400, "not for the pair"),  # bob's page
        ({"key": state.answer_key(1, foreign), "choice": "left"}, 400, "not for the pair"),
        ({"key": pair_a, "choice": "left"}, 400, "not for the pair"),  # the design pair id is no key
        ({"pair_id": pair_a, "choice": "left"}, 400, "not for the pair"),
        ({"key": "0" * 16, "choice": "left"}, 400, "not for the pair"),
        ({"key": "../../design.json", "choice": "left"}, 400, "not for the pair"),
        ({"choice": "left"}, 400, "not for the pair"),
        ({"key": key_a, "choice": "left", "reason": "x" * (MAX_REASON + 1)}, 422, "too long"),
    ]
    for data, status, message in cases:
        r = client.post(f"/r/{token_a}/answer", data=data)
        assert r.status_code == status and message in r.text, data
        assert "Traceback" not in r.text and r.headers["x-content-type-options"] == "nosniff"
    assert client.post("/r/not-a-token/answer", data={"key": key_a, "choice": "left"}).status_code == 404
    assert len(rows(url)) == 0
    # control characters are stripped; a reason of exactly MAX_REASON characters is accepted
    ok = client.post(f"/r/{token_a}/answer",
                     data={"key": key_a, "choice": "tie", "reason": " ok\x00\x1b[1m\u202e\r\nfine\x7f "})
    assert ok.status_code == 303 and rows(url).reason.tolist() == ["ok[1m\nfine"]
    ok = client.post(f"/r/{token_b}/answer", data={"key": key_b, "choice": "tie", "reason": "y" * MAX_REASON})
    assert ok.status_code == 303 and len(rows(url)) == 2


def test_prompt_with_script_is_escaped(tmp_path):
    layout = make_human_dir(tmp_path / "H", n_prompts=2, n_seeds=1, n_checks=0, prompts=[EVIL])
    client = TestClient(create_app(layout.root))
    url = layout.database_url
    ((_, token),) = db.add_raters(url, ["carol"])
    texts = []
    for _ in range(2):
        html = client.get(f"/r/{token}").text
        texts.append(html)
        client.post(f"/r/{token}/answer", data={"key": KEY_RE.search(html).group(1), "choice": "left"})
    joined = "".join(texts)
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; a cat" in joined
    assert "<script>" not in joined
    db.dispose(url)


def test_raters_are_isolated(tmp_path):
    layout = make_human_dir(tmp_path / "H", n_prompts=3, n_seeds=2, n_checks=0, per_rater=None)
    client = TestClient(create_app(layout.root), follow_redirects=False)
    url = layout.database_url
    (_, token_a), (_, token_b) = db.add_raters(url, ["alice", "bob"])
    answered_a = {}
    for i in range(3):
        pair_id, _, _, key = current(client, token_a)
        client.post(f"/r/{token_a}/answer", data={"key": key, "choice": "left", "reason": f"alice-secret-{i}"})
        answered_a[pair_id] = "left"
    before = rows(url)
    pages = []
    for _ in range(6):  # B rates every pair (including A's) with the opposite choice
        r = client.get(f"/r/{token_b}")
        pages.append(r.text)
        client.post(f"/r/{token_b}/answer", data={"key": KEY_RE.search(r.text).group(1), "choice": "right",
                                                  "reason": "bob"})
    pages.append(client.get(f"/r/{token_b}").text)
    assert "Pair 1 of 6" in pages[0] and "Thank you" in pages[-1]
    assert not any("alice" in p for p in pages)
    df = rows(url)
    after_a = df[df.rater == "alice"].reset_index(drop=True)
    pd.testing.assert_frame_equal(after_a, before.reset_index(drop=True))
    assert (df[df.rater == "bob"].choice == "right").all() and len(df) == 9
    assert current(client, token_a)[1] == 4  # A's progress is A's own


def _visit_all(client: TestClient, token: str, secrets_: list[str]) -> list[str]:
    """Walk every page a rater can reach; returns the leaks found in bodies, URLs and headers."""
    found: list[str] = []

    def check(r) -> None:
        body = r.text if not r.headers.get("content-type", "").startswith("image/") else ""
        found.extend(leaks(" ".join([str(r.url), str(r.headers), body]), secrets_))

    for path in ("/", "/static/style.css", "/nope", "/r/unknown-token", "/img/zz.png", "/img/" + "a" * 16 + ".png"):
        check(client.get(path))
    while True:
        page = client.get(f"/r/{token}")
        check(page)
        m = KEY_RE.search(page.text)
        if not m:
            break
        for src in re.findall(r'src="([^"]+)"', page.text) + re.findall(r'href="([^"]+)"', page.text):
            check(client.get(src))
        check(client.post(f"/r/{token}/answer", data={"key": m.group(1), "choice": "bad"}))
        check(client.post(f"/r/{token}/answer", data={"key": "f" * 16, "choice": "left"}))
        check(client.post(f"/r/{token}/answer", data={"key": m.group(1), "choice": "tie", "reason": "x"}))
    return found


def test_nothing_a_rater_sees_names_a_method_comparison_or_kind(study):
    layout, client, url, token, _ = study
    secrets_ = secret_strings(layout)
    assert {"pcpo@120", "ddpo", "pcpo@120 vs ddpo@180", "identical", "degraded", "main"} <= set(secrets_)
    assert leaks("x pcpo@120 vs ddpo@180 y <main>", secrets_)  # the probe works
    assert _visit_all(client, token, secrets_) == []
    assert len(rows(url)) == 10
    with db.get_engine(url).connect() as conn:  # and the database holds none of them either
        dump = "\n".join(str(r) for t in ("pairs", "raters", "responses")
                         for r in conn.exec_driver_sql(f"SELECT * FROM {t}").all())
    assert leaks(dump, [s for s in secrets_ if s != "main"]) == []


def test_images_refuse_path_traversal(study):
    layout, client, url, token, _ = study
    stray = "deadbeefdeadbeef"
    layout.image(stray).write_bytes(layout.image(db.pairs_frame(url).left_image[0]).read_bytes())
    (layout.root / "secret.png").write_bytes(b"\x89PNG secret")
    for path in ("/img/../design.json", "/img/..%2fdesign.json", "/img/%2e%2e%2fsecret.png",
                 "/img/..%2F..%2Fsecret.png", f"/img/{stray}.png", f"/img/{stray.upper()}.png",
                 "/img/" + "a" * 15 + ".png", "/img/" + "a" * 65 + ".png", "/static/../design.json",
                 "/static/%2e%2e/app.py", "/img/images.png", "/design.json", "/pairs.parquet", "/human.db"):
        r = client.get(path)
        assert r.status_code == 404, path
        assert b"rng_seed" not in r.content and b"secret" not in r.content, path
        assert r.headers["x-content-type-options"] == "nosniff", path


def test_unknown_token_and_security_headers(study, monkeypatch):
    _, client, url, token, _ = study
    r = client.get("/r/" + "x" * 32)
    assert r.status_code == 404 and "ask the study organiser" in r.text.lower()
    home = client.get("/")
    assert home.status_code == 200 and "study organiser" in home.text
    for path in ("/", f"/r/{token}", "/static/style.css", "/missing", "/docs", "/openapi.json"):
        r = client.get(path)
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "default-src 'self'" in r.headers["content-security-policy"]
        assert "server" not in r.headers
    assert client.get("/docs").status_code == 404 and client.get("/openapi.json").status_code == 404

    def boom(*_args, **_kwargs):
        raise RuntimeError("internal detail db password")

    monkeypatch.setattr(app_module.db, "rater_state", boom)
    r = client.get(f"/r/{token}")
    assert r.status_code == 500 and "Traceback" not in r.text and "internal detail" not in r.text
    assert r.headers["content-security-policy"]
    big = client.post(f"/r/{token}/answer", content=b"a" * (70 * 1024),
                      headers={"content-type": "application/x-www-form-urlencoded"})
    assert big.status_code == 413


def test_migrations_are_idempotent_and_match_the_models(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    db.upgrade(url)
    db.add_raters(url, ["dave"])
    with db.get_engine(url).connect() as conn:
        schema = conn.exec_driver_sql("SELECT name, sql FROM sqlite_master ORDER BY name").all()
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
    db.upgrade(url)
    with db.get_engine(url).connect() as conn:
        assert conn.exec_driver_sql("SELECT name, sql FROM sqlite_master ORDER BY name").all() == schema
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").all() == version == [("0004",)]
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10000
    assert db.schema_diff(url) == []
    assert "CONSTRAINT ck_responses_choice CHECK" in dict(schema)["responses"]
    assert [n for n, _ in db.rater_links(url, "http://h:1")] == ["dave"]
    db.dispose(url)


def test_migration_renders_for_postgresql():
    """The same migration as PostgreSQL DDL (offline: no server or driver needed)."""
    from alembic import command

    cfg = db.alembic_config("postgresql+psycopg://rater@localhost/human")
    cfg.output_buffer = io.StringIO()
    command.upgrade(cfg, "head", sql=True)
    sql = cfg.output_buffer.getvalue()
    assert "CREATE TABLE responses" in sql and "TIMESTAMP WITH TIME ZONE" in sql
    assert "CONSTRAINT uq_responses_rater_id_pair_id UNIQUE (rater_id, pair_id)" in sql
    assert "CONSTRAINT ck_responses_choice CHECK" in sql and "PRAGMA" not in sql
    assert "ALTER TABLE responses ADD COLUMN seconds FLOAT" in sql  # migration 0003
    assert "CREATE TABLE revocations" in sql and "INSERT INTO revocations" in sql  # migration 0004


def test_db_helpers_refuse_bad_input_and_export(study, tmp_path):
    layout, client, url, token_a, token_b = study
    with pytest.raises(UserError, match="alice already exist"):
        db.add_raters(url, ["alice"])
    with pytest.raises(UserError, match="given twice"):
        db.add_raters(url, ["eve", "eve"])
    with pytest.raises(UserError, match="invalid"):
        db.add_raters(url, [" "])
    pairs = pd.read_parquet(layout.pairs)
    assert db.load_pairs(url, pairs) == len(pairs)  # idempotent
    with pytest.raises(UserError, match="different pair set"):
        db.load_pairs(url, pairs.iloc[:-1])
    with pytest.raises(UserError, match="lacks column"):
        db.load_pairs(url, pairs.drop(columns=["prompt"]))
    links = db.rater_links(url, "http://example.org:8000/")
    assert links == [("alice", f"http://example.org:8000/r/{token_a}"), ("bob", f"http://example.org:8000/r/{token_b}")]
    pair_id, _, _, key = current(client, token_a)
    client.post(f"/r/{token_a}/answer", data={"key": key, "choice": "right", "reason": "why"})
    df = db.export_responses(url)
    assert tuple(df.columns) == RESPONSE_COLUMNS and len(df) == 1
    assert df.iloc[0][["rater", "rater_id", "pair_id", "choice", "reason"]].tolist() == [
        "alice", 1, pair_id, "right", "why"]
    assert pd.Timestamp(df.submitted_at[0]).tzinfo is not None
    back = pd.read_parquet(db.export_parquet(url, layout.responses) is not None and layout.responses)
    pd.testing.assert_frame_equal(back, df)
    prog = db.progress(url, per_rater=10)
    assert prog[["rater", "answered", "total"]].values.tolist() == [["alice", 1, 10], ["bob", 0, 10]]
    assert db.progress(url)["total"].tolist() == [len(pairs)] * 2
    with pytest.raises(UserError, match="does not exist"):
        db.upgrade(f"sqlite:///{tmp_path / 'no' / 'such' / 'h.db'}")


def test_missing_or_bad_design_is_a_user_error(tmp_path):
    layout = make_human_dir(tmp_path / "H", n_prompts=2, n_seeds=1, n_checks=0)
    design = layout.design.read_text()
    for text, message in (("{}", "integer rng_seed"), ('{"rng_seed": 1, "per_rater": 0}', "per_rater"),
                          ("[1]", "JSON object"), ("{", "unreadable")):
        layout.design.write_text(text)
        with pytest.raises(UserError, match=message):
            create_app(layout.root)
    layout.design.unlink()
    with pytest.raises(UserError, match="design.json is missing"):
        create_app(layout.root)
    layout.design.write_text(design)
    layout.pairs.unlink()
    with pytest.raises(UserError, match="pairs.parquet is missing"):
        create_app(layout.root)


def test_concurrent_submits_of_one_pair_store_one_answer(study):
    """16 threads racing to answer the same pair: one row, and every caller is told that row."""
    from concurrent.futures import ThreadPoolExecutor

    _, client, url, token, _ = study
    pair_id, _, _, _ = current(client, token)
    choices = ["left", "right", "tie"] * 6
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda c: db.submit(url, 1, pair_id, c, c), choices))
    df = rows(url)
    assert len(df) == 1 and sum(r.created for r in results) == 1
    assert {(r.choice, r.reason) for r in results} == {(df.choice[0], df.reason[0])}
