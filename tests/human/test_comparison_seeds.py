"""``comparison_seeds``: no image of a bracket's shared checkpoint is shown in two comparisons.

The leak (docs/human.md, "What cannot be hidden"): with every comparison on the same prompts x
seeds, PCPO's image of one prompt and seed is byte-identical in ``PCPO vs DDPO@180`` and ``PCPO vs
DDPO@240``. No single rater meets both pairs, but raters who pool what they received (or one observer
of several raters' traffic) match equal bytes across comparisons, and the side that repeats is PCPO.
``comparison_seeds: distinct`` (now the default) renders comparison k on seeds ``k*S .. k*S+S-1``.

A bracket design on tiny image sets is rated through the app by every rater; the SHA-256 of every
image any rater received, and of every file the design wrote to ``images/``, is mapped back (organiser
side) to the comparisons it was shown in. With distinct seeds no image is in two comparisons and the
pooled-bytes attack names no side; with ``shared`` seeds (kept for designs made before the setting)
the attack still names PCPO's side of every pooled pair: the leak is the setting's, not the test's.
Besides: the seeds each comparison uses, the image sets a design needs (a missing seed is one error
naming it and the ``generate`` command), ``per_rater`` limits that only shared seeds need, a shared
design rebuilt from its secret exactly as the code before the setting built it, legacy ``design.json``
files, and the setting's validation (one ``error:`` line, exit code 2).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from fastapi.testclient import TestClient

from pcpo_eval.errors import UserError
from pcpo_eval.human import HumanLayout, db, design_comparison_seeds
from pcpo_eval.human.app import create_app, read_settings
from pcpo_eval.human.design import (
    Checkpoint,
    _write_images,
    build_pairs,
    check_per_rater,
    checkpoint_seeds,
    comparison_seeds,
    parse_design_spec,
)
from tests.support.human import KEY_RE, make_human_dir, shown_pair, write_image_sets

PCPO = Checkpoint("PCPO@120", "pcpo")
BRACKET = [(PCPO, Checkpoint("DDPO@180", "b180")), (PCPO, Checkpoint("DDPO@240", "b240"))]
N_PROMPTS, N_SEEDS, N_RATERS, PER_RATER = 12, 4, 14, 20
SETTINGS = {"seeds": N_SEEDS, "max_prompts": N_PROMPTS, "per_rater": PER_RATER, "rng_seed": 0, "identical": 6,
            "degraded": 6}


def _sets(root: Path, n_prompts: int, seeds: dict[str, range], set_json: bool = False) -> dict[str, Path]:
    """One image set per bracket checkpoint holding ``seeds[label]`` (random 8x8 pixels: every image's
    bytes differ), written as ``generate`` writes a manifest (and ``set.json`` when asked)."""
    sets = write_image_sets(root, seeds, n_prompts, rng_seed=9)
    for label, folder in sets.items():
        if set_json:
            (folder / "set.json").write_text(json.dumps({
                "status": "complete", "settings": {"model": f"runs/{label}/checkpoints/epoch_0120", "sampler": "ddim",
                                                   "steps": 20, "cfg": 4.5, "eta": 1.0, "schedule": "ddim",
                                                   "micro_batch": 8, "device": "cpu", "precision": "fp32",
                                                   "batch_invariance": "bitwise", "attention": "auto"},
                "run": {"prompts": "toy", "n_prompts": n_prompts, "n_prompts_beyond_limit": 33,
                        "max_prompt_tokens": None}}))
    return sets


def _bracket_sets(root: Path, mode: str) -> dict[str, Path]:
    return _sets(root, N_PROMPTS, {k: range(min(v), max(v) + 1)
                                   for k, v in checkpoint_seeds(BRACKET, N_SEEDS, mode).items()})


def _serve_everyone(tmp: Path, extra: dict) -> tuple[list[dict], pd.DataFrame, HumanLayout]:
    """Build the bracket design, serve it, and let every rater rate their whole block as a browser
    would (page, both images, answer); returns what each image request received, per rater."""
    ds = parse_design_spec(SETTINGS | extra)
    secret = bytes(range(16))
    table, images = build_pairs(BRACKET, _bracket_sets(tmp / "sets", ds.comparison_seeds), ds, secret)
    lay = HumanLayout(tmp / "human")
    lay.images.mkdir(parents=True)
    _write_images(images, lay.images, secret, log=lambda s: None)
    table.to_parquet(lay.pairs)
    lay.design.write_text(json.dumps({**SETTINGS, **extra, "blinding_secret": secret.hex()}))
    # one client session: one event-loop portal for every request instead of one per request (the app
    # has no lifespan handlers, so the requests and what they receive are the same)
    with TestClient(create_app(lay.root), follow_redirects=False) as client:
        tokens = [t for _, t in db.add_raters(lay.database_url, [f"r{i:02d}" for i in range(N_RATERS)])]
        by_id = table.set_index("pair_id")
        received = []
        for rater, token in enumerate(tokens):
            while (m := KEY_RE.search(html := client.get(f"/r/{token}").text)) is not None:
                pair_id = shown_pair(client, token)
                for side, url in zip(("left", "right"), re.findall(r'<img src="([^"]+)"', html), strict=True):
                    body = client.get(url).content
                    received.append({"rater": rater, "pair_id": pair_id, "side": side,
                                     "sha": hashlib.sha256(body).hexdigest(), "kind": by_id.loc[pair_id, "kind"],
                                     "comparison": by_id.loc[pair_id, "comparison"],
                                     "method": by_id.loc[pair_id, f"{side}_method"]})
                client.post(f"/r/{token}/answer", data={"key": m.group(1), "choice": "tie"})
    db.dispose(lay.database_url)
    return received, table, lay


@pytest.fixture(scope="module")
def distinct(tmp_path_factory):
    """The default design (no comparison_seeds key: distinct seeds), rated by every rater."""
    return _serve_everyone(tmp_path_factory.mktemp("distinct"), {})


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The same design with comparison_seeds: shared (as every design was before the setting)."""
    return _serve_everyone(tmp_path_factory.mktemp("shared"), {"comparison_seeds": "shared"})


