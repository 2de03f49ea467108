"""Cross-checks of pcpo-eval's FD and IS kernels against torchmetrics' implementations.

torchmetrics (a dependency for exactly this) computes FID and IS from any feature module; given
the identity as its "network", its numbers are functions of the same features ours see, so the
two must agree up to floating point. Why the kernels themselves are our own: docs/design.md.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.image.inception import InceptionScore as TMInceptionScore

from pcpo_eval.metrics.frechet import frechet_distance_from_features
from pcpo_eval.metrics.inception_score import inception_score

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torchmetrics: feature buffers, 1-split std


class _Identity(torch.nn.Module):
    """A 'feature extractor' that returns its input: the metric then sees our features as they are."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.num_features = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize(("n_real", "n_fake", "d", "shift"), [(300, 200, 8, 0.3), (120, 160, 24, 0.0), (80, 80, 6, 2.0)])
def test_frechet_distance_matches_torchmetrics_fid(n_real, n_fake, d, shift):
    rng = np.random.default_rng(d)
    real = rng.normal(size=(n_real, d))
    fake = rng.normal(shift, 1.3, size=(n_fake, d)) @ rng.normal(size=(d, d)) * 0.5
    tm = FrechetInceptionDistance(feature=_Identity(d), normalize=True)
    tm.set_dtype(torch.float64)
    tm.update(torch.from_numpy(real), real=True)
    tm.update(torch.from_numpy(fake), real=False)
    ours = frechet_distance_from_features(fake, real)
    assert ours == pytest.approx(float(tm.compute()), rel=1e-6, abs=1e-8)
    assert ours > 0


@pytest.mark.parametrize("k", [5, 40])
def test_inception_score_matches_torchmetrics_with_one_split(k):
    # torchmetrics shuffles with torch.randperm before splitting; with one split the order is moot
    logits = torch.from_numpy(np.random.default_rng(k).normal(0, 2.0, size=(64, k)))
    tm = TMInceptionScore(feature=_Identity(k), splits=1, normalize=False)
    tm.set_dtype(torch.float64)
    tm.update(logits)
    tm_mean, _ = tm.compute()
    ours = inception_score(logits.numpy(), splits=1, shuffle=False)
    assert ours.mean == pytest.approx(float(tm_mean), rel=1e-9)
    assert 1.0 < ours.mean < k
