"""Blinding as a tested property: nothing the app serves predicts which side is PCPO.

A bracket design like the paper's (PCPO@120 against DDPO@180 and DDPO@240, 45 prompts x 10 seeds per
comparison), once with ``comparison_seeds: distinct`` (the default: each comparison on its own seeds)
and once with ``shared`` (PCPO's image of each prompt and seed shown in two pairs), is built by the design code
(:func:`~pcpo_eval.human.design.build_pairs`, :func:`~pcpo_eval.human.design._write_images`) from
image sets written the way ``generate`` writes them: one checkpoint after the other, so the
source files' times follow the checkpoints. 25 raters x 40 pairs then rate through the app as a
browser would (page, both images, answer). Each main pair shown is joined with the design's
private mapping (which side is PCPO) and every signal a rater's browser holds is scored as a
guess of PCPO's side:

* every response header of the two images (a value that differs between the sides: the side with
  the larger value; e.g. ``Last-Modified`` before, when PCPO's image was the older in 450 of 450);
* URL repeats (a side whose URL the rater already saw: before, PCPO's shared image kept one URL);
* position (left), the order of the two URLs, the image files' modification times and names.

A signal passes when it is constant (never tells the sides apart) or, where it does, picks PCPO
at a rate inside the 99.9% binomial band around 1/2. Not tested, and not hidden by the app: the
content itself (pixels, and so the PNG size; here the images are random noise of one size, so
``Content-Length`` carries no method information by construction). Tested besides: no rater
receives the same image bytes in two main pairs (a shared checkpoint's image would name its
side); with shared seeds raters who pool their images can still find such repeats (docs/human.md,
"Blind"), with distinct seeds there are none to find (tests/human/test_comparison_seeds.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from fastapi.testclient import TestClient
from scipy.stats import binomtest

from pcpo_eval.human import HumanLayout, db
from pcpo_eval.human.app import create_app
from pcpo_eval.human.design import (
    Checkpoint,
    _write_images,
    build_pairs,
    checkpoint_seeds,
    new_secret,
    parse_design_spec,
)
from tests.support.human import KEY_RE, shown_pair, write_image_sets

PCPO = "PCPO@120"
N_PROMPTS, N_SEEDS, N_RATERS, PER_RATER = 45, 10, 25, 40
ALPHA = 1e-3  # the band: a signal fails when its binomial p against 1/2 is below this


def _fake_sets(root: Path, seeds: dict[str, list[int]]) -> dict[str, Path]:
    """One image set per checkpoint (label -> its seeds), written checkpoint after checkpoint with rising
    file times."""
    return write_image_sets(root, seeds, N_PROMPTS, rng_seed=3, name="p{p:03d}_s{s:02d}.png",
                            prompt="a photo of thing {p}", mtime_from=1_700_000_000)


@pytest.fixture(scope="module", params=["distinct", "shared"])
def served(tmp_path_factory, request):
    """What 25 raters' browsers received for every main pair they were shown, and the design
    (``comparison_seeds``: the parameter)."""
    tmp = tmp_path_factory.mktemp("blind")
    pcpo = Checkpoint(PCPO, "pcpo")
    bracket = [(pcpo, Checkpoint("DDPO@180", "b180")), (pcpo, Checkpoint("DDPO@240", "b240"))]
    sets = _fake_sets(tmp / "sets", checkpoint_seeds(bracket, N_SEEDS, request.param))
    ds = parse_design_spec({"seeds": N_SEEDS, "max_prompts": N_PROMPTS, "per_rater": PER_RATER, "rng_seed": 11,
                            "identical": 10, "degraded": 10, "comparison_seeds": request.param})
    secret = new_secret()
    pairs, images = build_pairs(bracket, sets, ds, secret)
    lay = HumanLayout(tmp / "human")
    lay.images.mkdir(parents=True)
    _write_images(images, lay.images, secret, log=lambda s: None)
    pairs.to_parquet(lay.pairs)
    lay.design.write_text(json.dumps({"rng_seed": ds.rng_seed, "per_rater": PER_RATER, "blinding_secret": secret.hex(),
                                      "comparison_seeds": ds.comparison_seeds}))
    # one client session: one event-loop portal for its ~4,000 requests instead of one per request
    # (the app has no lifespan handlers, so the requests and what they receive are the same)
    with TestClient(create_app(lay.root), follow_redirects=False) as client:
        tokens = [t for _, t in db.add_raters(lay.database_url, [f"r{i:02d}" for i in range(N_RATERS)])]
        by_id = pairs.set_index("pair_id")
        rows = []
        for rater, token in enumerate(tokens):
            seen: set[str] = set()
            while True:
                html = client.get(f"/r/{token}").text
                m = KEY_RE.search(html)
                if m is None:
                    break
                pair_id = shown_pair(client, token)
                assert pair_id not in html
                pair = by_id.loc[pair_id]
                urls = re.findall(r'<img src="([^"]+)"', html)
                if pair["kind"] == "main":
                    heads = [client.get(u) for u in urls]
                    rows.append({"rater": rater, "pair_id": pair_id, "pcpo_left": pair["left_method"] == PCPO,
                                 "urls": urls, "repeat": [u in seen for u in urls],
                                 "sha": [hashlib.sha256(h.content).hexdigest() for h in heads],
                                 "headers": [dict(h.headers) for h in heads], "status": [h.status_code for h in heads],
                                 "files": [lay.image(pair["left_image"]), lay.image(pair["right_image"])]})
                seen.update(urls)
                client.post(f"/r/{token}/answer", data={"key": m.group(1), "choice": "tie"})
    db.dispose(lay.database_url)
    return rows, pairs, lay


def _check(name: str, picks: list[bool | None]) -> str:
    """``picks``: per pair, True if the signal points at PCPO's side, False if at the other, None if
    it does not tell the sides apart. Passes when constant or inside the binomial band."""
    decided = [p for p in picks if p is not None]
    if not decided:
        return f"{name}: constant"
    k, n = sum(decided), len(decided)
    p = binomtest(k, n, 0.5).pvalue
    assert p >= ALPHA, f"{name} picks PCPO's side in {k} of {n} pairs (p = {p:.2g}): it leaks the method"
    return f"{name}: PCPO in {k} of {n} (p = {p:.2f})"


def _larger_is_pcpo(values: list, pcpo_left: bool) -> bool | None:
    if values[0] == values[1]:
        return None
    left_larger = values[0] > values[1]
    return left_larger == pcpo_left


def test_no_served_signal_predicts_the_method(served):
    rows, pairs, lay = served
    # each signal is tested on pairs that share no image: with shared seeds PCPO's image is in two pairs,
    # whose picks of a file-borne signal (name, time, size) are then one draw counted twice, and the
    # binomial test would reject more often than its level (528 of 950 once, p = 0.00065, for random names)
    indep = list({str(r["files"][0 if r["pcpo_left"] else 1]): r for r in reversed(rows)}.values())
    main = pairs[pairs["kind"] == "main"]
    assert len(rows) >= 900 and all(s == [200, 200] for s in (r["status"] for r in rows))
    # shared seeds: the design shares PCPO's image between the two comparisons (the leak the URLs used
    # to carry); distinct seeds: no image is in two pairs
    shared = pd.concat([main["left_image"], main["right_image"]]).value_counts()
    if json.loads(lay.design.read_text())["comparison_seeds"] == "shared":
        assert (shared == 2).sum() == N_PROMPTS * N_SEEDS
    else:
        assert shared.max() == 1
    report = []
    header_names = sorted({k for r in rows for h in r["headers"] for k in h})
    for name in header_names:
        report.append(_check(f"header {name}", [_larger_is_pcpo([h.get(name, "") for h in r["headers"]],
                                                                r["pcpo_left"]) for r in indep]))
    for r in rows:
        assert "last-modified" not in r["headers"][0] and "etag" not in r["headers"][0]
        assert r["headers"][0]["cache-control"] == "no-store"
    report.append(_check("position (left)", [r["pcpo_left"] for r in indep]))
    report.append(_check("URL order", [_larger_is_pcpo(r["urls"], r["pcpo_left"]) for r in indep]))
    report.append(_check("URL seen before", [None if r["repeat"][0] == r["repeat"][1]
                                             else r["repeat"][0] == r["pcpo_left"] for r in indep]))
    assert not any(any(r["repeat"]) for r in rows), "a rater saw one image URL twice"
    urls = defaultdict(set)
    for r in rows:
        for u in r["urls"]:
            urls[u].add(r["rater"])
    assert all(len(v) == 1 for v in urls.values()), "two raters share an image URL"
    # F2: PCPO's image of one prompt and seed is shared by both comparisons, but no rater is given
    # both pairs of it: no rater receives the same image bytes in two main pairs
    by_rater = defaultdict(list)
    for r in rows:
        by_rater[r["rater"]] += r["sha"]
    repeats = {k: len(v) - len(set(v)) for k, v in by_rater.items() if len(v) != len(set(v))}
    assert repeats == {}, f"raters who received one image twice: {repeats}"
    report.append(_check("file mtime", [_larger_is_pcpo([f.stat().st_mtime_ns for f in r["files"]],
                                                        r["pcpo_left"]) for r in indep]))
    report.append(_check("file name", [_larger_is_pcpo([f.name for f in r["files"]], r["pcpo_left"])
                                       for r in indep]))
    tokens = set(pairs["left_image"]) | set(pairs["right_image"])
    assert not any(t in u for r in rows for u in r["urls"] for t in tokens), "a URL names an image file"
    print("\n" + "\n".join(report))


def test_image_files_do_not_keep_the_render_order(served):
    """File times are one constant, and the write order (inode order on most file systems) does not
    follow the checkpoints either."""
    _, pairs, lay = served
    files = sorted(lay.images.glob("*.png"))
    assert len({f.stat().st_mtime_ns for f in files}) == 1
    main = pairs[pairs["kind"] == "main"]
    method = {}
    for side in ("left", "right"):
        method.update(dict(zip(main[f"{side}_image"], main[f"{side}_method"] == PCPO, strict=True)))
    by_inode = [method[f.stem] for f in sorted(files, key=lambda f: f.stat().st_ino) if f.stem in method]
    first_half = by_inode[: len(by_inode) // 2]
    # PCPO holds 1/3 (shared seeds) or 1/2 (distinct) of the main images; written in checkpoint order it
    # would fill the first third or half
    k, n = sum(first_half), len(first_half)
    assert binomtest(k, n, sum(by_inode) / len(by_inode)).pvalue >= ALPHA, (k, n)