def _comparisons_by_bytes(received: list[dict], lay: HumanLayout, table: pd.DataFrame) -> dict[str, set[str]]:
    """SHA-256 -> the comparisons whose main pairs showed those bytes, over everything any rater received
    and every file written to ``images/`` (mapped through ``pairs.parquet``, organiser side)."""
    out: dict[str, set[str]] = defaultdict(set)
    for r in received:
        out[r["sha"]] |= {r["comparison"]} if r["kind"] == "main" else set()
    main = table[table["kind"] == "main"]
    for side in ("left", "right"):
        for tok, comp in zip(main[f"{side}_image"], main["comparison"], strict=True):
            out[hashlib.sha256(lay.image(tok).read_bytes()).hexdigest()].add(comp)
    for f in lay.images.glob("*.png"):
        out.setdefault(hashlib.sha256(f.read_bytes()).hexdigest(), set())
    return out


def _pooled_attack(received: list[dict]) -> tuple[int, int]:
    """The raters pool every main image they received: a side of a pair whose bytes also came in a pair
    of another comparison is named the shared checkpoint. Returns (pairs named, of which right)."""
    comps: dict[str, set[str]] = defaultdict(set)
    for r in received:
        if r["kind"] == "main":
            comps[r["sha"]].add(r["comparison"])
    named = right = 0
    by_pair: dict[str, list[dict]] = defaultdict(list)
    for r in received:
        if r["kind"] == "main":
            by_pair[(r["rater"], r["pair_id"])].append(r)
    for sides in by_pair.values():
        repeated = [s for s in sides if len(comps[s["sha"]]) > 1]
        if len(repeated) == 1:
            named += 1
            right += repeated[0]["method"] == PCPO.label
    return named, right


def test_no_image_of_the_shared_checkpoint_is_in_two_comparisons(distinct):
    received, table, lay = distinct
    main = table[table["kind"] == "main"]
    # the raters pooled cover every main pair: this is what the whole panel can collect
    assert {r["pair_id"] for r in received if r["kind"] == "main"} == set(main["pair_id"])
    assert len({r["rater"] for r in received}) == N_RATERS
    by_bytes = _comparisons_by_bytes(received, lay, table)
    pcpo = {r["sha"] for r in received if r["method"] == PCPO.label}
    assert pcpo and all(len(by_bytes[h]) <= 1 for h in pcpo), "PCPO's bytes in two comparisons"
    assert all(len(c) <= 1 for c in by_bytes.values()), "an image in two comparisons"
    # and no image in two main pairs at all (each image of a checkpoint: one pair)
    shown = pd.concat([main["left_image"], main["right_image"]])
    assert shown.is_unique
    assert _pooled_attack(received) == (0, 0)
    # attention checks reuse shown images, each from one main pair: their bytes lead to one comparison only
    checks = {r["sha"] for r in received if r["kind"] != "main"}
    assert checks and all(len(by_bytes[h]) <= 1 for h in checks)


