"""An exponential moving average of the trainable weights: what Flow-GRPO evaluates and saves.

Flow-GRPO (``train.ema: True`` in every ``config/grpo.py`` setup; ``scripts/train_sd3.py``) keeps an EMA
of the LoRA weights with decay 0.9, updated every 8 optimizer steps, evaluates the held-out reward with
it and saves it as the checkpoint; sampling for training uses the raw weights. Its update
(``flow_grpo/ema.py``, ``EMAModuleWrapper.step``) at optimizer step count ``s``::

    if (s + 1) % every == 0:
        ema <- ema + (1 - d(s)) (theta - ema),   d(s) = min((1 + s) / (10 + s), decay)

(the warm-up ``d(s)`` averages fast at first: d(7) = 0.47, and reaches ``decay`` 0.9 at s = 80). The
training script calls it after every training batch (its timesteps' forward and backward), with ``s``
the optimizer steps taken so far, so an ``s`` that updates does so once for each batch of the
accumulation window that follows that step: ``k`` = the batches per optimizer step of one process
(Flow-GRPO's ``gradient_accumulation_steps``), which depends on the launch: Flow-GRPO's SD3 formulas at
512 images an epoch give k = 32 on one GPU, 8 on four, 2 on eight. With ``ema_repeats: 0`` the trainer
calls :meth:`ParamEMA.step` at the same points (``train/update.py``: after every micro-batch), so k is
this run's micro-batches per optimizer step; ``ema_repeats: k`` applies k updates right after each
optimizer step instead, whatever the launch (setups 8-9 pin the k of the paper's layouts: 4 on one GPU
for setup 8, 8 on four for setup 9).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch


def ema_decay_at(step: int, decay: float) -> float:
    """Flow-GRPO's warm-up decay ``min((1 + s) / (10 + s), decay)`` at optimizer step count ``s``."""
    return min((1 + step) / (10 + step), decay)


class ParamEMA:
    """The moving average of ``params`` (float32 copies on their devices), Flow-GRPO's update rule."""

    def __init__(self, params: Sequence[torch.nn.Parameter], decay: float, every: int) -> None:
        self.decay, self.every = float(decay), int(every)
        self.shadow = [p.detach().float().clone() for p in params]
        self.updates = 0  #: averaging steps taken (for the log)

    @torch.no_grad()
    def step(self, params: Sequence[torch.nn.Parameter], optimizer_steps: int, repeats: int = 1) -> None:
        """One call after a training batch (``repeats`` calls at once); ``optimizer_steps``: steps taken so far
        (Flow-GRPO's global_step)."""
        if (optimizer_steps + 1) % self.every:
            return
        w = 1.0 - ema_decay_at(optimizer_steps, self.decay)
        for _ in range(repeats):
            for s, p in zip(self.shadow, params, strict=True):
                s.add_(w * (p.detach().float() - s))
            self.updates += 1

    @contextmanager
    def swapped_in(self, params: Sequence[torch.nn.Parameter]) -> Iterator[None]:
        """The averaged weights in ``params`` for the block (validation, saving), the raw ones after."""
        raw = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, s in zip(params, self.shadow, strict=True):
                p.copy_(s.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for p, r in zip(params, raw, strict=True):
                    p.copy_(r)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "every": self.every, "updates": self.updates,
                "shadow": [s.detach().cpu() for s in self.shadow]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a resume); the shapes must be this run's."""
        shadow = state["shadow"]
        if len(shadow) != len(self.shadow) or any(a.shape != b.shape for a, b in zip(shadow, self.shadow, strict=True)):
            raise ValueError("the saved moving average does not match this run's trainable weights")
        self.shadow = [t.to(s.device, torch.float32).clone() for t, s in zip(shadow, self.shadow, strict=True)]
        self.updates = int(state["updates"])
