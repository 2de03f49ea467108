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
