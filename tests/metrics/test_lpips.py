"""LPIPS diversity: per-image embeddings + Gram identity equal naive pairwise `lpips` calls."""

from __future__ import annotations

from pathlib import Path

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
