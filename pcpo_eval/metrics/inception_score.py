"""Inception Score with torch-fidelity's conventions (``metric_isc.isc_features_to_metric``).

    IS = exp( E_x KL( p(y|x) || p(y) ) )                               (Salimans et al., 2016)

1. shuffle the N rows with ``np.random.RandomState(2020).permutation(N)`` (class-sorted input,
   e.g. per-prompt ordered images, would otherwise give split-wise marginals and a wrong IS);
2. float64 softmax / log-softmax of the logits (Inception: ``logits_unbiased``);
3. ``splits`` contiguous chunks ``[i N // splits, (i+1) N // splits)``; per chunk
   ``exp(mean_x sum_y p (log p - log q))`` with ``q`` the chunk's mean p;
4. mean and population std (``np.std``, ddof=0) over chunks.

``is_toy`` uses the same function on the toy classifier's logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_SPLITS = 10
DEFAULT_SEED = 2020


@dataclass(frozen=True)
class InceptionScore:
    mean: float
    std: float
    n: int
    splits: int
    shuffle_seed: int | None


def inception_score(
    logits: np.ndarray | torch.Tensor,
    splits: int = DEFAULT_SPLITS,
    shuffle: bool = True,
    seed: int = DEFAULT_SEED,
) -> InceptionScore:
    """IS mean/std from (N, K) logits; ``splits`` must not exceed N."""
    x = torch.as_tensor(np.asarray(logits)).double()
    if x.dim() != 2:
        raise ValueError(f"logits must be (N, K), got {tuple(x.shape)}")
    n = x.shape[0]
    if not 1 <= splits <= n:
        raise ValueError(f"need 1 <= splits ({splits}) <= N ({n})")
    if shuffle:
        x = x[torch.from_numpy(np.random.RandomState(seed).permutation(n))]
    p = x.softmax(dim=1)
    log_p = x.log_softmax(dim=1)
    scores = []
    for i in range(splits):
        lo, hi = i * n // splits, (i + 1) * n // splits
        p_c, log_p_c = p[lo:hi], log_p[lo:hi]
        log_q = p_c.mean(dim=0, keepdim=True).log()
        scores.append(float((p_c * (log_p_c - log_q)).sum(dim=1).mean().exp()))
    return InceptionScore(float(np.mean(scores)), float(np.std(scores)), n, splits, seed if shuffle else None)
