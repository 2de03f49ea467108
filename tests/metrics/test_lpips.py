"""LPIPS diversity: per-image embeddings + Gram identity equal naive pairwise `lpips` calls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.metrics.lpips_diversity import (
    PairwiseAccumulator,
    ToyLpipsEmbedder,
    lin_weights_path,
    lpips_diversity,
    make_lpips_embedder,
    naive_lpips_diversity,
    normalize_channels,
    pairwise_distances,
)
from tests.support.metrics import StandInToyClassifier

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def embedder():
    return make_lpips_embedder("random", seed=0)


def _images(n: int, size: int = 48, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def test_lin_layers_come_from_the_wheel(embedder) -> None:
    import lpips

    state = torch.load(lin_weights_path(), map_location="cpu", weights_only=True)
    assert torch.equal(embedder.model.lin0.model[1].weight, state["lin0.model.1.weight"])
    assert all((lin.model[-1].weight >= 0).all() for lin in embedder.model.lins)
    assert Path(lpips.__file__).parent in lin_weights_path().parents


def test_mean_over_pairs_equals_naive_lpips(embedder) -> None:
    imgs = _images(9)
    ours = lpips_diversity(embedder, imgs, batch=4)
    ref = naive_lpips_diversity(embedder.model, imgs)
    assert ours == pytest.approx(ref, rel=1e-5)


def test_block_gram_matrix_equals_pairwise_calls(embedder) -> None:
    imgs = _images(6, seed=1)
    d = pairwise_distances(embedder(imgs), block=4)
    x = imgs.float() / 127.5 - 1
    with torch.no_grad():
        for i, j in [(0, 1), (2, 5), (4, 3), (1, 5)]:
            assert float(d[i, j]) == pytest.approx(
                float(embedder.model(x[i : i + 1], x[j : j + 1])), rel=1e-5
            )
    assert torch.allclose(d, d.T) and torch.all(d.diagonal() == 0)


def test_identical_images_give_zero_and_accumulators_merge(embedder) -> None:
    imgs = _images(1).repeat(4, 1, 1, 1)
    assert lpips_diversity(embedder, imgs) == pytest.approx(0.0, abs=1e-9)
    g = embedder(_images(7, seed=2))
    whole = PairwiseAccumulator().update(g)
    parts = PairwiseAccumulator().update(g[:3]).merge(PairwiseAccumulator().update(g[3:]))
    assert parts.mean_distance() == pytest.approx(whole.mean_distance(), rel=1e-6)
    with pytest.raises(ValueError):
        PairwiseAccumulator().update(g[:1]).mean_distance()


def test_lpips_toy_equals_naive_uniform_weight_definition() -> None:
    clf = StandInToyClassifier(seed=3)
    emb = ToyLpipsEmbedder(lambda im: clf(im)["layers"], {})
    imgs = _images(5, size=32, seed=4)
    layers = clf(imgs)["layers"]
    total, pairs = 0.0, 0
    for i in range(5):
        for j in range(i + 1, 5):
            d = sum(
                ((normalize_channels(f[i : i + 1]) - normalize_channels(f[j : j + 1])) ** 2)
                .sum(1)
                .mean()
                .item()
                for f in layers
            )
            total, pairs = total + d, pairs + 1
    assert lpips_diversity(emb, imgs) == pytest.approx(total / pairs, rel=1e-5)


def test_real_trunk_is_never_downloaded(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setenv("PCPO_WEIGHTS_DIR", str(tmp_path))
    monkeypatch.delenv("PCPO_ALEXNET_WEIGHTS", raising=False)
    with pytest.raises(MissingWeightsError, match="PCPO_ALEXNET_WEIGHTS"):
        make_lpips_embedder(None)


def test_real_trunk_loads_from_a_local_torchvision_file(tmp_path) -> None:
    import torchvision

    alex = torchvision.models.alexnet(weights=None)
    path = tmp_path / "alexnet.pth"
    torch.save(alex.state_dict(), path)
    emb = make_lpips_embedder(str(path))
    assert torch.equal(getattr(emb.model.net.slice2, "3").weight, alex.features[3].weight)
    assert emb.info["trunk_sha256"]


def _host_reference(embedder, images: torch.Tensor, batch: int) -> float:
    """The pre-device path: g = embedder(x) on the host, accumulated per chunk of ``batch`` images."""
    acc = PairwiseAccumulator()
    for i in range(0, images.shape[0], batch):
        acc.update(embedder(images[i : i + batch]))
    return acc.mean_distance()


def test_segment_moments_equal_the_host_embedding(embedder) -> None:
    imgs = _images(11, size=40, seed=5)
    segments = [(0, 3), (3, 4), (4, 11)]
    accs = embedder.moments(imgs, segments)
    g = embedder(imgs)
    for (a, b), acc in zip(segments, accs, strict=True):
        ref = PairwiseAccumulator().update(g[a:b])
        assert acc.n == b - a
        torch.testing.assert_close(acc.mean, ref.mean, rtol=1e-6, atol=1e-9)
        assert float(acc.m2) == pytest.approx(float(ref.m2), rel=1e-6, abs=1e-12)
    assert accs[0].mean_distance() == pytest.approx(naive_lpips_diversity(embedder.model, imgs[:3]), rel=1e-5)


def test_consumer_regrouped_batches_equal_per_prompt_lpips(embedder) -> None:
    """Decode batches that split prompts, trunk batches that span prompts, parked open prompts: every
    prompt's value equals the host path to 1e-6 and naive per-pair ``lpips`` to 1e-5."""
    from types import SimpleNamespace

    from pcpo_eval.metrics.lpips_diversity import _LpipsConsumer

    imgs = _images(21, size=36, seed=6)
    prompt_rows = {0: [0, 3, 6, 9, 12, 15, 18], 1: [1, 4, 7, 10, 13], 2: [2, 5, 8, 11, 14, 16, 17, 19, 20]}
    done: dict[int, float] = {}
    metric = SimpleNamespace(name="lpips", embedder=embedder,
                             _finish=lambda pid, acc, path: done.__setitem__(pid, acc.mean_distance()))
    data = SimpleNamespace(options=SimpleNamespace(lpips_batch=4), rows=prompt_rows)
    consumer = _LpipsConsumer(metric, data, {pid: Path(f"p{pid}") for pid in prompt_rows})
    for i in range(0, 21, 8):
        rows = list(range(i, min(i + 8, 21)))
        consumer.consume(rows, imgs[rows])
        assert all(acc.mean is None or acc.mean.device.type == "cpu" for acc in consumer.acc.values())
    assert sorted(done) == [0, 1, 2] and not consumer.acc
    for pid, rows in prompt_rows.items():
        assert done[pid] == pytest.approx(_host_reference(embedder, imgs[rows], batch=4), rel=1e-6)
        assert done[pid] == pytest.approx(naive_lpips_diversity(embedder.model, imgs[rows]), rel=1e-5)


