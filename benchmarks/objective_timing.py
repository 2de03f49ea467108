"""Epoch time and peak memory of two training objectives on one toy config (bench_trainer.py, bench_flow.py).

Each objective runs in its own subprocess (peak RSS is per process), alternating ``rounds`` times
so machine noise hits both; the figures are the median of per-epoch wall time (first epoch of each
run dropped as warm-up) and the largest peak RSS, per objective.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from typing import Any

#: the child process: ``PREAMBLE`` (which may patch the model registry and sets ``extra``, a dict
#: added to the result), then one training run of the config in argv[1] into argv[2]
CHILD = r"""
import json, resource, sys, torch
torch.set_num_threads(2)
extra = {}
PREAMBLE
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.trainer import train
cfg = config_from_dict(json.loads(sys.argv[1]))
log = train(cfg, sys.argv[2])
print(json.dumps({"epoch_s": log["wall_time_s"].tolist()[1:], **extra,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(config: dict[str, Any], objective: str, preamble: str = "") -> dict[str, Any]:
    """One training run of ``config`` with ``objective`` in a fresh process: its per-epoch seconds
    (warm-up epoch dropped), peak RSS in MB and what ``preamble`` put in ``extra``."""
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.executable, "-c", CHILD.replace("PREAMBLE", preamble),
                              json.dumps({**config, "objective": objective}), d + "/run"],
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(config: dict[str, Any], objectives: tuple[str, ...] = ("ppo_clip", "pcpo"), rounds: int = 2,
            preamble: str = "") -> tuple[dict[str, float], dict[str, float], dict[str, list[dict[str, Any]]]]:
    """(median epoch seconds, peak RSS MB, the runs) per objective, the objectives alternating ``rounds`` times."""
    res: dict[str, list[dict[str, Any]]] = {k: [] for k in objectives}
    for _ in range(rounds):
        for obj in objectives:
            res[obj].append(run(config, obj, preamble))
    med = {k: statistics.median([t for r in v for t in r["epoch_s"]]) for k, v in res.items()}
    rss = {k: max(r["peak_rss_mb"] for r in v) for k, v in res.items()}
    return med, rss, res
