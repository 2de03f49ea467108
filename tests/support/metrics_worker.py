"""Subprocess entry for the metrics tests (SIGKILL resume, torchrun). Not a test module.

usage: python tests/support/metrics_worker.py extract SET CACHE
       python tests/support/metrics_worker.py metrics SET REF CACHE OUT_JSON

One intra-op thread: the launching test sets OMP_NUM_THREADS=1 (tests/metrics/test_cache.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: tests.support, pcpo_eval

from pcpo_eval import dist, rewards
from pcpo_eval.imageset import ImageSet
from pcpo_eval.metrics.extract import MetricsOptions, extract_set
from pcpo_eval.metrics.workers import compute_metrics
from tests.support.metrics import SlowStandInToyClassifier, StandInToyClassifier

rewards.REGISTRY["hps"] = "tests.support.metrics:fake_reward"
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
