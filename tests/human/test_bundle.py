"""The serving bundle (``pcpo-eval human bundle``): what the rating app needs, and nothing that unblinds.

A bundle holds no method, checkpoint, comparison, seed or blinding secret (in any file, Parquet
metadata included); the app serves it exactly as it serves its design folder (same blocks, orders,
image URLs and bytes); answers collected on a bundle, exported and analysed on the design folder,
unblind to the right checkpoint; designs whose order needs the secret itself are refused.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from pcpo_eval.errors import UserError
from pcpo_eval.human import KINDS, HumanLayout, db
from pcpo_eval.human.analysis import analyze
from pcpo_eval.human.app import create_app
from pcpo_eval.human.bundle import SERVED_COLUMNS, make_bundle
from pcpo_eval.human.settings import ASSIGNMENT_KEYED, read_settings
from tests.support.human import make_human_dir, organiser_order, secret_strings, shown_pair

IMG_RE = re.compile(r'<img src="/r/[^/]+/img/([0-9a-f]{32})\.png"')


def _design(tmp_path, **kw) -> HumanLayout:
    """A 6 prompts x 3 seeds design (+ 4 attention checks, 10 pairs per rater) as `human design` writes now."""
    return make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10,
                          assignment=ASSIGNMENT_KEYED, **kw)


def _bundle(layout: HumanLayout, out) -> HumanLayout:
    make_bundle(layout.root, out, log=lambda _: None)
    return HumanLayout(out)


def test_a_bundle_holds_the_shown_images_and_served_columns_and_nothing_that_unblinds(tmp_path):
    layout = _design(tmp_path)
    bundle = _bundle(layout, tmp_path / "SERVE")
    pairs = pd.read_parquet(layout.pairs)
    tokens = set(pairs["left_image"]) | set(pairs["right_image"])
    files = {p.relative_to(bundle.root).as_posix() for p in bundle.root.rglob("*") if p.is_file()}
    assert files == {"bundle.json", "pairs.parquet"} | {f"images/{t}.png" for t in tokens}
    for t in tokens:  # byte copies with the design's file time (no order of writing to read)
        assert bundle.image(t).read_bytes() == layout.image(t).read_bytes()
        assert bundle.image(t).stat().st_mtime == layout.image(t).stat().st_mtime
    served = pd.read_parquet(bundle.pairs)
    assert tuple(served.columns) == SERVED_COLUMNS and len(served) == len(pairs)
    key = ["pair_id", *SERVED_COLUMNS[1:]]
    assert served.sort_values("pair_id")[key].reset_index(drop=True).equals(
        pairs.sort_values("pair_id")[key].reset_index(drop=True))
    # no method, checkpoint, comparison or secret anywhere: cell values, Parquet metadata, bundle.json
    hidden = [s for s in secret_strings(layout) if s not in KINDS]
    design = json.loads(layout.design.read_text())
    texts = [bundle.bundle.read_text(), str(pq.read_metadata(bundle.pairs).metadata),
             " ".join(served.astype(str).to_numpy().ravel())]
    for text in texts:
        assert not [s for s in hidden if s.lower() in text.lower()], text[:200]
        assert design["blinding_secret"] not in text and "synthetic" not in text
    record = json.loads(bundle.bundle.read_text())
    assert set(record) == {"format", "rng_seed", "per_rater", "comparison_seeds", "n_pairs", "n_images",
                           "key_secret", "order_secret", "created"}
    assert record["n_pairs"] == len(pairs) and record["n_images"] == len(tokens)


def test_the_app_serves_a_bundle_as_it_serves_its_design(tmp_path):
    """Same blocks and orders, same image URLs and bytes, for raters 1 and 2 of each."""
    layout = _design(tmp_path)
    bundle = _bundle(layout, tmp_path / "SERVE")
    assert read_settings(bundle) == read_settings(layout)
    views = []
    for root in (layout.root, bundle.root):
        client = TestClient(create_app(root), follow_redirects=False)
        lay = HumanLayout(root)
        tokens = [t for _, t in db.add_raters(lay.database_url, ["alice", "bob"])]
        seen = []
        for token in tokens:
            html = client.get(f"/r/{token}").text
            keys = IMG_RE.findall(html)
            seen.append((shown_pair(client, token), keys,
                         [client.get(f"/r/{token}/img/{k}.png").content for k in keys]))
        views.append((client.app.state.human.assignment(1), client.app.state.human.assignment(2), seen))
        db.dispose(lay.database_url)
    assert views[0] == views[1]
    assert views[0][0] == organiser_order(layout, 1) and views[0][0] != views[0][1]


def test_answers_on_a_bundle_unblind_on_the_design_folder(tmp_path, cli):
    """Three raters pick PCPO's side of every main pair (the organiser's table says which side that
    is; the bundle does not); the bundle's export, analysed with the design's pairs, gives PCPO every win."""
    layout = _design(tmp_path)
    bundle = _bundle(layout, tmp_path / "SERVE")
    private = pd.read_parquet(layout.pairs).set_index("pair_id")
    client = TestClient(create_app(bundle.root), follow_redirects=False)
    for _, token in db.add_raters(bundle.database_url, ["a", "b", "c"]):
        while (pair_id := shown_pair(client, token)) is not None:
            row = private.loc[pair_id]
            choice = ("left" if row.left_method.startswith("pcpo") else "right") if row.kind == "main" else "tie"
            if row.kind == "degraded":
                choice = row.expected
            key = re.search(r'name="key" value="([^"]+)"', client.get(f"/r/{token}").text).group(1)
            assert client.post(f"/r/{token}/answer", data={"key": key, "choice": choice}).status_code == 303
    db.dispose(bundle.database_url)
    res = cli("human", "export", bundle.root)
    assert res.returncode == 0 and "wrote 30 responses" in res.stdout, res.stderr
    out = analyze(pd.read_parquet(layout.pairs), pd.read_parquet(bundle.responses), bootstrap=0)
    assert out["attention_checks"]["excluded"] == []
    assert len(out["comparisons"]) == 2
    for c in out["comparisons"]:
        pcpo, other = ("a", "b") if c["a"].startswith("pcpo") else ("b", "a")
        assert c[f"{pcpo}_wins"] > 0 and c[f"{other}_wins"] == 0 and c["ties"] == 0


def test_bundle_cli_refuses_what_it_cannot_do_safely(tmp_path, cli):
    layout = _design(tmp_path)
    out = tmp_path / "SERVE"
    res = cli("human", "bundle", layout.root, "--out", out)
    assert res.returncode == 0 and "bundle of 22 pairs and 44 images" in res.stdout, res.stderr
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    res = cli("human", "bundle", layout.root, "--out", out)  # the same again: nothing to do
    assert res.returncode == 0 and "nothing to do" in res.stdout
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    other = _design(tmp_path / "other", rng_seed=8)
    res = cli("human", "bundle", other.root, "--out", out)  # another design's bundle is there
    assert res.returncode == 2 and res.stderr.startswith("error: --out") and "not empty" in res.stderr
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    # a design whose raters' order is keyed by the blinding secret itself (made before bundles)
    old = make_human_dir(tmp_path / "OLD", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    res = cli("human", "bundle", old.root, "--out", tmp_path / "S2")
    assert res.returncode == 2 and "made before serving bundles" in res.stderr and not (tmp_path / "S2").exists()
    legacy = make_human_dir(tmp_path / "LEGACY", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10, legacy=True)
    res = cli("human", "bundle", legacy.root, "--out", tmp_path / "S3")
    assert res.returncode == 2 and "made before serving bundles" in res.stderr and not (tmp_path / "S3").exists()
    # the organiser's commands that need the unblinding say where to run them
    for args in (("analyze", out), ("simulate", out, "-o", tmp_path / "sim.parquet")):
        res = cli("human", *args)
        assert res.returncode == 2 and "is a serving bundle" in res.stderr and "--responses" in res.stderr
    # raters and export run on the bundle
    res = cli("human", "raters", out, "--add", "alice", "--base-url", "https://rate.example.org")
    assert res.returncode == 0 and "alice: https://rate.example.org/r/" in res.stdout, res.stderr
    db.dispose(HumanLayout(out).database_url)


def test_a_damaged_bundle_is_one_error_line(tmp_path):
    layout = _design(tmp_path)
    bundle = _bundle(layout, tmp_path / "SERVE")
    record = json.loads(bundle.bundle.read_text())
    bundle.bundle.write_text(json.dumps({**record, "key_secret": "abc"}))
    with pytest.raises(UserError, match=r"bundle.json: key_secret must be at least 32 hex digits"):
        read_settings(bundle)
    bundle.bundle.write_text(json.dumps({k: v for k, v in record.items() if k != "order_secret"}))
    with pytest.raises(UserError, match=r"lacks key_secret or order_secret"):
        read_settings(bundle)


def _bracket_design(tmp_path, mode: str) -> HumanLayout:
    """A bracket design (PCPO@120 against DDPO@180 and DDPO@240, 10 prompts x 4 seeds) as `human design`
    builds it, on ``comparison_seeds`` ``mode``."""
    from pcpo_eval.human.design import (
        Checkpoint,
        _write_images,
        build_pairs,
        checkpoint_seeds,
        new_secret,
        parse_design_spec,
    )
    from tests.support.human import write_image_sets

    pcpo = Checkpoint("PCPO@120", "pcpo")
    bracket = [(pcpo, Checkpoint("DDPO@180", "b180")), (pcpo, Checkpoint("DDPO@240", "b240"))]
    sets = write_image_sets(tmp_path / f"sets-{mode}", checkpoint_seeds(bracket, 4, mode), 10, rng_seed=1)
    ds = parse_design_spec({"seeds": 4, "max_prompts": 10, "per_rater": 20, "identical": 2, "degraded": 2,
                            "comparison_seeds": mode})
    secret = new_secret()
    pairs, images = build_pairs(bracket, sets, ds, secret)
    lay = HumanLayout(tmp_path / f"HUMAN-{mode}")
    lay.images.mkdir(parents=True)
    _write_images(images, lay.images, secret, log=lambda _: None)
    pairs.to_parquet(lay.pairs)
    lay.design.write_text(json.dumps({"rng_seed": 0, "per_rater": 20, "blinding_secret": secret.hex(),
                                      "comparison_seeds": mode, "assignment": ASSIGNMENT_KEYED}))
    return lay


def _sides_named_by_repeats(served: pd.DataFrame, private: pd.DataFrame) -> tuple[int, int]:
    """The bundle holder's attack: in each main pair, the side whose image name is in another main pair
    too is the shared checkpoint. Returns (pairs it names a side of, of which PCPO's)."""
    main = served[served["kind"] == "main"]
    counts = pd.concat([main["left_image"], main["right_image"]]).value_counts()
    truth = private.set_index("pair_id")["left_method"] == "PCPO@120"
    named = [(counts[r.left_image] > counts[r.right_image]) == truth[r.pair_id]
             for r in main.itertuples() if counts[r.left_image] != counts[r.right_image]]
    return len(named), sum(named)


def test_a_design_that_shows_an_image_in_two_main_pairs_is_not_bundled(tmp_path, cli):
    """With shared seeds PCPO's one image of a prompt and seed is in both comparisons, and a bundle's
    pairs.parquet names every pair's images: the image name that recurs is PCPO's side, in 80 of 80 main
    pairs (what a bundle of this design held before it was refused). Distinct seeds: nothing recurs."""
    shared = _bracket_design(tmp_path, "shared")
    private = pd.read_parquet(shared.pairs)
    assert _sides_named_by_repeats(private[list(SERVED_COLUMNS)], private) == (80, 80)
    before = {p: p.read_bytes() for p in shared.root.rglob("*") if p.is_file()}
    res = cli("human", "bundle", shared.root, "--out", tmp_path / "SERVE")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("error: "), res.stderr
    assert ("40 images are each shown in two main pairs (comparison_seeds: shared), so a bundle would name the "
            "shared checkpoint's side of 80 of 80 main pairs") in res.stderr
    assert "comparison_seeds: distinct" in res.stderr and not (tmp_path / "SERVE").exists()
    assert {p: p.read_bytes() for p in shared.root.rglob("*") if p.is_file()} == before
    distinct = _bracket_design(tmp_path, "distinct")
    bundle = _bundle(distinct, tmp_path / "SERVE2")
    assert _sides_named_by_repeats(pd.read_parquet(bundle.pairs), pd.read_parquet(distinct.pairs)) == (0, 0)
