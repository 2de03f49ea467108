"""Advantage estimators: DDPO's per-prompt stat tracker and GRPO group normalizations (DanceGRPO, Flow-GRPO)."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from pcpo_eval.errors import UserError

#: GRPO group normalizations (``adv_std``): name -> definition.
ADV_STDS: dict[str, str] = {
    "group": "(r - mean_G) / (std_G + 1e-8), std_G the unbiased std of the group (DanceGRPO)",
    "batch": "(r - mean of the prompt's rewards) / (population std of all gathered rewards + 1e-4), groups by "
             "prompt string (Flow-GRPO's PerPromptStatTracker with global_std=True)",
}


class PerPromptStatTracker:
    """DDPO's ``PerPromptStatTracker`` (kvablack/ddpo-pytorch ``stat_tracking.py``).

    Keeps the last ``buffer_size`` rewards per prompt; while a prompt has fewer than
    ``min_count`` rewards it is normalized with the mean/std of the whole current batch.
    Advantage ``(r - mean) / (std + 1e-6)`` with the population std (numpy default).
    """

    def __init__(self, buffer_size: int = 32, min_count: int = 16) -> None:
        self.buffer_size = buffer_size
        self.min_count = min_count
        self.stats: dict[str, deque[float]] = {}

    def update(self, prompts: list[str], rewards: np.ndarray) -> np.ndarray:
        rewards = np.asarray(rewards, dtype=np.float64)
        prompts_arr = np.array(prompts, dtype=object)
        adv = np.empty_like(rewards)
        for prompt in dict.fromkeys(prompts):
            mask = prompts_arr == prompt
            buf = self.stats.setdefault(prompt, deque(maxlen=self.buffer_size))
            buf.extend(rewards[mask].tolist())
            if len(buf) < self.min_count:
                mean, std = np.mean(rewards), np.std(rewards)
            else:
                mean, std = np.mean(buf), np.std(buf)
            adv[mask] = (rewards[mask] - mean) / (std + 1e-6)
        return adv

    def state_dict(self) -> dict[str, Any]:
        return {"buffer_size": self.buffer_size, "min_count": self.min_count,
                "stats": {k: list(v) for k, v in self.stats.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer_size, self.min_count = int(state["buffer_size"]), int(state["min_count"])
        self.stats = {k: deque(v, maxlen=self.buffer_size) for k, v in state["stats"].items()}


def group_advantages(group_ids: np.ndarray, rewards: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """GRPO / DanceGRPO group normalization ``(r - mean_G) / (std_G + eps)``, unbiased std (ddof=1)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    group_ids = np.asarray(group_ids)
    adv = np.empty_like(rewards)
    for g in np.unique(group_ids):
        m = group_ids == g
        if m.sum() < 2:
            raise UserError(f"group {g} has {m.sum()} sample(s); GRPO needs images_per_prompt >= 2")
        r = rewards[m]
        adv[m] = (r - r.mean()) / (r.std(ddof=1) + eps)
    return adv


def batch_std_advantages(prompts: list[str], rewards: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Flow-GRPO's ``adv_std: batch``: ``(r - mean_p) / (std_all + eps)`` (:data:`ADV_STDS`).

    ``mean_p`` is the mean reward of the samples with the same prompt string (so equal prompts drawn in
    different groups are pooled, as Flow-GRPO's tracker keys by the decoded prompt), ``std_all`` the
    population std (ddof 0) of all rewards of the epoch, gathered over processes.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    keys = np.array(prompts, dtype=object)
    adv = np.empty_like(rewards)
    std = np.std(rewards) + eps
    for prompt in dict.fromkeys(prompts):
        m = keys == prompt
        adv[m] = (rewards[m] - np.mean(rewards[m])) / std
    return adv


def clamp_advantages(adv: np.ndarray, clip: float) -> np.ndarray:
    """Clamp to [-clip, clip] (DDPO ``adv_clip_max`` = 5; DanceGRPO the same)."""
    return np.clip(adv, -clip, clip)
