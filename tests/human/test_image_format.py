"""What the image files themselves tell: the shown PNGs' bytes and sizes must not name a checkpoint.

A design re-encodes every shown image (``pcpo_eval.human.design._write_images``), so how a set was
written (mode, text / iTXt / eXIf / iCCP chunks, compression level) does not reach a rater: a set
written with every one of those differences gives byte-identical files to one written plainly.
What re-encoding cannot equalise is the pixel grid: a checkpoint rendered at another resolution
(or stored in a lossy format or a palette) would be the side with the other width and height (or
the JPEG artefacts, hence the larger PNG; or the few colours, hence the smaller one) in every pair,
so such a design is refused before any file is written.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image, PngImagePlugin

from pcpo_eval.errors import UserError
from pcpo_eval.human.design import Checkpoint, _write_images, build_pairs, checkpoint_seeds, parse_design_spec
from tests.support.human import write_image_sets

PCPO = Checkpoint("PCPO@120", "pcpo")
BRACKET = [(PCPO, Checkpoint("DDPO@180", "b180")), (PCPO, Checkpoint("DDPO@240", "b240"))]
SPEC = {"seeds": 3, "max_prompts": 4, "per_rater": 10, "identical": 2, "degraded": 2}
SECRET = bytes(range(16))


def _sets(root: Path) -> dict[str, Path]:
    return write_image_sets(root, checkpoint_seeds(BRACKET, 3, "distinct"), 4, rng_seed=2)


def _rewrite(folder: Path, size: tuple[int, int] | None = None, fmt: str = "PNG", colours: int | None = None) -> None:
    """Every image of a set written another way: RGBA, a text, an iTXt, an ICC profile and EXIF,
    compression level 9; ``size``: resampled to it; ``fmt``: another file format (same file name);
    ``colours``: quantised to a palette of that many colours."""
    for f in folder.glob("*.png"):
        with Image.open(f) as im:
            img = im.convert("RGBA")
        if size is not None:
            img = img.resize(size)
        if colours is not None:
            img = img.convert("RGB").quantize(colours)
        if fmt != "PNG":
            img.convert("RGB").save(f, format=fmt, quality=90)
            continue
        info = PngImagePlugin.PngInfo()
        info.add_text("model", "PCPO@120")
        info.add_itxt("method", "pcpo", lang="en")
        img.save(f, format="PNG", pnginfo=info, compress_level=9, icc_profile=b"\0" * 128,
                 exif=b"Exif\0\0MM\0*\0\0\0\x08\0\0")


def _chunks(data: bytes) -> list[str]:
    """The chunk types of a PNG, in order."""
    out, i = [], 8
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        out.append(data[i + 4:i + 8].decode())
        i += 12 + n
    return out


def _written(tmp: Path, sets: dict[str, Path]) -> dict[str, bytes]:
    ds = parse_design_spec(SPEC)
    table, images = build_pairs(BRACKET, sets, ds, SECRET)
    out = tmp / "images"
    out.mkdir()
    _write_images(images, out, SECRET, log=lambda s: None)
    return {f.stem: f.read_bytes() for f in out.glob("*.png")}


def test_how_a_set_was_written_does_not_reach_the_files(tmp_path):
    plain = _written(tmp_path / "a", _sets(tmp_path / "a" / "sets"))
    sets = _sets(tmp_path / "b" / "sets")
    _rewrite(sets["PCPO@120"])
    other = _written(tmp_path / "b", sets)
    assert plain == other  # same secret, same pixels: every file byte-identical
    assert {tuple(_chunks(b)) for b in other.values()} == {("IHDR", "IDAT", "IEND")}


@pytest.mark.parametrize("change", [{"size": (16, 16)}, {"size": (8, 9)}, {"fmt": "JPEG"},
                                    {"colours": 16}])
def test_pairs_whose_images_differ_in_grid_or_format_are_refused(tmp_path, change):
    sets = _sets(tmp_path / "sets")
    _rewrite(sets["DDPO@240"], **change)
    with pytest.raises(UserError, match="DDPO@240") as err:
        build_pairs(BRACKET, sets, parse_design_spec(SPEC), SECRET)
    assert "PCPO@120 vs DDPO@240" in str(err.value)
    assert "DDPO@180" not in str(err.value).split(";")[0]  # the other comparison is fine


def _dithered_sets(root: Path, n_prompts: int, n_seeds: int) -> dict[str, Path]:
    """Two checkpoints with one smooth image per prompt and seed; B@1's carries an invisible +-1 grey-level
    dither (noise no rater sees, but PNG compresses it worse: B's file is the larger one of every pair)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    x = np.linspace(0, 255, 48)
    ramp = np.stack(np.meshgrid(x, x), -1).mean(-1)[..., None]
    sets = {}
    for label in ("A@1", "B@1"):
        (folder := root / label.replace("@", "_")).mkdir(parents=True)
        rows = []
        for p in range(n_prompts):
            for s in range(n_seeds):
                px = ramp * np.random.default_rng(p * 100 + s).uniform(0.3, 1.0, 3)
                if label == "B@1":
                    px = px + rng.integers(-1, 2, px.shape)
                Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(folder / f"{p}_{s}.png")
                rows.append({"prompt_id": p, "prompt": f"thing {p}", "seed": s, "path": f"{p}_{s}.png"})
        pd.DataFrame(rows).to_parquet(folder / "manifest.parquet")
        sets[label] = folder
    return sets


def _layout(data: bytes) -> list[tuple[str, int]]:
    """A PNG's chunks as (type, length), in order: what a PNG viewer shows of a file besides its pixels."""
    out, i = [], 8
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        out.append((data[i + 4:i + 8].decode(), n))
        i += 12 + n
    return out


def test_both_images_of_a_pair_are_served_with_one_length_and_layout(tmp_path):
    """Invisible dither on one arm: compressed, its file is the larger of every main pair (what
    Content-Length, or the IDAT chunk's length in any PNG viewer, would tell a rater). The design writes,
    and the app serves, uncompressed PNGs: every image of the grid has one length and one chunk layout,
    served bytes are the written file's, and they decode to the set's pixels. (Before, the app padded a
    pair to one Content-Length with a private chunk whose own length named the dithered arm in 30 of 30.)"""
    import io
    import json
    import re

    import numpy as np
    from fastapi.testclient import TestClient

    from pcpo_eval.human import HumanLayout, db
    from pcpo_eval.human.app import create_app
    from pcpo_eval.human.settings import ASSIGNMENT_KEYED
    from tests.support.human import KEY_RE, shown_pair

    ds = parse_design_spec({"seeds": 3, "max_prompts": 10, "per_rater": None, "identical": 1, "degraded": 1})
    sets = _dithered_sets(tmp_path / "sets", 10, 3)
    pairs, images = build_pairs([(Checkpoint("A@1", "a"), Checkpoint("B@1", "b"))], sets, ds, SECRET)
    lay = HumanLayout(tmp_path / "human")
    lay.images.mkdir(parents=True)
    _write_images(images, lay.images, SECRET, log=lambda _: None)
    pairs.to_parquet(lay.pairs)
    lay.design.write_text(json.dumps({"rng_seed": 0, "per_rater": None, "blinding_secret": SECRET.hex(),
                                      "comparison_seeds": "distinct", "assignment": ASSIGNMENT_KEYED}))
    main = pairs[pairs["kind"] == "main"].set_index("pair_id")
    source = {lab: {(r.prompt_id, r.seed): f / r.path for r in pd.read_parquet(f / "manifest.parquet").itertuples()}
              for lab, f in zip(("A@1", "B@1"), sets.values(), strict=True)}
    larger_is_b = [(source["B@1"][r.prompt_id, r.seed].stat().st_size > source["A@1"][r.prompt_id, r.seed].stat().st_size)
                   for r in main.itertuples()]
    assert sum(larger_is_b) == len(main) == 30  # compressed, the sets tell the arms apart by size in every pair
    written = {tuple(_layout(f.read_bytes())) for f in lay.images.glob("*.png")}
    assert len(written) == 1  # every written file: one chunk layout (so one length), whatever its pixels
    served = []
    with TestClient(create_app(lay.root), follow_redirects=False) as client:
        (_, token), = db.add_raters(lay.database_url, ["r"])
        while (m := KEY_RE.search(html := client.get(f"/r/{token}").text)) is not None:
            pair_id = shown_pair(client, token)
            if pair_id in main.index:
                row = main.loc[pair_id]
                got = [client.get(u) for u in re.findall(r'<img src="([^"]+)"', html)]
                for r, side in zip(got, ("left", "right"), strict=True):
                    assert r.content == lay.image(row[f"{side}_image"]).read_bytes()
                    with Image.open(source[row[f"{side}_method"]][row.prompt_id, row.seed]) as im:
                        assert np.array_equal(np.asarray(Image.open(io.BytesIO(r.content))), np.asarray(im))
                served.append([(int(r.headers["content-length"]), tuple(_layout(r.content))) for r in got])
            client.post(f"/r/{token}/answer", data={"key": m.group(1), "choice": "tie"})
    db.dispose(lay.database_url)
    assert len(served) == 30 and len({x for pair in served for x in pair}) == 1  # one length, one layout


def test_a_compressed_image_file_is_served_uncompressed(tmp_path):
    """A design written before images were stored uncompressed (or a file edited since): the app re-encodes
    it, so a pair's two images still have one length and layout, and the same pixels."""
    import io

    import numpy as np

    from pcpo_eval.human import shown_png
    from pcpo_eval.human.app import served_png

    sets = _dithered_sets(tmp_path / "sets", 2, 1)
    files = [next(f.glob("0_0.png")) for f in sets.values()]
    assert files[0].stat().st_size != files[1].stat().st_size  # compressed: the lengths differ
    served = [served_png(f) for f in files]
    assert len({len(b) for b in served}) == 1 and _layout(served[0]) == _layout(served[1])
    for b, f in zip(served, files, strict=True):
        with Image.open(f) as im:
            pixels = np.asarray(im.convert("RGB"))
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(b))), pixels) and b == shown_png(pixels)
        (tmp_path / "again.png").write_bytes(b)
        assert served_png(tmp_path / "again.png") == b  # the written form is served as it is
