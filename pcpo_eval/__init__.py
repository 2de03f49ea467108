"""pcpo-eval: train, render, measure and test PCPO against DDPO / DanceGRPO / Flow-GRPO.

Data flows through the package in this order (one module, one job):

``credit`` (PCPO credit math) -> ``samplers`` / ``objectives`` -> ``trainer`` -> ``generate``
-> ``features`` -> ``metrics`` -> ``stats`` -> ``report``.

The Python API is one function per step, importable from here (docs/api.md)::

    pcpo_eval.train_run, render_set, compute_metrics, fit_lmm, speedup, run_study,
    load_results, write_report, write_figures, export_run

They live in :mod:`pcpo_eval.study.api` and load on first use, so ``import pcpo_eval`` stays fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

#: the API names (pcpo_eval.study.api.API), listed here so that naming one imports nothing else
_API = ("train_run", "render_set", "compute_metrics", "fit_lmm", "speedup", "run_study", "load_results",
        "write_report", "write_figures", "export_run")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """``pcpo_eval.<api name>``: imported from :mod:`pcpo_eval.study.api` on first use."""
    if name in _API:
        from pcpo_eval.study import api

        return getattr(api, name)
    raise AttributeError(f"module 'pcpo_eval' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
