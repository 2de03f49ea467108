"""Fixtures shared by the statistics tests."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture
def fast_loop():
    """For loops over hundreds of simulated studies: skip the power figures
    (:func:`pcpo_eval.stats.runlevel.no_power_figures`: root searches over scipy's noncentral t and the
    bounded relabelling test's draws; they enter no estimate, CI, p or verdict) and freeze the objects
    alive now out of the garbage collector (statsmodels' Holm runs gc.collect() on every call, ~0.1-0.3 s
    with torch loaded by conftest)."""
    from pcpo_eval.stats.runlevel import no_power_figures

    gc.collect()
    gc.freeze()
    with no_power_figures():
        yield
    gc.unfreeze()
