"""Subprocess entry for the metrics tests (SIGKILL resume, torchrun). Not a test module.

usage: metrics_worker_script.py extract SET CACHE
       metrics_worker_script.py metrics SET REF CACHE OUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from metrics_helpers import SlowStandInToyClassifier, StandInToyClassifier  # noqa: E402

from pcpo_eval import (
    dist,  # noqa: E402
    rewards,  # noqa: E402
)
from pcpo_eval.imageset import ImageSet  # noqa: E402
from pcpo_eval.metrics.extract import MetricsOptions, extract_set  # noqa: E402
from pcpo_eval.metrics.workers import compute_metrics  # noqa: E402

torch.set_num_threads(1)
rewards.REGISTRY["hps"] = "metrics_helpers:fake_reward"
mode = sys.argv[1]
if mode == "extract":
    from pcpo_eval.features import make_extractor

    opts = MetricsOptions(batch_size=2, cache_dir=sys.argv[3])
    ext = make_extractor("toy", classifier=SlowStandInToyClassifier(0))
    extract_set(ImageSet.load(sys.argv[2]), ext, opts)
elif mode == "metrics":
    dist.init()
    opts = MetricsOptions(
        batch_size=4,
        cache_dir=sys.argv[4],
        lpips_batch=3,
        extractor_options={"toy": {"classifier": StandInToyClassifier(0)}},
    )
    res = compute_metrics(sys.argv[2], "fd_toy,is_toy,lpips_toy,hps", sys.argv[3], opts)
    if dist.is_main():
        Path(sys.argv[5]).write_text(
            json.dumps(
                {
                    "metrics": res.metrics,
                    "per_prompt": res.per_prompt.to_dict("list"),
                    "world": res.settings["world_size"],
                }
            )
        )
    dist.finalize()