def test_the_checks_reuse_one_side_of_one_main_pair_at_random(distinct):
    """A check's image repeats one side of one main pair; pooled with that pair it names PCPO only
    by a coin flip (the check drew the side, not the checkpoint)."""
    _, table, _ = distinct
    main = table[table["kind"] == "main"]
    shown = {}
    for side in ("left", "right"):
        shown.update(dict(zip(main[f"{side}_image"], main[f"{side}_method"], strict=True)))
    checks = table[table["kind"] != "main"]
    for r in checks.itertuples():
        reused = [t for t in (r.left_image, r.right_image) if t in shown]
        assert len(reused) == 1 and shown[reused[0]] == r.left_method == r.right_method
        if r.kind == "degraded":  # the intact side is the reused image
            assert reused[0] == (r.left_image if r.expected == "left" else r.right_image)
    # the checks' images come from both sides of the pairs, PCPO's and the baselines'
    assert {r.left_method for r in checks.itertuples()} > {PCPO.label}


def test_each_comparison_renders_its_own_seeds(distinct, tmp_path):
    _, table, _ = distinct
    main = table[table["kind"] == "main"]
    seeds = main.groupby("comparison")["seed"].agg(lambda s: sorted(set(s)))
    assert seeds["PCPO@120 vs DDPO@180"] == list(range(N_SEEDS))
    assert seeds["PCPO@120 vs DDPO@240"] == list(range(N_SEEDS, 2 * N_SEEDS))
    assert len(main) == 2 * N_PROMPTS * N_SEEDS
    assert comparison_seeds(3, 10, "distinct") == [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
    assert comparison_seeds(2, 10, "shared") == [list(range(10))] * 2
    assert checkpoint_seeds(BRACKET, 10, "distinct") == {"PCPO@120": list(range(20)), "DDPO@180": list(range(10)),
                                                       "DDPO@240": list(range(10, 20))}
    assert checkpoint_seeds(BRACKET, 10, "shared") == {k: list(range(10)) for k in ("PCPO@120", "DDPO@180", "DDPO@240")}


def test_a_designs_seeds_are_drawn_from_its_secret():
    """Designs made now draw each comparison's seeds from the blinding secret (the image noise is a public
    function of prompt and seed, so public seeds let anyone re-render the base model and match): the same
    key gives the same seeds, another key others; distinct across comparisons, above the seeds a study uses,
    within the 7-digit file names; ``generate`` reads them back from one --seeds value."""
    from pcpo_eval.generate.plan import MAX_SEED, parse_seeds, seed_arg
    from pcpo_eval.human.design import SECRET_SEED_FLOOR

    k1, k2 = b"\x01" * 16, b"\x02" * 16
    a = comparison_seeds(3, 10, "distinct", k1)
    assert a == comparison_seeds(3, 10, "distinct", k1) and a != comparison_seeds(3, 10, "distinct", k2)
    flat = [s for ss in a for s in ss]
    assert len(set(flat)) == 30 and min(flat) >= SECRET_SEED_FLOOR and max(flat) <= MAX_SEED
    assert all(ss == sorted(ss) for ss in a)
    shared = comparison_seeds(2, 10, "shared", k1)
    assert shared[0] == shared[1] and len(set(shared[0])) == 10 and min(shared[0]) >= SECRET_SEED_FLOOR
    two = comparison_seeds(2, 10, "distinct", k1)  # BRACKET: PCPO@120 in both comparisons
    assert checkpoint_seeds(BRACKET, 10, "distinct", k1) == {"PCPO@120": sorted(two[0] + two[1]),
                                                            "DDPO@180": two[0], "DDPO@240": two[1]}
    assert parse_seeds(seed_arg(flat)) == sorted(flat) and parse_seeds(seed_arg([5])) == [5]
    assert parse_seeds(seed_arg(range(4))) == [0, 1, 2, 3]


def test_shared_seeds_still_leak_to_pooled_raters(shared):
    """What distinct seeds remove: with shared seeds the pooled bytes name PCPO in every pooled pair."""
    received, table, lay = shared
    main_pairs = {(r["rater"], r["pair_id"]) for r in received if r["kind"] == "main"}
    named, right = _pooled_attack(received)
    assert named == right == len(main_pairs)
    by_bytes = _comparisons_by_bytes(received, lay, table)
    assert sum(len(c) == 2 for c in by_bytes.values()) == N_PROMPTS * N_SEEDS
    # no single rater received one image twice in main pairs (the blocks still keep that)
    per_rater = defaultdict(list)
    for r in received:
        if r["kind"] == "main":
            per_rater[r["rater"]].append(r["sha"])
    assert all(len(v) == len(set(v)) for v in per_rater.values())


def test_a_design_on_shared_seeds_is_built_as_before_the_setting(tmp_path):
    """``comparison_seeds: shared`` with a design's secret rebuilds the very table and images the code
    before the setting built (the digest was taken from that code on these sets): a legacy design's
    secret still regenerates it (under the ``cyclic`` layout and the ``pairs`` check noise such designs used;
    ``offset-balanced`` and ``own-stream`` since)."""
    sets = _legacy_sets(tmp_path, 6, 3)
    ds = parse_design_spec({"seeds": 3, "max_prompts": 6, "per_rater": 10, "rng_seed": 0, "identical": 3,
                            "degraded": 3, "comparison_seeds": "shared"})
    table, images = build_pairs(BRACKET, sets, ds, bytes(range(16)), layout="cyclic", check_noise="pairs")
    h = hashlib.sha256(json.dumps(table.to_dict("records"), sort_keys=True, default=str).encode())
    for tok in sorted(images.files):
        src = images.files[tok]
        h.update(tok.encode() + (str(Path(src).relative_to(tmp_path)).encode() if isinstance(src, Path)
                                 else np.ascontiguousarray(src).tobytes()))
    assert h.hexdigest() == "51727b9233dbc33ab4939b379e09216a75862b312dc493a897d9afbc05a22e7d"


def _legacy_sets(root: Path, n_prompts: int, n_seeds: int) -> dict[str, Path]:
    """The sets the legacy digest was taken on (``tests/human/test_unblinding.py``'s ``_sets``, generator 5)."""
    return write_image_sets(root, {label: range(n_seeds) for label in ("PCPO@120", "DDPO@180", "DDPO@240")},
                            n_prompts, rng_seed=5)


def test_a_set_without_the_seeds_of_its_comparisons_names_them_and_the_command(tmp_path):
    """Sets rendered on seeds 0..S-1 only (enough for shared seeds) lack PCPO's and DDPO@240's second range."""
    sets = _sets(tmp_path, 3, {label: range(2) for label in ("PCPO@120", "DDPO@180", "DDPO@240")}, set_json=True)
    ds = parse_design_spec({"seeds": 2, "max_prompts": 3, "per_rater": None, "identical": 1, "degraded": 1})
    with pytest.raises(UserError) as exc:
        build_pairs(BRACKET, sets, ds)
    msg = str(exc.value)
    assert "\n" not in msg and "DDPO@180" not in msg
    assert "PCPO@120's image set" in msg and "lacks 6 image(s) this design shows (seeds 2-3)" in msg
    assert (f"`pcpo-eval generate --model runs/PCPO@120/checkpoints/epoch_0120 --prompts toy --seeds 0-3 "
            f"--out {sets['PCPO@120']} --sampler ddim --steps 20 --cfg 4.5 --eta 1.0 --schedule ddim --precision fp32 "
            f"--attention auto --device cpu --micro-batch 8 --max-prompts 3`") in msg
    assert "--seeds 2-3 --out " + str(sets["DDPO@240"]) in msg
    # the same sets serve a shared-seed design as they are
    table, _ = build_pairs(BRACKET, sets, parse_design_spec({"seeds": 2, "max_prompts": 3, "per_rater": 5,
                                                             "identical": 1, "degraded": 1,
                                                             "comparison_seeds": "shared"}))
    assert set(table.loc[table["kind"] == "main", "seed"]) == {0, 1}


def test_per_rater_limits_are_for_shared_seeds_only(tmp_path):
    """A rater meeting both comparisons of one prompt and seed sees two different PCPO images under distinct
    seeds: per_rater null and blocks larger than prompts x seeds are allowed there, refused under shared."""
    check_per_rater(BRACKET, None, 450, (10, 10), "distinct")
    check_per_rater(BRACKET, 900, 450, (10, 10), "distinct")
    with pytest.raises(UserError, match=r"per_rater: null .*own seeds"):
        check_per_rater(BRACKET, None, 450, (10, 10), "shared")
    with pytest.raises(UserError, match=r"per_rater 900 .*comparison_seeds: distinct"):
        check_per_rater(BRACKET, 900, 450, (10, 10), "shared")
    with pytest.raises(UserError, match="leaves no main pair"):  # both modes: a block of checks only
        check_per_rater(BRACKET, 2, 450, (10, 10), "distinct")


def test_every_rater_sees_every_pair_with_distinct_seeds(tmp_path):
    """per_rater: null on a bracket (refused with shared seeds): two raters rate all pairs, and neither
    receives the same bytes in two main pairs."""
    ds = parse_design_spec({"seeds": 2, "max_prompts": 3, "per_rater": None, "identical": 1, "degraded": 1})
    secret = bytes(range(1, 17))
    sets = _sets(tmp_path / "sets", 3, {k: range(min(v), max(v) + 1)
                                        for k, v in checkpoint_seeds(BRACKET, 2, "distinct").items()})
    table, images = build_pairs(BRACKET, sets, ds, secret)
    lay = HumanLayout(tmp_path / "human")
    lay.images.mkdir(parents=True)
    _write_images(images, lay.images, secret, log=lambda s: None)
    table.to_parquet(lay.pairs)
    lay.design.write_text(json.dumps({"rng_seed": 0, "per_rater": None, "comparison_seeds": "distinct",
                                      "blinding_secret": secret.hex()}))
    client = TestClient(create_app(lay.root), follow_redirects=False)
    for _, token in db.add_raters(lay.database_url, ["a", "b"]):
        seen, kinds = [], []
        while (m := KEY_RE.search(html := client.get(f"/r/{token}").text)) is not None:
            pair_id = shown_pair(client, token)
            kind = table.set_index("pair_id").loc[pair_id, "kind"]
            if kind == "main":
                seen += [hashlib.sha256(client.get(u).content).hexdigest() for u in re.findall(r'<img src="([^"]+)"', html)]
            kinds.append(kind)
            client.post(f"/r/{token}/answer", data={"key": m.group(1), "choice": "tie"})
        assert len(kinds) == len(table) and len(seen) == 2 * 2 * 3 * 2
        assert len(set(seen)) == len(seen), "a rater received one image in two main pairs"
    db.dispose(lay.database_url)


def test_legacy_design_files_load_and_serve_as_before(tmp_path):
    """A design.json written before comparison_seeds (no such key) is a shared-seed design: it loads,
    serves the same blocks, and the analysis records it as shared; a damaged value is one error line."""
    layout = make_human_dir(tmp_path / "H", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    design = json.loads(layout.design.read_text())
    assert "comparison_seeds" not in design and design_comparison_seeds(design, layout.design) == "shared"
    client = TestClient(create_app(layout.root), follow_redirects=False)
    state = client.app.state.human
    pairs = pd.read_parquet(layout.pairs).sort_values(["position", "pair_id"])
    kinds = dict(zip(pairs["pair_id"], pairs["kind"], strict=True))
    assert state.assignment(1) == db.assignment(list(pairs["pair_id"]), bytes.fromhex(design["blinding_secret"]), 1,
                                                10, kinds)
    db.dispose(layout.database_url)
    layout.design.write_text(json.dumps({**design, "comparison_seeds": "sometimes"}))
    with pytest.raises(UserError, match=r"comparison_seeds 'sometimes' must be distinct or shared"):
        read_settings(layout)


def test_a_bad_comparison_seeds_is_one_error_line(cli, tmp_path):
    """In the design file: one ``error:`` line, exit code 2, nothing written; in design.json likewise."""
    with pytest.raises(UserError, match=r"comparison_seeds 'per-comparison': use distinct .* or shared"):
        parse_design_spec({"comparison_seeds": "per-comparison"})
    for bad in ("per-comparison", 2, None):
        with pytest.raises(UserError, match="comparison_seeds"):
            parse_design_spec({"comparison_seeds": bad})
    assert parse_design_spec({}).comparison_seeds == "distinct"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"seeds": 2, "comparison_seeds": "per-comparison"}))
    res = cli("human", "design", tmp_path / "study", "--config", cfg, "--out", tmp_path / "out")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and \
        "comparison_seeds 'per-comparison'" in lines[0], res.stderr
    assert not (tmp_path / "out").exists()
    layout = make_human_dir(tmp_path / "H", n_prompts=3, n_seeds=2, n_checks=2, per_rater=4)
    layout.design.write_text(json.dumps({**json.loads(layout.design.read_text()), "comparison_seeds": "both"}))
    res = cli("human", "raters", layout.root, "--base-url", "http://127.0.0.1:8000")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "comparison_seeds 'both' must be distinct or shared" in lines[0]


def test_shipped_design_files_use_distinct_seeds():
    root = Path(__file__).resolve().parents[2] / "analysis" / "human"
    from pcpo_eval.human.design import load_design_spec

    assert all(load_design_spec(f).comparison_seeds == "distinct" for f in sorted(root.glob("*.yaml")))
