"""Preference scores as a metric (HPSv2.1, PickScore, ImageReward, CLIPScore, Aesthetic).

The reward models are the training rewards of :mod:`pcpo_eval.rewards` (``fn(images, prompts)``,
ddpo-pytorch style); per image the score is cached under a key of image sha256 + prompt. A
metric value is the mean over images; per prompt, the mean over the prompt's images (the paper's
preference table, ``tab:preference-metrics-combined``, scores 1 image per prompt on 5K prompts).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pcpo_eval.features import FeatureExtractor
from pcpo_eval.metrics.base import MetricInfo
from pcpo_eval.metrics.extract import MetricsOptions, load_reward, reward_settings, score_set
from pcpo_eval.metrics.metric import EvalData, Metric, MetricValues


def _plain(value: Any) -> Any:
    """JSON-able scalar (paths and other objects become strings)."""
    return value if isinstance(value, str | int | float | bool | None) else str(value)


class RewardScoreMetric(Metric):
    """Per-image preference score of reward ``info.source``; overall and per-prompt means.

    State ``scores`` is replicated: batches are dealt to the ranks, and every rank reads all
    scores back from the shared reward cache.
    """

    kind = "reward"

    def __init__(
        self, info: MetricInfo, extractors: dict[str, FeatureExtractor], options: MetricsOptions
    ) -> None:
        super().__init__(info)
        reward_options = options.reward_options.get(info.source, {})
        # on the pass's device unless the options name one; the cache key records the device type
        # (numerics_key), so the settings keep the options as given (the same key on every rank's GPU)
        self.fn = load_reward(info.source, reward_options, device=options.device)
        self.reward_settings = reward_settings(info.source, self.fn, reward_options)
        self.add_state("scores", np.zeros(0, np.float32), "replicated")
        self.rows: dict[int, np.ndarray] = {}

    def update(self, data: EvalData) -> None:
        self.scores = score_set(data.image_set, self.fn, self.reward_settings, data.options, data.report)
        self.rows = data.rows

    def compute(self) -> MetricValues:
        name = self.name
        per_prompt = {pid: float(np.mean(self.scores[r])) for pid, r in self.rows.items()}
        return MetricValues({name: float(np.mean(self.scores))}, {name: per_prompt}, {name: self.scores})

    def settings(self) -> dict[str, Any]:
        return {
            "rewards": {self.name: {k: _plain(v) for k, v in self.reward_settings.items()}},
            "reward_aggregate": "mean over images (per prompt: mean over the prompt's images)",
        }
