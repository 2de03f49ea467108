"""Frechet distance between Gaussians fitted to features (FID, FD-DINOv2, fd_toy), float64.

    FD = ||mu1 - mu2||^2 + tr(S1) + tr(S2) - 2 tr((S1 S2)^{1/2})        (Heusel et al., 2017)

The trace of the matrix square root comes from eigenvalues instead of ``scipy.linalg.sqrtm`` (the
path clean-fid and dgm-eval use): for any R with R R^T = S1, S1 S2 = R (R^T S2 R) R^{-1} is similar
to the symmetric PSD matrix M = R^T S2 R, so tr((S1 S2)^{1/2}) = sum_i sqrt(lambda_i(M)).
R = Cholesky factor of S1 (fast path) or its symmetric root (rank-deficient S1). A symmetric
eigenvalue problem is faster and more robust than a Schur-based sqrtm of a non-symmetric matrix
(torch-fidelity / torchmetrics use ``eigvals(S1 @ S2)``, the same identity). Tiny negative
eigenvalues from round-off are clipped to 0 and *reported* in :class:`FrechetResult`, not hidden.
Means/covariances: float64, ddof=1 (numpy ``cov`` default, as in clean-fid).

FD >= 0, but it is a difference of terms of size ``scale = ||mu1-mu2||^2 + tr(S1) + tr(S2)``, and
eigenvalues that are 0 in exact arithmetic come out as +-eps (their square roots, ~sqrt(eps), add
up), so a set against itself can give -1e-6. A value in ``[-FD_ZERO_RTOL * scale, 0)`` is
returned as exactly 0.0 and the raw value is kept in :class:`FrechetResult` (``clamped_to_zero``,
``raw_value``); a more negative value is returned as is (a real numerical problem, not rounding).
Two bitwise-identical Gaussians short-cut to 0.0 (``method="identical"``): FD(N, N) = 0 exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from pcpo_eval import dist
from pcpo_eval.features import FeatureExtractor
from pcpo_eval.metrics.base import MetricInfo
from pcpo_eval.metrics.extract import MetricsOptions, extract_set
from pcpo_eval.metrics.metric import EvalData, Metric, MetricValues
from pcpo_eval.metrics.state import GaussianStats

#: relative tolerance of the rounding clamp: raw FD in [-FD_ZERO_RTOL * scale, 0) -> 0.0
FD_ZERO_RTOL = 1e-6


@dataclass(frozen=True)
class FrechetResult:
    """FD value plus the numerical diagnostics of the trace-sqrt term."""

    value: float
    mean_term: float
    trace_term: float
    #: sum of |negative eigenvalues| clipped to 0 in S1 and in M (round-off indicator)
    clipped_negative_mass: float
    n_clipped: int
    #: "cholesky" (S1 positive definite), "eigh" (rank-deficient S1), "lowrank-svd" (from the samples,
    #: :func:`frechet_distance_lowrank`) or "identical" (same Gaussians)
    method: str = "cholesky"
    #: FD before the rounding clamp (``value`` is 0.0 when ``clamped_to_zero``)
    raw_value: float = 0.0
    #: a tiny negative raw value (within FD_ZERO_RTOL * scale of 0) was reported as 0.0
    clamped_to_zero: bool = False

    def diagnostics(self) -> dict[str, float | int | str | bool]:
        """The numerical details a metrics.json records next to the value."""
        return {
            "clipped_negative_eigen_mass": self.clipped_negative_mass,
            "n_clipped": self.n_clipped,
            "method": self.method,
            "raw_value": self.raw_value,
            "clamped_to_zero": self.clamped_to_zero,
        }


def gaussian_stats(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (ddof=1) in float64 of (N, d) features; N >= 2."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"need (N >= 2, d) features for a covariance, got shape {x.shape}")
    return x.mean(axis=0), np.cov(x, rowvar=False, ddof=1).reshape(x.shape[1], x.shape[1])


def _psd_sqrt(s: np.ndarray) -> tuple[np.ndarray, float, int]:
    """Symmetric square root of a PSD matrix by eigh; returns (root, clipped mass, n clipped)."""
    w, v = scipy.linalg.eigh(s, check_finite=False, driver="evd")
    neg = w < 0
    root = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    return root, float(-w[neg].sum()), int(neg.sum())


def trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray) -> tuple[float, float, int, str]:
    """tr((S1 S2)^{1/2}) = sum sqrt(eig(R^T S2 R)) for any R with R R^T = S1.

    R is the Cholesky factor L of S1 when S1 is positive definite (one ``potrf``, two triangular
    multiplies, one eigenvalues-only ``syevd``: the fast path), else the symmetric root from
    ``eigh`` (rank-deficient S1, e.g. per-prompt FD with N < d). Returns (trace, clipped negative
    eigenvalue mass, number clipped, method).
    """
    s1 = np.asarray(sigma1, dtype=np.float64)
    s2 = np.asarray(sigma2, dtype=np.float64)
    s1 = (s1 + s1.T) / 2
    s2 = np.ascontiguousarray((s2 + s2.T) / 2)
    try:
        low = scipy.linalg.cholesky(s1, lower=True, check_finite=False)
        # M = L^T S2 L via BLAS trmm (triangular, half the flops of a general matmul)
        right = scipy.linalg.blas.dtrmm(1.0, low, s2, side=1, lower=1)
        m = scipy.linalg.blas.dtrmm(1.0, low, right, side=0, lower=1, trans_a=1)
        mass1, n1, method = 0.0, 0, "cholesky"
    except np.linalg.LinAlgError:
        root1, mass1, n1 = _psd_sqrt(s1)
        m = root1 @ s2 @ root1
        method = "eigh"
    ev = scipy.linalg.eigh((m + m.T) / 2, eigvals_only=True, check_finite=False, driver="evd")
    neg = ev < 0
    return (
        float(np.sqrt(np.clip(ev, 0, None)).sum()),
        mass1 + float(-ev[neg].sum()),
        n1 + int(neg.sum()),
        method,
    )


def frechet_distance_details(
    mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray
) -> FrechetResult:
    """Frechet distance with diagnostics (all float64)."""
    mu1, mu2 = np.atleast_1d(np.asarray(mu1, np.float64)), np.atleast_1d(np.asarray(mu2, np.float64))
    sigma1, sigma2 = (
        np.atleast_2d(np.asarray(sigma1, np.float64)),
        np.atleast_2d(np.asarray(sigma2, np.float64)),
    )
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape or sigma1.shape != (mu1.size, mu1.size):
        raise ValueError(
            f"shape mismatch: mu {mu1.shape} vs {mu2.shape}, sigma {sigma1.shape} vs {sigma2.shape}"
        )
    if np.array_equal(mu1, mu2) and np.array_equal(sigma1, sigma2):
        return FrechetResult(0.0, 0.0, 0.0, 0.0, 0, "identical", 0.0, False)
    diff = mu1 - mu2
    mean_term = float(diff @ diff)
    tr_sqrt, mass, n, method = trace_sqrt_product(sigma1, sigma2)
    trace_term = float(np.trace(sigma1) + np.trace(sigma2) - 2.0 * tr_sqrt)
    raw = mean_term + trace_term
    value, clamped = clamp_rounding(raw, mean_term + float(np.trace(sigma1) + np.trace(sigma2)))
    return FrechetResult(value, mean_term, trace_term, mass, n, method, raw, clamped)


def clamp_rounding(raw: float, scale: float, rtol: float = FD_ZERO_RTOL) -> tuple[float, bool]:
    """(0.0, True) for a raw FD in [-rtol * scale, 0) (round-off of a zero distance), else (raw, False)."""
    if -rtol * abs(scale) <= raw < 0.0:
        return 0.0, True
    return raw, False


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """FD = ||mu1-mu2||^2 + tr(S1) + tr(S2) - 2 tr((S1 S2)^{1/2}) (same argument order as clean-fid)."""
    return frechet_distance_details(mu1, sigma1, mu2, sigma2).value


def frechet_distance_sqrtm(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """Reference path of clean-fid / dgm-eval: ``scipy.linalg.sqrtm(S1 @ S2)`` (tests and benchmark only)."""
    diff = np.asarray(mu1, np.float64) - np.asarray(mu2, np.float64)
    covmean = scipy.linalg.sqrtm(np.asarray(sigma1, np.float64) @ np.asarray(sigma2, np.float64))
    covmean = np.real(covmean)
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


def frechet_distance_from_features(x: np.ndarray, y: np.ndarray) -> float:
    """FD between two (N, d) feature arrays."""
    return frechet_distance(*gaussian_stats(x), *gaussian_stats(y))


# ----------------------------------------------------------------------------- the metric (kind "fd")


def frechet_distance_lowrank(x: np.ndarray, y: np.ndarray) -> FrechetResult:
    """FD of two small feature samples (n1, n2 <= d) without any d x d matrix: exact, O(n1 n2 d).

    With centred A = X1c^T / sqrt(n1 - 1) and B = X2c^T / sqrt(n2 - 1) (d x n), S1 = A A^T and
    S2 = B B^T, so the non-zero eigenvalues of S1 S2 are those of C C^T with C = A^T B (n1 x n2), and

        tr((S1 S2)^{1/2}) = sum of the singular values of C,   tr(S1) = ||A||_F^2,   tr(S2) = ||B||_F^2.

    This is the per-prompt FD's case (10-100 images of a prompt, d = 2048 or 1024): two d x d
    eigendecompositions (~1 s each) become one n1 x n2 SVD (~1 ms), with no eigenvalue to clip.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1] or min(len(x), len(y)) < 2:
        raise ValueError(f"need (n >= 2, d) features of one d, got {x.shape} and {y.shape}")
    mu1, mu2 = x.mean(axis=0), y.mean(axis=0)
    a = (x - mu1) / np.sqrt(len(x) - 1)
    b = (y - mu2) / np.sqrt(len(y) - 1)
    if np.array_equal(mu1, mu2) and np.array_equal(a.T @ a, b.T @ b):
        return FrechetResult(0.0, 0.0, 0.0, 0.0, 0, "identical", 0.0, False)
    diff = mu1 - mu2
    mean_term = float(diff @ diff)
    tr1, tr2 = float((a * a).sum()), float((b * b).sum())
    tr_sqrt = float(scipy.linalg.svdvals(a @ b.T, check_finite=False).sum())
    raw = mean_term + tr1 + tr2 - 2.0 * tr_sqrt
    value, clamped = clamp_rounding(raw, mean_term + tr1 + tr2)
    return FrechetResult(value, mean_term, tr1 + tr2 - 2.0 * tr_sqrt, 0.0, 0, "lowrank-svd", raw, clamped)


