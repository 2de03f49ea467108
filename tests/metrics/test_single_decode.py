"""One decode pass per set: every image of a call is read, verified and decoded once for all metrics."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from pcpo_eval.features.base import clean_resize, pil_uint8_resize
from pcpo_eval.imageset import ImageSet
from pcpo_eval.metrics.extract import MetricsOptions
from pcpo_eval.metrics.workers import compute_metrics
from tests.support.metrics import TOY_PROMPTS, StandInToyClassifier, make_image_set


def _opts(cache: Path) -> MetricsOptions:
    return MetricsOptions(batch_size=4, cache_dir=cache, lpips_batch=3,
                          extractor_options={"toy": {"classifier": StandInToyClassifier(0)}})


def test_fd_is_lpips_decode_each_image_once(tmp_path, monkeypatch):
    a = make_image_set(tmp_path / "a", TOY_PROMPTS, list(range(6)))
    b = make_image_set(tmp_path / "b", TOY_PROMPTS, list(range(50, 56)))
    reads: Counter = Counter()
    real = ImageSet.read_image

    def counting(self, row):
        reads[(self.root.name, int(row))] += 1
        return real(self, row)

    monkeypatch.setattr(ImageSet, "read_image", counting)
    first = compute_metrics(a, "fd_toy,is_toy,lpips_toy", b, _opts(tmp_path / "c"))
    n = len(TOY_PROMPTS) * 6
    assert sum(1 for k in reads if k[0] == "a") == n and sum(1 for k in reads if k[0] == "b") == n
    assert set(reads.values()) == {1}, "an image was decoded more than once in one call"
    reads.clear()
    again = compute_metrics(a, "fd_toy,is_toy,lpips_toy", b, _opts(tmp_path / "c"))
    assert not reads, "a warm cache decodes nothing"
    assert again.metrics == pytest.approx(first.metrics, rel=1e-12)
    # the values equal a call that computes each metric on its own (separate caches)
    for m in ("fd_toy", "is_toy", "lpips_toy"):
        alone = compute_metrics(a, m, b, _opts(tmp_path / f"c_{m}"))
        assert alone.metrics[m] == pytest.approx(first.metrics[m], rel=1e-9), m


def test_parallel_resize_equals_serial():
    """The thread-pool resizes give the per-image loop's values bit for bit."""
    from PIL import Image

    imgs = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (5, 3, 40, 40), dtype=np.uint8))
    arr = imgs.permute(0, 2, 3, 1).numpy()
    serial = np.stack([np.stack([np.asarray(Image.fromarray(arr[i, :, :, c].astype(np.float32), mode="F").resize(
        (29, 29), resample=Image.BICUBIC)).clip(0, 255) for c in range(3)]) for i in range(5)])
    assert np.array_equal(clean_resize(imgs, 29).numpy(), serial)
    serial8 = np.stack([np.asarray(Image.fromarray(arr[i], mode="RGB").resize((29, 29), resample=Image.BICUBIC))
                        for i in range(5)]).transpose(0, 3, 1, 2)
    assert np.array_equal(pil_uint8_resize(imgs, 29).numpy(), serial8)


def test_metrics_progress_bar_on_stderr_only_when_asked(tmp_path, capsys):
    a = make_image_set(tmp_path / "a", TOY_PROMPTS, list(range(4)))
    for flag, shown in ((True, True), (False, False), (None, False)):  # None: stderr is not a terminal here
        opts = _opts(tmp_path / f"c{flag}")
        opts.progress = flag
        capsys.readouterr()
        compute_metrics(a, "is_toy", None, opts)
        out = capsys.readouterr()
        assert ("metrics a" in out.err) is shown, (flag, out.err[-300:])
        assert "metrics a" not in out.out



def test_read_batch_fills_pils_pixels_channels_first(tmp_path):
    """read_batch: rows in the asked order, (B, 3, H, W) uint8, exactly PIL's RGB pixels of each file."""
    from PIL import Image

    s = ImageSet.load(make_image_set(tmp_path / "a", TOY_PROMPTS, [0, 1]))
    order = [2, 0, 1, 2]
    batch = s.read_batch(order)
    assert batch.shape == (4, 3, s.size[1], s.size[0]) and batch.dtype == torch.uint8 and batch.is_contiguous()
    for i, r in enumerate(order):
        with Image.open(s.root / s.paths[r]) as im:
            assert np.array_equal(batch[i].permute(1, 2, 0).numpy(), np.asarray(im.convert("RGB")))
    assert s.read_batch([]).shape == (0, 3, s.size[1], s.size[0])


def test_parallel_map_chunks_keep_order_and_the_first_error():
    """Contiguous chunks per pool thread: the results in item order, the first failing item's error."""
    from pcpo_eval.io import parallel_map

    for n in (0, 1, 2, 7, 63, 64, 65, 1001):
        assert parallel_map(lambda x: x * x, list(range(n))) == [x * x for x in range(n)]

    def fails(x: int) -> int:
        if x in (500, 900):
            raise ValueError(f"item {x}")
        return x

    with pytest.raises(ValueError, match="item 500"):
        parallel_map(fails, list(range(1001)))


def test_verify_hashes_a_file_once_whatever_path_reaches_it(tmp_path, monkeypatch):
    """The verified-file cache is keyed by the file (device, inode, size, mtime), not the path string:
    a set reached through a symlinked folder is not hashed again; a file rewritten in place is."""
    import pcpo_eval.imageset as imageset

    make_image_set(tmp_path / "a", TOY_PROMPTS, list(range(3)))
    (tmp_path / "link").symlink_to(tmp_path / "a")
    hashed: Counter = Counter()
    real = imageset.sha256_file

    def counting(path):
        hashed[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(imageset, "sha256_file", counting)
    monkeypatch.setattr(imageset, "_VERIFIED", set())
    ImageSet.load(tmp_path / "a").verify()
    n = len(TOY_PROMPTS) * 3
    assert sum(hashed.values()) == n
    ImageSet.load(tmp_path / "link").verify()
    ImageSet.load(tmp_path / "a").verify()
    assert sum(hashed.values()) == n, "an unchanged file was hashed again"
    s = ImageSet.load(tmp_path / "a")
    victim = s.root / s.paths[4]
    data = bytearray(victim.read_bytes())
    data[-20] ^= 0xFF  # same size
    before = victim.stat().st_mtime_ns
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(before, before + 10**9))  # a new mtime even on a coarse-timestamp file system
    with pytest.raises(imageset.UserError, match="does not match its image_sha256"):
        ImageSet.load(tmp_path / "link").verify()
