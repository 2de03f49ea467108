"""Inception Score with torch-fidelity's conventions (``metric_isc.isc_features_to_metric``).

    IS = exp( E_x KL( p(y|x) || p(y) ) )                               (Salimans et al., 2016)

1. shuffle the N rows with ``np.random.RandomState(2020).permutation(N)`` (class-sorted input,
   e.g. per-prompt ordered images, would otherwise give split-wise marginals and a wrong IS);
2. float64 softmax / log-softmax of the logits (Inception: ``logits_unbiased``);
3. ``splits`` contiguous chunks ``[i N // splits, (i+1) N // splits)``; per chunk
   ``exp(mean_x sum_y p (log p - log q))`` with ``q`` the chunk's mean p;
4. mean and population std (``np.std``, ddof=0) over chunks.

The logits are those of the FID pass (clean-fid's antialiased 299-px resize), not of torch-fidelity's
TF1 bilinear resize without antialiasing: on images above 299 px IS here is not torch-fidelity's
``calculate_metrics(isc=True)`` on the same files (docs/metrics.md).

``is_toy`` uses the same function on the toy classifier's logits. Per prompt, the prompt's images
are split into min(splits, n) chunks (see :func:`pcpo_eval.metrics.base.per_prompt_problem`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pcpo_eval.features import FeatureExtractor
from pcpo_eval.metrics.base import IS_DEFAULT_SEED, IS_DEFAULT_SPLITS, MetricInfo
from pcpo_eval.metrics.extract import MetricsOptions
from pcpo_eval.metrics.metric import EvalData, Metric, MetricValues


@dataclass(frozen=True)
class InceptionScore:
    mean: float
    std: float
    n: int
    splits: int
    shuffle_seed: int | None


def inception_score(
    logits: np.ndarray | torch.Tensor,
    splits: int = IS_DEFAULT_SPLITS,
    shuffle: bool = True,
    seed: int = IS_DEFAULT_SEED,
) -> InceptionScore:
    """IS mean/std from (N, K) logits; ``splits`` must not exceed N."""
    x = torch.as_tensor(np.asarray(logits)).double()
    if x.dim() != 2:
        raise ValueError(f"logits must be (N, K), got {tuple(x.shape)}")
    n = x.shape[0]
    if not 1 <= splits <= n:
        raise ValueError(f"need 1 <= splits ({splits}) <= N ({n})")
    scores = _split_scores(x[None], splits, shuffle, seed)[0]
    return InceptionScore(float(np.mean(scores)), float(np.std(scores)), n, splits, seed if shuffle else None)


def _split_scores(x: torch.Tensor, splits: int, shuffle: bool, seed: int) -> np.ndarray:
    """Steps 1-3 of the module docstring for G sets of N images at once: (G, N, K) float64 logits ->
    (G, splits) split scores. Every set gets the same permutation (it depends on N and the seed only)."""
    n = x.shape[1]
    if shuffle:
        x = x[:, torch.from_numpy(np.random.RandomState(seed).permutation(n))]
    p, log_p = x.softmax(dim=2), x.log_softmax(dim=2)
    scores = []
    for i in range(splits):
        lo, hi = i * n // splits, (i + 1) * n // splits
        p_c, log_p_c = p[:, lo:hi], log_p[:, lo:hi]
        log_q = p_c.mean(dim=1, keepdim=True).log()
        scores.append((p_c * (log_p_c - log_q)).sum(dim=2).mean(dim=1).exp())
    return torch.stack(scores, dim=1).numpy()


def per_prompt_inception_scores(
    logits: np.ndarray, rows: dict[int, np.ndarray], splits: int = IS_DEFAULT_SPLITS, seed: int = IS_DEFAULT_SEED,
) -> dict[int, InceptionScore]:
    """:func:`inception_score` of each prompt's rows with min(splits, n) splits, the prompts of one image count
    computed together (a 5,000-prompt set: one batched pass per count instead of 5,000 small ones)."""
    by_count: dict[int, list[int]] = {}
    for pid, r in rows.items():
        by_count.setdefault(len(r), []).append(pid)
    out: dict[int, InceptionScore] = {}
    for n, pids in by_count.items():
        s = min(splits, n)
        chunk = max(1, 2**22 // (n * logits.shape[1]))  # ~32 MB of float64 logits per pass
        for c in range(0, len(pids), chunk):
            part = pids[c:c + chunk]
            x = torch.as_tensor(logits[np.stack([rows[p] for p in part])]).double()
            scores = _split_scores(x, s, True, seed)
            for pid, sc in zip(part, scores, strict=True):
                out[pid] = InceptionScore(float(np.mean(sc)), float(np.std(sc)), n, s, seed)
    return {pid: out[pid] for pid in rows}


# ----------------------------------------------------------------------------- the metric (kind "is")


class InceptionScoreMetric(Metric):
    """IS / is_toy overall and per prompt (mean and split std), torch-fidelity conventions.

    State ``logits`` is replicated: every rank reads all of them back from the shared feature
    cache, and the shuffled splits need the whole set, so each rank computes the same numbers.
    """

    kind = "is"

    def __init__(
        self, info: MetricInfo, extractors: dict[str, FeatureExtractor], options: MetricsOptions
    ) -> None:
        super().__init__(info)
        self.splits, self.seed = options.is_splits, options.is_seed
        self.add_state("logits", np.zeros((0, 0), np.float32), "replicated")
        self.rows: dict[int, np.ndarray] = {}

    @staticmethod
    def extractor_outputs(info: MetricInfo) -> dict[str, tuple[str, ...]]:
        return {info.source: ("logits",)}

    def update(self, data: EvalData) -> None:
        self.logits = data.outputs[self.info.source]["logits"]
        self.rows = data.rows

    def compute(self) -> MetricValues:
        name = self.name
        res = inception_score(self.logits, self.splits, True, self.seed)
        per = per_prompt_inception_scores(self.logits, self.rows, self.splits, self.seed)
        return MetricValues(
            {name: res.mean, f"{name}_std": res.std},
            {name: {p: v.mean for p, v in per.items()}, f"{name}_std": {p: v.std for p, v in per.items()}},
        )

    def settings(self) -> dict[str, Any]:
        return {
            "inception_score": {
                "convention": "torch-fidelity isc_features_to_metric",
                "inputs": "the Inception logits of the FID pass (clean-fid's 299-px resize, not torch-fidelity's "
                          "TF1 bilinear one)",
                "splits": self.splits,
                "shuffle_seed": self.seed,
                "shuffle": "np.random.RandomState(seed).permutation(N)",
                "std": "population (ddof=0)",
                "per_prompt_splits": f"min({self.splits}, images of the prompt)",
                "n": len(self.logits),
            }
        }
