"""``pcpo-eval toy check``: does the shipped toy model draw what it is asked to?

Samples every toy prompt with the base model (seeds ``0 .. n_seeds-1``, per-image generators from
:mod:`pcpo_eval.seeding`, the default toy sampler below through the shared DDIM sampler) and
reports

* ``accuracy``: fraction of samples the toy classifier assigns to their prompt's class
  (bar: >= 0.80, issue 3),
* ``fd_toy``: Frechet distance of toy-classifier features between the samples and the same number
  of held-out procedural images per prompt (``EVAL_OFFSET`` indices) -- biased upward at small N,
  so compare values only at equal N,
* ``sampling_time_s``: wall time of the sampling alone (depends on CPU contention).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pcpo_eval.models.base import ModelAdapter
from pcpo_eval.toy import data as toy_data

#: The default toy sampler (used by check, bench and the docs): DDIM, 20 steps, eta 1.0 (the
#: stochastic DDPO rollout sampler, so the check measures what RL starts from), CFG 3.0.
DEFAULT_STEPS = 20
DEFAULT_ETA = 1.0
DEFAULT_CFG = 3.0
ACCURACY_BAR = 0.80


@dataclass
class CheckResult:
    """Outcome of :func:`run_check` (all figures measured, none estimated)."""

    accuracy: float
    fd_toy: float
    sampling_time_s: float
    n_images: int
    n_seeds: int
    steps: int
    eta: float
    cfg: float
    threads: int
    per_prompt_accuracy: dict[str, float] = field(default_factory=dict)
    color_accuracy: float = 0.0
    shape_accuracy: float = 0.0
    passed: bool = False
    weights: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_toy_images(adapter: ModelAdapter, prompt_ids: list[int], seeds: list[int], *, steps: int = DEFAULT_STEPS,
                      eta: float = DEFAULT_ETA, cfg: float = DEFAULT_CFG, batch_size: int = 180) -> torch.Tensor:
    """uint8 images for every ``(prompt_id, seed)`` pair in ``zip(prompt_ids, seeds)``.

    Uses the shared DDIM sampler with one generator per image (so results do not depend on
    ``batch_size``).
    """
    from pcpo_eval.samplers.ddim import sample_ddim
    from pcpo_eval.seeding import sample_generators

    prompts = [toy_data.TOY_PROMPTS[p] for p in prompt_ids]
    out = []
    for s in range(0, len(prompts), batch_size):
        chunk = prompts[s: s + batch_size]
        gens = sample_generators(list(zip(prompt_ids[s: s + batch_size], seeds[s: s + batch_size], strict=True)))
        cond = adapter.encode_prompts(chunk)
        uncond = adapter.encode_prompts([""] * len(chunk))
        res = sample_ddim(adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=gens)
        out.append(adapter.decode(res.latents).cpu())
    return torch.cat(out)


def run_check(adapter: ModelAdapter | None = None, classifier: torch.nn.Module | None = None, *,
              n_seeds: int = 8, steps: int = DEFAULT_STEPS, eta: float = DEFAULT_ETA, cfg: float = DEFAULT_CFG,
              weights_dir: str | Path | None = None, batch_size: int = 180) -> CheckResult:
    """Sample all 45 prompts x ``n_seeds`` seeds, classify them, compute fd_toy; see module doc."""
    from pcpo_eval.metrics.frechet import frechet_distance_from_features
    from pcpo_eval.models.toy import ToyAdapter
    from pcpo_eval.toy.classifier import load_classifier

    if adapter is None:
        adapter = ToyAdapter.from_dir(weights_dir)
    if classifier is None:
        classifier = load_classifier(weights_dir)
    n_prompts = len(toy_data.TOY_PROMPTS)
    pids = [p for p in range(n_prompts) for _ in range(n_seeds)]
    seeds = [s for _ in range(n_prompts) for s in range(n_seeds)]
    t0 = time.perf_counter()
    images = sample_toy_images(adapter, pids, seeds, steps=steps, eta=eta, cfg=cfg, batch_size=batch_size)
    sampling_time = time.perf_counter() - t0
    ref, _ = toy_data.dataset(n_seeds, offset=toy_data.EVAL_OFFSET)
    with torch.no_grad():
        out = classifier(images)
        ref_feats = classifier(ref)["features"].double().numpy()
    pred = out["logits"].argmax(1).numpy()
    labels = np.asarray(pids)
    correct = pred == labels
    n_shapes = len(toy_data.SHAPES)
    per_prompt = {toy_data.TOY_PROMPTS[p]: float(correct[labels == p].mean()) for p in range(n_prompts)}
    fd = frechet_distance_from_features(out["features"].double().numpy(), ref_feats)
    acc = float(correct.mean())
    return CheckResult(
        accuracy=acc, fd_toy=float(fd), sampling_time_s=sampling_time, n_images=len(pids), n_seeds=n_seeds,
        steps=steps, eta=eta, cfg=cfg, threads=torch.get_num_threads(), per_prompt_accuracy=per_prompt,
        color_accuracy=float((pred // n_shapes == labels // n_shapes).mean()),
        shape_accuracy=float((pred % n_shapes == labels % n_shapes).mean()),
        passed=acc >= ACCURACY_BAR, weights=str(getattr(adapter, "source", "")),
    )
