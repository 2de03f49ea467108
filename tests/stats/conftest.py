"""Fixtures shared by the statistics tests."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture
def fast_loop(monkeypatch):
    """For loops over hundreds of simulated studies: skip the power figures (root searches over
    scipy's noncentral t; they enter no estimate, CI, p or verdict) and freeze the objects alive now
    out of the garbage collector (statsmodels' Holm runs gc.collect() on every call, ~0.1-0.3 s
    with torch loaded by conftest)."""
    import pcpo_eval.stats.power as power
    import pcpo_eval.stats.runlevel as runlevel

    monkeypatch.setattr(power, "mde", lambda *a, **k: None)
    monkeypatch.setattr(power, "seeds_needed", lambda *a, **k: None)
    monkeypatch.setattr(runlevel, "_mde", lambda *a, **k: None)
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