def frechet_of_samples(x: np.ndarray, y: np.ndarray) -> FrechetResult:
    """FD of two feature samples: :func:`frechet_distance_lowrank` when a covariance is rank-deficient
    (min(n1, n2) <= d), else the Gaussian-statistics path (:func:`frechet_distance_details`)."""
    if min(len(x), len(y)) <= np.shape(x)[1]:
        return frechet_distance_lowrank(x, y)
    return _fd_of(GaussianStats(np.shape(x)[1]).update(x), GaussianStats(np.shape(y)[1]).update(y))


class FrechetDistanceMetric(Metric):
    """FID / FD-DINOv2 / fd_toy of the set against the reference set, overall and per prompt.

    States: ``set_stats`` / ``ref_stats`` (:class:`GaussianStats` of this rank's row shard, summed
    over ranks: the whole-set FD) and ``per_prompt`` (``{prompt_id: FrechetResult}`` of the
    prompts dealt to this rank, each against the reference's images of the same prompt; merged).
    """

    kind = "fd"

    def __init__(
        self, info: MetricInfo, extractors: dict[str, FeatureExtractor], options: MetricsOptions
    ) -> None:
        super().__init__(info)
        self.extractor = extractors[info.source]
        self.add_state("set_stats", GaussianStats(self.extractor.dim), "sum")
        self.add_state("ref_stats", GaussianStats(self.extractor.dim), "sum")
        self.add_state("per_prompt", {}, "merge")
        self.result: FrechetResult | None = None

    @staticmethod
    def extractor_outputs(info: MetricInfo) -> dict[str, tuple[str, ...]]:
        return {info.source: ("features",)}

    def update(self, data: EvalData) -> None:
        if data.reference is None:
            raise ValueError(f"{self.name} needs a reference set (validate_request checks this)")
        x = data.outputs[self.info.source]["features"]
        y = extract_set(data.reference, self.extractor, data.options, ("features",), data.report)["features"]
        shard = slice(dist.rank(), None, dist.world_size())
        self.set_stats.update(x[shard])
        self.ref_stats.update(y[shard])
        rows_y = data.reference.rows_by_prompt()
        for pid in data.my_prompts():
            self.per_prompt[pid] = frechet_of_samples(x[data.rows[pid]], y[rows_y[pid]])

    def compute(self) -> MetricValues:
        self.result = _fd_of(self.set_stats, self.ref_stats)
        per_prompt = {pid: r.value for pid, r in self.per_prompt.items()}
        return MetricValues({self.name: self.result.value}, {self.name: per_prompt})

    def settings(self) -> dict[str, Any]:
        if self.result is None:
            raise RuntimeError("settings() before compute()")
        diagnostics = {
            **self.result.diagnostics(),
            "per_prompt_clamped_to_zero": sum(r.clamped_to_zero for r in self.per_prompt.values()),
        }
        return {
            "frechet": {
                "dtype": "float64",
                "covariance_ddof": 1,
                "trace_sqrt": "sum sqrt(eigvalsh(R^T S2 R)), R = cholesky(S1) or eigh root if singular; negatives clipped and reported",
                "per_prompt": "FD of each prompt's images vs the reference's images of the same prompt; "
                "exact low-rank form (sum of singular values of A^T B) when a prompt has <= d images",
                "zero_clamp": f"FD in [-{FD_ZERO_RTOL:g} * (|mu1-mu2|^2 + tr S1 + tr S2), 0) is reported as 0.0 (raw_value kept)",
                "diagnostics": {self.name: diagnostics},
            }
        }


def _fd_of(a: GaussianStats, b: GaussianStats) -> FrechetResult:
    return frechet_distance_details(a.mean(), a.cov(), b.mean(), b.cov())
