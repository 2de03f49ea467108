"""The metric catalogue (one record per metric, derived views), per-prompt validity rules, Metric shell."""

from __future__ import annotations

import numpy as np
import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.metrics.base import (
    IS_DEFAULT_SPLITS,
    METRIC_BACKENDS,
    METRIC_LABELS,
    METRICS,
    PREFERENCE_METRICS,
    MetricInfo,
    metric_info,
    per_prompt_problem,
)
from pcpo_eval.metrics.frechet import gaussian_stats
from pcpo_eval.metrics.inception_score import inception_score
from pcpo_eval.metrics.metric import EvalData, Metric, MetricValues
from pcpo_eval.metrics.state import GaussianStats
from pcpo_eval.metrics.workers import METRIC_CLASSES
from pcpo_eval.rewards import REGISTRY as REWARDS
from pcpo_eval.weights.backends import BACKENDS


def test_views_are_derived_from_the_one_table() -> None:
    assert list(METRIC_BACKENDS) == list(METRIC_LABELS) == list(METRICS)
    assert all(METRIC_BACKENDS[n] == m.backends and METRIC_LABELS[n] == m.label for n, m in METRICS.items())
    assert PREFERENCE_METRICS == ("hps", "hps_v20", "pickscore", "imagereward", "clipscore", "aesthetic", "bertscore")
    assert all(METRICS[n].kind == "reward" and not METRICS[n].needs_reference for n in PREFERENCE_METRICS)
    assert all(m.name == n for n, m in METRICS.items())


def test_every_record_is_computable_and_its_backends_exist() -> None:
    assert set(METRIC_CLASSES) == {m.kind for m in METRICS.values()}
    assert all(cls.kind == kind for kind, cls in METRIC_CLASSES.items())
    assert {b for m in METRICS.values() for b in m.backends} <= set(BACKENDS)
    assert all(m.source in REWARDS for m in METRICS.values() if m.kind == "reward")


def test_directions_and_reference_follow_the_paper() -> None:
    # FID / FD (down), LPIPS (up), preference scores (up), IS* (down: the paper minimizes IS)
    lower = {n for n, m in METRICS.items() if not m.higher_is_better}
    assert lower == {"fid", "fd_dinov2", "fd_toy", "is", "is_toy"}
    assert {n for n, m in METRICS.items() if m.needs_reference} == {"fid", "fd_dinov2", "fd_toy"}
    assert METRICS["is"].label == "IS*" and METRICS["fid"].feature_dim == 2048


def test_records_are_frozen_and_unknown_names_list_the_choices() -> None:
    with pytest.raises(AttributeError):
        METRICS["fid"].label = "x"  # type: ignore[misc]
    with pytest.raises(UserError, match="unknown metric 'kid'; choose from: fid, fd_dinov2"):
        metric_info("kid")


def test_per_prompt_fd_needs_more_images_than_dimensions() -> None:
    msg = per_prompt_problem("fd_toy", 4)
    assert msg is not None and "\n" not in msg
    assert "4 images per prompt in 128-d" in msg and "rank <= 3" in msg and ">= 129 seeds" in msg
    assert "overall only" in msg and "KID" in msg
    assert per_prompt_problem("fd_toy", 129) is None
    assert per_prompt_problem("fd_toy", 12, feature_dim=12) is not None
    assert per_prompt_problem("fd_toy", 13, feature_dim=12) is None
    assert per_prompt_problem("fid", 2048) is not None and per_prompt_problem("fd_dinov2", 1112) is None
    # the fact behind the rule: n images give a covariance of rank n - 1
    x = np.random.default_rng(0).normal(size=(4, 128))
    assert np.linalg.matrix_rank(gaussian_stats(x)[1]) == 3


def test_per_prompt_is_with_one_image_splits_is_one_by_construction() -> None:
    msg = per_prompt_problem("is_toy", 12)
    assert msg is not None and "1 by construction" in msg and f">= {2 * IS_DEFAULT_SPLITS} seeds" in msg
    assert per_prompt_problem("is_toy", 19) is not None and per_prompt_problem("is_toy", 20) is None
    assert (
        per_prompt_problem("is", 3, is_splits=2) is not None
        and per_prompt_problem("is", 4, is_splits=2) is None
    )
    # the facts behind the rule: a split of k images has IS <= k, so 1-image splits score 1
    logits = np.random.default_rng(1).normal(size=(12, 45)) * 5
    assert inception_score(logits, min(IS_DEFAULT_SPLITS, 12)).mean <= 2.0  # splits of 1 or 2 images
    assert inception_score(logits[:5], 5).mean == pytest.approx(1.0, abs=1e-12)
    assert inception_score(logits, 1).mean > 2.0  # the same logits in one split


def test_per_prompt_lpips_and_rewards_and_bad_input() -> None:
    assert "needs >= 2 images" in per_prompt_problem("lpips", 1)
    assert per_prompt_problem("lpips_toy", 2) is None and per_prompt_problem("hps", 1) is None
    with pytest.raises(ValueError):
        per_prompt_problem("hps", 0)
    with pytest.raises(UserError, match="unknown metric"):
        per_prompt_problem("kid", 100)


class _Counts(Metric):
    """A minimal metric: one summed and one merged state."""

    kind = "reward"

    def __init__(self, info: MetricInfo) -> None:
        super().__init__(info)
        self.add_state("stats", GaussianStats(2), "sum")
        self.add_state("per_prompt", {}, "merge")

    def update(self, data: EvalData) -> None:
        raise NotImplementedError

    def compute(self) -> MetricValues:
        return MetricValues({self.name: float(self.stats.n)}, {self.name: dict(self.per_prompt)})

    def settings(self) -> dict:
        return {}


def test_metric_states_declare_their_reduction() -> None:
    m = _Counts(METRICS["hps"])
    m.stats.update(np.ones((3, 2)))
    m.per_prompt[7] = 0.5
    m.sync()  # one process: every reduction is the identity
    assert m.compute() == MetricValues({"hps": 3.0}, {"hps": {7: 0.5}})
    with pytest.raises(ValueError, match="unknown reduction 'mean'"):
        m.add_state("x", 0, "mean")
    with pytest.raises(ValueError, match="computes kind 'reward', not fid"):
        _Counts(METRICS["fid"])
