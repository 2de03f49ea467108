"""Statistics: run-level inference over training runs (``runlevel``, ``verdict``), LMMs on lme4's
formulation with Satterthwaite t-tests (``lmm``, ``lmm_core``), multiple-testing adjustment, speed-up
and reward-matched checkpoint selection. Pure functions; the CLI lives in ``commands.py``.

Heavy imports (scipy.stats) happen on first use of the LMM and run-level functions.
"""

from __future__ import annotations

from pcpo_eval.stats.adjust import benjamini_hochberg, holm
from pcpo_eval.stats.select import (
    Bracket,
    CheckpointChoice,
    Selection,
    bracket,
    match_checkpoint,
    run_checkpoints,
    select_checkpoints,
)
from pcpo_eval.stats.speedup import (
    Speedup,
    SpeedupTable,
    epochs_to_target,
    moving_average,
    speedup_pct,
    speedup_table,
)

_LMM_NAMES = {
    "fit_lmm",
    "fit_lmm_many",
    "lrt",
    "lrt_from_fits",
    "adjust_across_metrics",
    "qq_plot",
    "LMMResult",
    "FixedEffect",
    "LRTResult",
}


def __getattr__(name: str):  # lazy: statsmodels/patsy only when an LMM is fitted
    if name in _LMM_NAMES:
        from pcpo_eval.stats import lmm

        return getattr(lmm, name)
    raise AttributeError(f"module 'pcpo_eval.stats' has no attribute {name!r}")


__all__ = [
    "Bracket",
    "CheckpointChoice",
    "FixedEffect",
    "LMMResult",
    "LRTResult",
    "Selection",
    "Speedup",
    "SpeedupTable",
    "adjust_across_metrics",
    "benjamini_hochberg",
    "bracket",
    "epochs_to_target",
    "fit_lmm",
    "fit_lmm_many",
    "holm",
    "lrt",
    "lrt_from_fits",
    "match_checkpoint",
    "moving_average",
    "qq_plot",
    "run_checkpoints",
    "select_checkpoints",
    "speedup_pct",
    "speedup_table",
]

# Run-level inference over training runs (runlevel.py) and verdict rows (verdict.py): lazy as
# well, so that importing the package does not load scipy.
_RUNLEVEL_NAMES = {
    "Comparison": "runlevel",
    "Speedup": "runlevel",
    "TimeToTarget": "runlevel",
    "compare_runs": "runlevel",
    "iqm": "runlevel",
    "iqm_interval": "runlevel",
    "poi_interval": "runlevel",
    "permutation_test": "runlevel",
    "probability_of_improvement": "runlevel",
    "speedup_runs": "runlevel",
    "VERDICT_KEYS": "verdict",
    "Verdict": "verdict",
    "verdict_rows": "verdict",
}
_getattr_before_runlevel = __getattr__


def __getattr__(name: str):  # noqa: F811 -- extends the lazy lookup above
    if _RUNLEVEL_NAMES.get(name) == "runlevel":
        from pcpo_eval.stats import runlevel

        return getattr(runlevel, name)
    if _RUNLEVEL_NAMES.get(name) == "verdict":
        from pcpo_eval.stats import verdict

        return getattr(verdict, name)
    return _getattr_before_runlevel(name)


__all__ += sorted(_RUNLEVEL_NAMES)
