"""THE metric catalogue: one frozen :class:`MetricInfo` per metric, and the facts a verdict needs.

Each record says how a metric is computed (``kind`` + ``source``), what it needs (weights
``backends``, a reference set), how it is shown (``label``, paper style) and read
(``higher_is_better``), and how many images per prompt make its per-prompt value meaningful
(:meth:`MetricInfo.min_images_per_prompt`, :func:`per_prompt_problem`). The other names
(``METRIC_BACKENDS``, ``PREFERENCE_METRICS``, ``METRIC_LABELS``) are views derived from it.

Directions follow the paper's tables: FID / FD-DINOv2 (down), LPIPS diversity (up), preference
scores (up) and IS* (down): "we therefore treat IS for our task as a metric to be minimized,
given lower or comparable FID" (paper, Experiments > Results, the IS analysis; Table
``tab:dancegrpo-lmm-analysis`` marks "IS* (down)"): a non-diverse, collapsed policy can
"artificially achieve high IS". The conventional reading of IS (higher is better) is deliberately
not used here.

This module is pure data and arithmetic (no torch), so a study spec can be validated cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pcpo_eval.errors import UserError
from pcpo_eval.rewards import PREFERENCE_BACKENDS

Kind = Literal["fd", "is", "lpips", "reward"]

#: Inception Score splits (torch-fidelity's ``isc_splits`` default); per prompt: min(splits, images)
IS_DEFAULT_SPLITS = 10
#: Inception Score shuffle seed (torch-fidelity's ``np.random.RandomState(2020)``)
IS_DEFAULT_SEED = 2020
#: kinds that compare a set with a reference set (FD is a distance between two distributions)
REFERENCE_KINDS: frozenset[str] = frozenset({"fd"})


@dataclass(frozen=True)
class MetricInfo:
    """One metric of the catalogue.

    kind: fd | is | lpips | reward; source: feature extractor (fd, is), LPIPS embedder (lpips)
    or reward name (reward); backends: weights backends (:mod:`pcpo_eval.weights`) it needs
    (toy metrics ship their weights); feature_dim: dimension of the source's features with the
    reference weights (fd only: the per-prompt covariance needs more images than that).
    """

    name: str
    kind: Kind
    source: str
    label: str
    higher_is_better: bool
    backends: tuple[str, ...] = ()
    feature_dim: int | None = None

    @property
    def needs_reference(self) -> bool:
        """FD-like metrics are distances to a reference set (the base model's images)."""
        return self.kind in REFERENCE_KINDS

    @property
    def is_preference(self) -> bool:
        """A score of the images alone (a reward model); no reference set needed."""
        return self.kind == "reward"

    def min_images_per_prompt(
        self, feature_dim: int | None = None, is_splits: int = IS_DEFAULT_SPLITS
    ) -> int:
        """Fewest images per prompt for which the per-prompt value is defined and informative.

        fd: d + 1 (a covariance of n images has rank <= n - 1, so S is full rank only for n > d);
        is: 2 splits' worth (a split of k images has IS <= k, so 1-image splits score exactly 1);
        lpips: 2 (one pair); reward: 1.
        """
        if self.kind == "fd":
            return _fd_dim(self, feature_dim) + 1
        if self.kind == "is":
            return 2 * is_splits
        return 2 if self.kind == "lpips" else 1


def _fd_dim(info: MetricInfo, feature_dim: int | None) -> int:
    dim = feature_dim if feature_dim is not None else info.feature_dim
    if dim is None or dim < 1:
        raise ValueError(f"{info.name}: feature dimension unknown; pass feature_dim")
    return dim


#: name, label, backends of the preference metrics: the rewards' own table (one home).
_PREFERENCE = tuple((name, label, backends) for name, (label, backends) in PREFERENCE_BACKENDS.items())

_CATALOGUE: tuple[MetricInfo, ...] = (
    MetricInfo("fid", "fd", "inception", "FID", False, ("inception",), feature_dim=2048),
    MetricInfo("fd_dinov2", "fd", "dinov2", "FD-DINOv2", False, ("dinov2",), feature_dim=1024),
    MetricInfo("fd_toy", "fd", "toy", "FD (toy)", False, feature_dim=128),
    MetricInfo("is", "is", "inception", "IS*", False, ("inception",)),
    MetricInfo("is_toy", "is", "toy", "IS* (toy)", False),
    MetricInfo("lpips", "lpips", "alex", "LPIPS", True, ("lpips_alex",)),
    MetricInfo("lpips_toy", "lpips", "toy", "LPIPS (toy)", True),
    *(MetricInfo(name, "reward", name, label, True, backends) for name, label, backends in _PREFERENCE),
    # ddpo-pytorch's prompt alignment (setups 3-4): VLM caption + BERTScore recall, in process
    # (pcpo_eval/rewards/bertscore.py; backends of its defaults: Qwen2.5-VL-3B + deberta-xlarge-mnli)
    MetricInfo("bertscore", "reward", "vlm_bertscore", "BERTScore", True, ("qwen25_vl_3b", "bertscore_deberta")),
)

#: THE catalogue: metric name -> record (the order is the order of ``--metrics`` help and errors)
METRICS: dict[str, MetricInfo] = {m.name: m for m in _CATALOGUE}

# -- derived views ----------------------------------------------------------------------------------
#: metric name -> weights backends (pcpo_eval.weights) it needs; toy metrics ship their weights
METRIC_BACKENDS: dict[str, tuple[str, ...]] = {n: m.backends for n, m in METRICS.items()}
#: preference metrics (scores of the images alone; no reference set needed)
PREFERENCE_METRICS: tuple[str, ...] = tuple(n for n, m in METRICS.items() if m.is_preference)
#: display names in the report's tables (paper style)
METRIC_LABELS: dict[str, str] = {n: m.label for n, m in METRICS.items()}


def metric_info(name: str) -> MetricInfo:
    """The catalogue record of ``name``; a UserError listing the valid names otherwise."""
    if name not in METRICS:
        raise UserError(f"unknown metric {name!r}; choose from: {', '.join(METRICS)}")
    return METRICS[name]


def per_prompt_problem(
    metric: str, images_per_prompt: int, feature_dim: int | None = None, is_splits: int = IS_DEFAULT_SPLITS
) -> str | None:
    """Why the per-prompt value of ``metric`` is undefined or uninformative, or ``None`` if it is fine.

    ``feature_dim`` defaults to the catalogue's dimension of the metric's reference extractor;
    ``is_splits`` is the IS split count of the run. One line: the problem, then the fix.

    * FD: with n <= d images the per-prompt covariance has rank <= n - 1 < d (e.g. 4 images in
      128-d), so the fitted Gaussian is degenerate: FD stays computable (our eigh path), but it
      no longer describes the distribution of the prompt's images. d + 1 is the floor for a
      defined fit, not for an unbiased one (FD's small-sample bias decays like 1/n). The
      paper's per-prompt FID (1112 images per prompt, 2048-d) is below this floor, so a study
      validator should warn about, not refuse, that protocol.
    * IS: per prompt the n images are cut into min(splits, n) splits; a split of k images has
      IS <= k (KL(p_i || q) <= log k since q >= p_i / k), so a 1-image split scores 1 (up to
      rounding), and some split has 1 image exactly when n < 2 * splits.
      Beyond the count rule, one prompt's images are often one class, which keeps IS near 1.
    """
    info = metric_info(metric)
    n = int(images_per_prompt)
    if n < 1 or is_splits < 1:
        raise ValueError(
            f"need images_per_prompt >= 1 and is_splits >= 1, got {images_per_prompt}, {is_splits}"
        )
    need = info.min_images_per_prompt(feature_dim, is_splits)
    if n >= need:
        return None
    if info.kind == "fd":
        dim = need - 1
        return (
            f"per-prompt {metric} with {n} images per prompt in {dim}-d features fits a degenerate Gaussian "
            f"(covariance rank <= {n - 1} < {dim}); use >= {need} seeds per prompt, KID (not computed by "
            f"pcpo-eval), or {metric} overall only"
        )
    if info.kind == "is":
        splits = min(is_splits, n)
        return (
            f"per-prompt {metric} with {n} images per prompt in {splits} splits has 1-image splits, whose IS is "
            f"1 by construction; use >= {need} seeds per prompt, fewer IS splits, or {metric} overall only"
        )
    return f"per-prompt {metric} needs >= {need} images per prompt, have {n}; use more seeds per prompt"
