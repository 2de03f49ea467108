"""Subprocess entry for the generator tests (SIGKILL resume, torchrun sharding).

Usage: python tests/support/generate_worker.py OUT N_PROMPTS N_SEEDS BATCH STEPS MICRO_BATCH
Renders the stand-in model's set with :func:`pcpo_eval.generate.runner.generate_set` and prints
``rank R: rendered N, skipped M``; under
torchrun the process group (gloo) comes from the environment. One intra-op thread: the launching
test sets OMP_NUM_THREADS=1 (tests/generate/test_set.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: tests.support, pcpo_eval

from pcpo_eval.generate.runner import generate_set
from pcpo_eval.prompts import PromptSet, simple_animals
from tests.support.generate import StandInAdapter


def main() -> None:
    out, n_prompts, n_seeds, batch, steps, micro = sys.argv[1:7]
    animals = simple_animals()
    ps = PromptSet("standin", animals.prompt_ids[: int(n_prompts)], animals.prompts[: int(n_prompts)])
    s = generate_set(
        StandInAdapter(), ps, int(n_seeds), out, batch_size=int(batch), steps=int(steps),
        micro_batch=int(micro), progress=False, flush_every_s=0.5,
    )  # fmt: skip
    print(f"rank {os.environ.get('RANK', '0')}: rendered {s.n_rendered}, skipped {s.n_skipped}", flush=True)


if __name__ == "__main__":
    main()
