"""A closed study stays closed for raters, and the human commands lose no answers (a red-team review).

Found: after ``human analyze --final`` (whose report labels the shown images by checkpoint) the app kept
serving and ``human raters --add`` kept adding raters: a rater added then was shown 4 of 12 pairs whose images
the shared report labelled. ``human export`` on a folder without its database wrote 0 rows over a good
``responses.parquet``; ``-o human.db-wal`` was accepted (every answer a crashed server had not checkpointed
was lost); ``human design --out`` into a serving bundle put the unblinding beside the raters' answers."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from pcpo_eval.errors import UserError
from pcpo_eval.human import HumanLayout, db
from pcpo_eval.human.app import create_app
from pcpo_eval.human.bundle import make_bundle
from pcpo_eval.human.report import analyze_folder
from tests.support.human import KEY_RE, make_human_dir

IMG_RE = r'<img src="(/r/[^/]+/img/[0-9a-f]{32}\.png)"'


def _answer(client: TestClient, token: str, n: int) -> None:
    for _ in range(n):
        key = KEY_RE.search(client.get(f"/r/{token}").text).group(1)
        assert client.post(f"/r/{token}/answer", data={"key": key, "choice": "left"}).status_code == 303


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_final_analysis_closes_the_app_and_the_rater_commands(tmp_path, cli):
    import re

    lay = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    client = TestClient(create_app(lay.root), follow_redirects=False)
    (_, alice), (_, bob) = db.add_raters(lay.database_url, ["alice", "bob"])
    _answer(client, alice, 10)
    _answer(client, bob, 3)
    page = client.get(f"/r/{bob}")
    img = re.findall(IMG_RE, page.text)[0]
    key = KEY_RE.search(page.text).group(1)
    assert client.get(img).status_code == 200  # open: served
    lines: list[str] = []
    analyze_folder(lay.root, bootstrap=0, log=lines.append, final=True)
    assert lines[-1] == (f"closed {lay.root}: its report labels the shown images by checkpoint, so the app shows every "
                         "rater link as closed; 1 rater(s) with open links had unanswered pairs (bob 3 of 10), which "
                         "they are no longer shown")
    # the running app: every rater route says closed, the image is gone, an answer is not stored
    closed = client.get(f"/r/{bob}")
    assert closed.status_code == 410 and "This study is closed" in closed.text and "<img" not in closed.text
    assert client.get(img).status_code == 404
    assert client.post(f"/r/{bob}/answer", data={"key": key, "choice": "left"}).status_code == 410
    assert client.post(f"/r/{alice}/undo", data={"undo_key": "0" * 32}).status_code == 410
    assert len(db.export_responses(lay.database_url)) == 13
    # no new app, rater or link; revoking still works
    with pytest.raises(UserError, match=r"was closed by a `human analyze --final` \(.*\), whose report labels the "
                                        r"shown images by checkpoint, so it cannot serve pairs; for more answers"):
        create_app(lay.root)
    for args in (("serve", lay.root, "--port", "1"), ("raters", lay.root, "--add", "carol", "--base-url", "http://x"),
                 ("raters", lay.root, "--rotate", "bob", "--base-url", "http://x")):
        res = cli("human", *args)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and "was closed by" in res.stderr, res
        assert res.stderr.count("\n") == 1
    assert not lay.server.exists()  # nothing remembered by a refused command
    res = cli("human", "raters", lay.root, "--revoke", "bob", "--base-url", "http://x")
    assert res.returncode == 0 and "bob: revoked" in res.stdout, res
    assert [n for n, _ in db.rater_links(lay.database_url, "http://x")] == ["alice", "bob"]
    db.dispose(lay.database_url)


def test_a_final_analysis_of_an_export_says_to_stop_the_app_that_collected_it(tmp_path):
    from pcpo_eval.human.simulate import simulate_responses

    lay = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    answers = simulate_responses(pd.read_parquet(lay.pairs), 3, 10, 0.5, rng_seed=3).drop(columns="simulated")
    answers.to_parquet(tmp_path / "a.parquet", index=False)
    lines: list[str] = []
    analyze_folder(lay.root, tmp_path / "a.parquet", bootstrap=0, log=lines.append, final=True)
    assert lines[-1].endswith(f"the answers came from {tmp_path / 'a.parquet'}: stop any app still serving this "
                              "study's pairs (a serving bundle does not know the study is closed) before you share "
                              "the report")


def test_a_damaged_log_of_analyses_keeps_the_app_closed(tmp_path):
    lay = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    client = TestClient(create_app(lay.root), follow_redirects=False)
    ((_, token),) = db.add_raters(lay.database_url, ["alice"])
    assert client.get(f"/r/{token}").status_code == 200
    lay.looks.write_text("not json\n{}\n")
    assert client.get(f"/r/{token}").status_code == 410
    db.dispose(lay.database_url)


def test_export_never_writes_no_answers_over_an_export_nor_over_the_databases_files(tmp_path, cli):
    lay = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    client = TestClient(create_app(lay.root), follow_redirects=False)
    ((_, token),) = db.add_raters(lay.database_url, ["alice"])
    _answer(client, token, 4)
    assert cli("human", "export", lay.root).returncode == 0
    good = _digest(lay.responses)
    # answers collected elsewhere: a folder without its database, or a mistyped URL
    other = tmp_path / "COPY"
    make_human_dir(other, n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    (other / "responses.parquet").write_bytes(lay.responses.read_bytes())
    for args in ((other,), (lay.root, "--database-url", f"sqlite:///{lay.root}/humna.db")):
        res = cli("human", "export", *args)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and "has no database at" in res.stderr, res
    assert _digest(other / "responses.parquet") == good and not (other / "human.db").exists()
    assert not (lay.root / "humna.db").exists()
    # an empty database never replaces an export that holds answers
    empty = tmp_path / "empty.db"
    db.upgrade(f"sqlite:///{empty}")
    res = cli("human", "export", lay.root, "--database-url", f"sqlite:///{empty}")
    assert res.returncode == 2 and "holds no answers but" in res.stderr and "holds 4" in res.stderr, res
    assert _digest(lay.responses) == good
    # nor over the database's own files
    for name in ("human.db-wal", "human.db-shm", "human.db-journal"):
        res = cli("human", "export", lay.root, "-o", lay.root / name)
        assert res.returncode == 2 and res.stderr.startswith("error: --output"), res
    assert len(db.export_responses(lay.database_url)) == 4
    db.dispose(lay.database_url)
    db.dispose(f"sqlite:///{empty}")


def test_a_design_is_never_written_into_a_serving_bundle(tmp_path):
    from pcpo_eval.human.design import _check_design_folder
    from pcpo_eval.human.settings import ASSIGNMENT_KEYED

    lay = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10,
                         assignment=ASSIGNMENT_KEYED)
    make_bundle(lay.root, tmp_path / "SERVE", log=lambda _: None)
    with pytest.raises(UserError, match=r"SERVE is a serving bundle; a design there would put the unblinding"):
        _check_design_folder(HumanLayout(tmp_path / "SERVE"))
    answers = tmp_path / "ANSWERS"
    answers.mkdir()
    db.upgrade(f"sqlite:///{answers / 'human.db'}")
    with pytest.raises(UserError, match=r"holds a rating database but no design"):
        _check_design_folder(HumanLayout(answers))
    _check_design_folder(lay)  # a design folder itself (re-run) is fine
    db.dispose(f"sqlite:///{answers / 'human.db'}")


@pytest.mark.parametrize(("column", "value", "message"), [
    ("submitted_at", "yesterday", "submitted_at 'yesterday' of rater"),
    ("submitted_at", None, "an empty submitted_at of rater"),
    ("seconds", -3.0, "seconds '-3.0' of rater"),
    ("seconds", float("inf"), "seconds 'inf' of rater"),
])
def test_answers_with_a_time_that_is_no_time_are_refused(tmp_path, cli, column, value, message):
    """An answer whose ``submitted_at`` is no time was kept after its rater's revocation (read as no time);
    negative seconds entered the median that flags fast raters."""
    from pcpo_eval.human.simulate import simulate_responses

    lay = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    answers = simulate_responses(pd.read_parquet(lay.pairs), 3, 10, 0.5, rng_seed=3).drop(columns="simulated")
    answers[column] = answers[column].astype(object)
    answers.loc[answers.index[5], column] = value
    answers.to_parquet(tmp_path / "a.parquet", index=False)
    res = cli("human", "analyze", lay.root, "--responses", tmp_path / "a.parquet", "--bootstrap", "0")
    assert res.returncode == 2 and res.stderr.startswith(f"error: {message}") and res.stderr.count("\n") == 1, res
    assert not lay.analysis.exists() and not lay.looks.exists()