def test_toy_moments_equal_the_host_embedding() -> None:
    clf = StandInToyClassifier(seed=7)
    emb = ToyLpipsEmbedder(lambda im: clf(im)["layers"], {})
    imgs = _images(6, size=32, seed=8)
    assert lpips_diversity(emb, imgs, batch=4) == pytest.approx(_host_reference(emb, imgs, batch=4), rel=1e-6)


@pytest.mark.parametrize("metric", ["lpips", "lpips_toy"])
def test_update_path_equals_the_decode_pass_consumer(tmp_path, monkeypatch, metric) -> None:
    """``LpipsDiversityMetric.update`` (prompts no consumer computed) gives the consumer's per-prompt values."""
    from pcpo_eval.metrics.extract import MetricsOptions
    from pcpo_eval.metrics.lpips_diversity import LpipsDiversityMetric
    from pcpo_eval.metrics.workers import compute_metrics
    from tests.support.metrics import TOY_PROMPTS, make_image_set

    a = make_image_set(tmp_path / "a", TOY_PROMPTS, [0, 1, 2, 3, 4])

    def opts(cache: str) -> MetricsOptions:
        return MetricsOptions(batch_size=4, cache_dir=tmp_path / cache, lpips_batch=3, lpips_trunk="random",
                              extractor_options={"toy": {"classifier": StandInToyClassifier(0)}})

    consumer = compute_metrics(a, metric, None, opts("c1")).per_prompt[metric]
    monkeypatch.setattr(LpipsDiversityMetric, "image_consumer", lambda self, data: None)
    update = compute_metrics(a, metric, None, opts("c2")).per_prompt[metric]
    assert len(update) == len(TOY_PROMPTS)
    np.testing.assert_allclose(update, consumer, rtol=1e-6)
