"""Mergeable sufficient statistics, torchmetrics-style, reduced with ``torch.distributed``.

Like torchmetrics' ``FrechetInceptionDistance`` (states ``sum``, ``cov_sum``, ``n`` with
``dist_reduce_fx="sum"``), a :class:`GaussianStats` keeps

    n,   s = sum_i x_i,   S = sum_i x_i x_i^T          (float64)

so shards from several processes (or several batches) merge exactly by addition and memory does
not grow with N. mean = s / n; cov = (S - n mu mu^T) / (n - 1) (ddof=1, as ``np.cov``).
Shapes are fixed by d, so ``all_reduce(SUM)`` works across ranks; a rank with no rows contributes
zeros.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pcpo_eval import dist


@dataclass
class GaussianStats:
    """Running (n, sum, outer-product sum) of d-dimensional features."""

    dim: int
    n: int = 0
    sum: np.ndarray = field(default=None)  # type: ignore[assignment]
    outer: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.sum is None:
            self.sum = np.zeros(self.dim, dtype=np.float64)
        if self.outer is None:
            self.outer = np.zeros((self.dim, self.dim), dtype=np.float64)

    def update(self, features: np.ndarray | torch.Tensor) -> GaussianStats:
        """Add a batch of (B, d) features (in place; returns self)."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected (B, {self.dim}) features, got {x.shape}")
        self.n += x.shape[0]
        self.sum += x.sum(axis=0)
        self.outer += x.T @ x
        return self

    def merge(self, other: GaussianStats) -> GaussianStats:
        """Exact merge of two shards (in place; returns self)."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge d={other.dim} into d={self.dim}")
        self.n += other.n
        self.sum += other.sum
        self.outer += other.outer
        return self

    def all_reduce(self) -> GaussianStats:
        """Sum the statistics over all ranks (no-op without an initialized process group)."""
        if dist.world_size() > 1:
            for name in ("sum", "outer"):
                setattr(self, name, dist.all_reduce_sum(torch.from_numpy(getattr(self, name))).numpy())
            self.n = int(dist.all_reduce_sum(torch.tensor([self.n], dtype=torch.int64)).item())
        return self

    def mean(self) -> np.ndarray:
        if self.n < 1:
            raise ValueError("no features accumulated")
        return self.sum / self.n

    def cov(self) -> np.ndarray:
        """Unbiased covariance (ddof=1)."""
        if self.n < 2:
            raise ValueError(f"need at least 2 features for a covariance, have {self.n}")
        mu = self.mean()
        c = (self.outer - self.n * np.outer(mu, mu)) / (self.n - 1)
        return (c + c.T) / 2
