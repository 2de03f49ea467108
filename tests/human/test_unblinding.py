"""The security review's attacks on the human study (findings F1-F4), each as a test that failed before.

* F1: a design cannot be rebuilt from its public settings (``rng_seed`` and the counts in the design
  file) with dummy images, and no served page carries a design pair id or image token;
* F3: the app accepts an answer only for the pair it is showing the rater (not an unseen pair of
  their block, not another rater's), keeps undo and a resubmit working, and stores the seconds
  from serving the page to the answer;
* F4: every rater's block holds its share of degraded and identical checks, and the analysis lists
  raters who saw no degraded check as unscreened;
* F2: no rater's block holds both comparisons of one prompt and seed (with ``comparison_seeds:
  shared`` a bracket's PCPO image would appear twice), and ``per_rater: null`` with a shared
  checkpoint on shared seeds is refused (distinct seeds, the default: tests/human/test_comparison_seeds.py);
* F5 (the second review): ``position`` (in the serving bundle and the app's database) does not tell a pair's
  comparison, and each comparison shows its first checkpoint on the left in exactly half of its pairs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from pcpo_eval.errors import UserError
from pcpo_eval.human import HumanLayout, db
from pcpo_eval.human.analysis import analyze
from pcpo_eval.human.app import create_app
from pcpo_eval.human.design import (
    Checkpoint,
    _write_images,
    build_pairs,
    check_per_rater,
    checkpoint_seeds,
    parse_design_spec,
)
from tests.support.human import KEY_RE, PROGRESS_RE, make_human_dir, shown_pair, write_image_sets

PCPO = Checkpoint("PCPO@120", "pcpo")
BRACKET = [(PCPO, Checkpoint("DDPO@180", "b180")), (PCPO, Checkpoint("DDPO@240", "b240"))]
PUBLIC = {"seeds": 10, "max_prompts": 45, "per_rater": 40, "rng_seed": 0, "identical": 10, "degraded": 10}


def _sets(root: Path, n_prompts: int, n_seeds: int, noise: bool, mode: str = "distinct") -> dict[str, Path]:
    """One 8x8 image set per bracket checkpoint (random pixels, or all black: a rater's dummy) holding the
    seeds its comparisons use (``mode``: the design's comparison_seeds)."""
    return write_image_sets(root, checkpoint_seeds(BRACKET, n_seeds, mode), n_prompts, rng_seed=5, noise=noise)


@pytest.fixture(scope="module")
def bracket(tmp_path_factory):
    """A paper-sized bracket design (45 prompts x 10 seeds, 10 + 10 checks, 40 per rater) served by the app."""
    tmp = tmp_path_factory.mktemp("bracket")
    ds = parse_design_spec(PUBLIC)
    secret = bytes(range(16))
    table, images = build_pairs(BRACKET, _sets(tmp / "sets", 45, 10, noise=True), ds, secret)
    lay = HumanLayout(tmp / "human")
    lay.images.mkdir(parents=True)
    _write_images(images, lay.images, secret, log=lambda s: None)
    table.to_parquet(lay.pairs)
    lay.design.write_text(json.dumps({**PUBLIC, "blinding_secret": secret.hex()}))
    yield lay, table
    db.dispose(lay.database_url)


def test_f1_the_public_settings_do_not_rebuild_the_design(bracket, tmp_path):
    """The reviewer's replay: build_pairs with the recorded public settings and dummy pixels."""
    _, real = bracket
    replay, _ = build_pairs(BRACKET, _sets(tmp_path, 45, 10, noise=False), parse_design_spec(PUBLIC))
    assert not set(replay["pair_id"]) & set(real["pair_id"])
    tokens = [set(t["left_image"]) | set(t["right_image"]) for t in (real, replay)]
    assert not tokens[0] & tokens[1]
    key = ["comparison", "prompt_id", "seed"]
    sides = [t[t["kind"] == "main"].set_index(key).sort_index()["left_method"] == "PCPO@120" for t in (real, replay)]
    agree = int((sides[0] == sides[1]).sum())
    assert 390 < agree < 510, agree  # 900 coin flips: a replay guesses PCPO's side at chance, no better
    checks = [set(map(tuple, t.loc[t["kind"] != "main", ["kind", "prompt_id", "seed"]].values)) for t in (real, replay)]
    assert len(checks[0] & checks[1]) < 5
    # the secret, not rng_seed, determines the design: same secret, same table; rng_seed plays no part
    again, _ = build_pairs(BRACKET, _sets(tmp_path / "again", 45, 10, noise=False),
                           parse_design_spec(PUBLIC | {"rng_seed": 99}), bytes(range(16)))
    pd.testing.assert_frame_equal(again.drop(columns="prompt"), real.drop(columns="prompt"))


def test_f1_served_pages_carry_no_design_pair_id_or_image_token(bracket):
    lay, table = bracket
    client = TestClient(create_app(lay.root), follow_redirects=False)
    ((_, token),) = db.add_raters(lay.database_url, ["f1"])
    ids = set(table["pair_id"]) | set(table["left_image"]) | set(table["right_image"])
    for _ in range(40):
        html = client.get(f"/r/{token}").text
        assert not [t for t in ids if t in html]
        r = client.post(f"/r/{token}/answer", data={"key": KEY_RE.search(html).group(1), "choice": "tie"})
        assert r.status_code == 303 and not [t for t in ids if t in r.text + str(r.headers)]
    done = client.get(f"/r/{token}").text  # the thank-you page and its undo button
    assert "Thank you" in done and not [t for t in ids if t in done]


@pytest.fixture
def small(tmp_path):
    layout = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    client = TestClient(create_app(layout.root), follow_redirects=False)
    (_, ta), (_, tb) = db.add_raters(layout.database_url, ["alice", "bob"])
    yield layout, client, ta, tb
    db.dispose(layout.database_url)


def test_f3_only_the_pair_shown_can_be_answered(small):
    layout, client, ta, tb = small
    state = client.app.state.human
    url = layout.database_url
    order = state.assignment(1)
    html = client.get(f"/r/{ta}").text
    shown = shown_pair(client, ta)
    assert shown == order[0]
    # every other pair of alice's block, unseen: refused, with keys the server itself would mint
    for pid in order[1:]:
        r = client.post(f"/r/{ta}/answer", data={"key": state.answer_key(1, pid), "choice": "left"})
        assert r.status_code == 400
    # a pair of bob's block, with a key minted for bob (not alice's): the same refusal, same page
    foreign = client.post(f"/r/{ta}/answer", data={"key": state.answer_key(2, state.assignment(2)[0]),
                                                    "choice": "left"})
    unseen = client.post(f"/r/{ta}/answer", data={"key": state.answer_key(1, order[1]), "choice": "left"})
    assert foreign.status_code == unseen.status_code == 400 and foreign.text == unseen.text
    assert db.export_responses(url).empty
    # the shown pair is accepted, a resubmit changes nothing, then the next pair is the shown one
    key = KEY_RE.search(html).group(1)
    assert client.post(f"/r/{ta}/answer", data={"key": key, "choice": "left"}).status_code == 303
    assert client.post(f"/r/{ta}/answer", data={"key": key, "choice": "right"}).status_code == 303
    assert shown_pair(client, ta) == order[1]
    # the old key cannot answer a later pair, nor can it be replayed for the next pair
    assert client.post(f"/r/{ta}/answer", data={"key": state.answer_key(1, order[2]), "choice": "tie"}
                       ).status_code == 400
    df = db.export_responses(url)
    assert df[["pair_id", "choice"]].values.tolist() == [[order[0], "left"]]
    assert 0 <= df["seconds"][0] < 60  # seconds from serving the page to the answer


def test_f3_undo_reasks_the_undone_pair_and_only_it(small):
    layout, client, ta, _ = small
    state = client.app.state.human
    order = state.assignment(1)
    for _ in range(2):
        key = KEY_RE.search(client.get(f"/r/{ta}").text).group(1)
        client.post(f"/r/{ta}/answer", data={"key": key, "choice": "left"})
    html = client.get(f"/r/{ta}").text
    undo_key = html.split('name="undo_key" value="')[1].split('"')[0]
    assert client.post(f"/r/{ta}/undo", data={"undo_key": undo_key}).status_code == 303
    html = client.get(f"/r/{ta}").text
    assert shown_pair(client, ta) == order[1] and "Pair 2 of 10" in html
    assert client.post(f"/r/{ta}/answer", data={"key": state.answer_key(1, order[2]), "choice": "tie"}
                       ).status_code == 400
    assert client.post(f"/r/{ta}/answer", data={"key": KEY_RE.search(html).group(1), "choice": "right"}
                       ).status_code == 303
    df = db.export_responses(layout.database_url).set_index("pair_id")
    assert df.loc[order[1], "choice"] == "right" and df.loc[order[1], "first_choice"] == "left"
    assert PROGRESS_RE.search(client.get(f"/r/{ta}").text).group(1) == "3"


def test_f3_timing_column_migrates_an_old_database_keeping_answers(tmp_path):
    from alembic import command

    url = f"sqlite:///{tmp_path / 'h.db'}"
    cfg = db.alembic_config(url)
    with db.get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
    with db.get_engine(url).begin() as conn:
        conn.exec_driver_sql("INSERT INTO raters (name, token, created_at) VALUES ('old', 'tok', '2026-01-01')")
        conn.exec_driver_sql("INSERT INTO pairs VALUES ('aaaaaaaaaaaaaaaa', 0, 'p', 'bbbbbbbbbbbbbbbb', "
                             "'cccccccccccccccc')")
        conn.exec_driver_sql("INSERT INTO responses (rater_id, pair_id, choice, reason, submitted_at) "
                             "VALUES (1, 'aaaaaaaaaaaaaaaa', 'left', '', '2026-01-01 00:00:00')")
    db.upgrade(url)
    df = db.export_responses(url)
    assert df[["rater", "pair_id", "choice"]].values.tolist() == [["old", "aaaaaaaaaaaaaaaa", "left"]]
    assert df["seconds"].isna().all() and db.schema_diff(url) == []
    db.dispose(url)


def _kinds(table: pd.DataFrame) -> dict[str, str]:
    return dict(zip(table["pair_id"], table["kind"], strict=True))


def test_f4_every_block_holds_its_share_of_checks(bracket):
    _, table = bracket
    order = list(table.sort_values("position")["pair_id"])
    kinds = _kinds(table)
    n_raters = -(-len(order) // 40)
    for rater in range(1, 3 * n_raters + 1):
        block = db.assignment(order, b"k" * 16, rater, 40, kinds)
        got = Counter(kinds[p] for p in block)
        assert len(block) == len(set(block)) == 40
        assert (got["degraded"], got["identical"], got["main"]) == (1, 1, 38), (rater, got)
    # consecutive raters cover every main pair before any is repeated
    main = [p for r in range(1, 900 // 38 + 1) for p in db.assignment(order, b"k" * 16, r, 40, kinds)
            if kinds[p] == "main"]
    assert len(main) == len(set(main))
    assert db.block_counts(900, 15, 15, 40) == (38, 1, 1)
    assert db.block_counts(10, 5, 5, 10) == (6, 2, 2)
    assert db.block_counts(2, 5, 5, 10) == (2, 4, 4)  # few main pairs: the checks fill the block
    assert db.block_counts(900, 0, 10, 40) == (39, 0, 1)


def test_f4_unscreened_raters_are_reported(bracket):
    _, table = bracket
    deg = table[table.kind == "degraded"].iloc[0]
    main = table[table.kind == "main"]
    rows = [{"rater": "seen", "rater_id": 1, "pair_id": deg.pair_id, "choice": deg.expected}]
    rows += [{"rater": "seen", "rater_id": 1, "pair_id": p, "choice": "left"} for p in main.pair_id[:5]]
    rows += [{"rater": "never", "rater_id": 2, "pair_id": p, "choice": "left"} for p in main.pair_id[5:10]]
    out = analyze(table, pd.DataFrame(rows), bootstrap=0)
    checks = out["attention_checks"]
    assert checks["unscreened"] == [{"rater_id": 2, "rater": "never"}]
    assert [r["unscreened"] for r in checks["raters"]] == [False, True]
    assert out["counts"]["raters_unscreened"] == 1 and checks["excluded"] == []
    assert checks["fast"] == [] and [r["median_seconds"] for r in checks["raters"]] == [None, None]  # not recorded


def test_fast_raters_are_listed_and_kept(bracket):
    """The seconds from page to answer: a rater whose median is within FAST_SECONDS is listed, not excluded."""
    from pcpo_eval.human.analysis import FAST_SECONDS
    from pcpo_eval.human.report import summary_lines

    _, table = bracket
    main = table[table.kind == "main"]
    rows = [{"rater": "careful", "rater_id": 1, "pair_id": p, "choice": "left", "seconds": 4.0 + i}
            for i, p in enumerate(main.pair_id[:5])]
    rows += [{"rater": "clicker", "rater_id": 2, "pair_id": p, "choice": "left", "seconds": s}
             for p, s in zip(main.pair_id[5:10], [0.2, 0.3, 0.4, 9.0, 0.25], strict=True)]
    out = analyze(table, pd.DataFrame(rows), bootstrap=0)
    checks = out["attention_checks"]
    assert checks["fast"] == [{"rater_id": 2, "rater": "clicker", "median_seconds": 0.3}] and 0.3 <= FAST_SECONDS
    assert [r["median_seconds"] for r in checks["raters"]] == [6.0, 0.3]
    assert out["counts"]["raters_fast"] == 1 and out["counts"]["main_responses_used"] == 10  # kept
    assert any(line.startswith("  fast (median answer within 1 s") and "clicker (0.30 s)" in line
               for line in summary_lines(out))


def test_f2_no_block_holds_both_comparisons_of_one_prompt_and_seed(bracket):
    _, table = bracket
    order = list(table.sort_values("position")["pair_id"])
    kinds = _kinds(table)
    by_id = table.set_index("pair_id")
    for rater in range(1, 60):
        block = [p for p in db.assignment(order, b"s" * 16, rater, 40, kinds) if kinds[p] == "main"]
        keys = Counter(map(tuple, by_id.loc[block, ["prompt_id", "seed"]].values))
        assert max(keys.values()) == 1, rater
        images = Counter(by_id.loc[block, "left_image"].tolist() + by_id.loc[block, "right_image"].tolist())
        assert max(images.values()) == 1, rater


def test_f2_per_rater_that_would_repeat_an_image_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"per_rater: null .*PCPO@120 is in 2 comparisons.*own seeds"):
        check_per_rater(BRACKET, None)
    with pytest.raises(UserError, match=r"per_rater 20 gives a rater 12 main pairs out of 6 .*at most 8"):
        build_pairs(BRACKET, _sets(tmp_path, 3, 2, noise=False, mode="shared"),
                    parse_design_spec(PUBLIC | {"comparison_seeds": "shared", "max_prompts": 3, "seeds": 2,
                                                "per_rater": 20, "identical": 1,
                                                "degraded": 1}))
    # distinct seeds (the default): PCPO's images differ between the comparisons, nothing to repeat
    table, _ = build_pairs(BRACKET, _sets(tmp_path / "distinct", 3, 2, noise=False),
                           parse_design_spec(PUBLIC | {"max_prompts": 3, "seeds": 2, "per_rater": 20, "identical": 1,
                                                       "degraded": 1}))
    assert (table["kind"] == "main").sum() == 12
    check_per_rater(BRACKET, None, 450, (10, 10), "distinct")
    check_per_rater(BRACKET, 40, 450, (10, 10))  # the paper's design: 38 main pairs of 450 keys
    with pytest.raises(UserError, match=r"per_rater 2 leaves no main pair after the attention checks.*at least 3"):
        check_per_rater(BRACKET, 2, 450, (10, 10))  # 1 identical + 1 degraded fill the block
    check_per_rater([BRACKET[0]], None)  # one comparison: nothing is shared
    check_per_rater([(PCPO, Checkpoint("A@1", "a")), (Checkpoint("B@1", "b"), Checkpoint("C@1", "c"))], None)


def test_legacy_designs_keep_their_assignment(tmp_path):
    """A design.json without a blinding secret (made before) keeps the blocks it was served with."""
    layout = make_human_dir(tmp_path / "H", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10, legacy=True)
    client = TestClient(create_app(layout.root), follow_redirects=False)
    state = client.app.state.human
    assert state.kinds is None and state.settings.legacy
    pairs = list(db.pairs_frame(layout.database_url)["pair_id"])
    assert state.assignment(1) == db.assignment(pairs, 7, 1, 10)
    db.dispose(layout.database_url)


def test_f5_position_does_not_tell_the_comparison(bracket):
    """Before, slot ``j*G + i`` held comparison ``(i + j) mod C``: a bundle's ``position`` column named every
    main pair's comparison (96 of 96 in a toy bundle). With secret offsets per key, the layout's rule (under
    its better labelling) names it at chance; the keys' spacing that the app's blocks rely on is kept."""
    _, table = bracket
    main = table[table["kind"] == "main"].sort_values("position")
    n_keys = len(main) // len(BRACKET)
    slot = main["position"].to_numpy()
    rule = (slot % n_keys + slot // n_keys) % len(BRACKET)
    comp = pd.factorize(main["comparison"], sort=True)[0]
    agree = max((rule == comp).mean(), (rule != comp).mean())
    assert agree < 0.62, agree  # chance 0.5 (sd 0.024 over 225 runs of 2 keys); the old layout: 1.0
    keys = list(zip(main["prompt_id"], main["seed"] % 10, strict=True))  # a key: prompt x seed index
    assert all(keys[i] == keys[i + n_keys] for i in range(n_keys))  # a key's two comparisons: G apart


def test_f5_each_comparison_shows_each_side_on_the_left_half_the_time(bracket):
    """Independent coin flips left a toy comparison 18 / 30 on one side; now a fixed margin per comparison."""
    _, table = bracket
    main = table[table["kind"] == "main"]
    for comparison, rows in main.groupby("comparison"):
        first = comparison.split(" vs ")[0]
        assert (rows["left_method"] == first).sum() == len(rows) // 2, comparison


def test_the_degraded_noise_is_drawn_apart_from_the_sides(tmp_path, monkeypatch):
    """A rater sees the degraded checks' noise pixel by pixel: it must not come from the generator that draws
    the sides. With the noise drawn there, a noiseless degrade moved every later side; now the table is the same."""
    import pcpo_eval.human.design as design

    spec = parse_design_spec(PUBLIC | {"max_prompts": 3, "seeds": 2, "per_rater": 20, "identical": 2, "degraded": 4})
    sets, secret = _sets(tmp_path, 3, 2, noise=True), bytes(range(16))
    real, _ = build_pairs(BRACKET, sets, spec, secret)
    monkeypatch.setattr(design, "degrade", lambda pixels, rng: pixels[::-1].copy())  # draws nothing
    quiet, _ = build_pairs(BRACKET, sets, spec, secret)
    assert (real["kind"] == "degraded").sum() == 4
    assert real.drop(columns=["left_image", "right_image"]).equals(quiet.drop(columns=["left_image", "right_image"]))
