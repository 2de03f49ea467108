"""Matched-reward balance: do the arms' reward-matched checkpoints sit at the same training reward?

Image metrics at matched reward compare like with like only if each arm's checkpoints were taken at
the same reward; :func:`reward_balance` tests that per cell (results.json ``selection.balance``), one
Holm family per study, with the imbalance it could have detected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pcpo_eval.study.spec import StudySpec

#: fixed generator seed of the balance check's permutation and bootstrap draws (results.json is reproducible)
BALANCE_SEED = 20261126


def reward_balance(sp: StudySpec, runs: Sequence[dict[str, Any]], alpha: float = 0.05) -> dict[str, dict[str, Any]]:
    """Per cell: do the arms' reward-matched checkpoints sit at the same reward? Each run's checkpoint
    is its first to reach ``select_target``, so an arm that learns in bigger steps overshoots more and
    its "matched" checkpoints carry more reward: a confounder of every matched-reward image metric.

    PCPO - baseline of the selected checkpoints' smoothed rewards over the runs that reached the
    target (those that did not have no matched checkpoint; ``n_left_out`` counts them), paired by
    shared seed under :func:`pcpo_eval.stats.verdict.pair_runs`'s rule, by
    :func:`pcpo_eval.stats.runlevel.compare_runs` (t CI and p, the exact permutation p without
    spread). The cells are one Holm family per study (``p_holm``, ``family_size``): ``imbalanced``
    when ``p_holm < alpha``, so arms that overshoot alike are flagged in at most alpha of studies
    however many cells; ``mde`` at the family's level ``alpha / m``. ``sentence`` says it."""
    from types import SimpleNamespace

    from pcpo_eval.stats.adjust import holm_present
    from pcpo_eval.stats.power import family_level
    from pcpo_eval.stats.runlevel import compare_runs, comparison_at_level
    from pcpo_eval.stats.verdict import pair_runs

    tests: dict[str, tuple[Any, list[float], list[float], dict[str, int]]] = {}
    lag: dict[str, Any] = {}  # the same test on the centred reward at the matched epoch (no lag)
    for cell in sp.cells():
        mine = [r for r in runs if r.get("cell") == cell and r.get("role") in ("baseline", "pcpo")]
        for key in ("reward", "reward_centred"):
            arm = {role: [SimpleNamespace(seed=str(r["seed"]), reward=float(r[key])) for r in mine
                          if r.get("role") == role and r.get("reached") and r.get(key) is not None]
                   for role in ("baseline", "pcpo")}
            b, t, paired = pair_runs(arm["baseline"], arm["pcpo"])  # type: ignore[arg-type]
            xb, xt = [r.reward for r in b], [r.reward for r in t]
            c = compare_runs(xb, xt, rng=np.random.default_rng(BALANCE_SEED), alpha=alpha, paired=paired, n_boot=200)
            if key == "reward":
                runs_of = {role: sum(r.get("role") == role for r in mine) for role in ("baseline", "pcpo")}
                tests[cell] = (c, xb, xt, runs_of)
            else:
                lag[cell] = c
    # one Holm family over both tests of every cell: the flag still says "imbalanced" in at most alpha of A/A studies
    both = holm_present([c.p if c.estimable else None for c, *_ in tests.values()]
                        + [c.p if c.estimable else None for c in lag.values()])
    adj = dict(zip(tests, both[:len(tests)], strict=True))
    lag_adj = dict(zip(lag, both[len(tests):], strict=True))
    tested = [a for a in both if a is not None]  # the family: both tests of every cell that has them
    level = family_level(alpha, len(tested))
    out: dict[str, dict[str, Any]] = {}
    for cell, (c, xb, xt, runs_of) in tests.items():
        if len(tested) > 1:
            c = comparison_at_level(c, xb, xt, level)
        imbalanced = adj[cell] is not None and adj[cell] < alpha
        lc = lag.get(cell)
        lagged = bool(lc is not None and lag_adj.get(cell) is not None and lag_adj[cell] < alpha and not imbalanced)
        left_out = {role: runs_of[role] - n for role, n in (("baseline", c.n_baseline), ("pcpo", c.n_treatment))}
        out[cell] = {"baseline_mean": c.baseline_value, "pcpo_mean": c.treatment_value, "estimate": c.estimate,
                     "ci_low": c.ci_low, "ci_high": c.ci_high, "p": c.p, "p_holm": adj.get(cell),
                     "family_size": len(tested), "paired": c.paired, "n_baseline": c.n_baseline, "n_pcpo": c.n_treatment,
                     "n_left_out": left_out, "estimable": c.estimable, "reason": c.reason or None, "mde": c.mde,
                     "mde_level": level, "imbalanced": imbalanced or lagged,
                     "centred": None if lc is None else {
                         "baseline_mean": lc.baseline_value, "pcpo_mean": lc.treatment_value, "estimate": lc.estimate,
                         "ci_low": lc.ci_low, "ci_high": lc.ci_high, "p": lc.p, "p_holm": lag_adj.get(cell),
                         "imbalanced": lagged},
                     "sentence": _balance_sentence(sp, cell, c, alpha, imbalanced, adj.get(cell), len(tested), left_out,
                                                   level) + (_lag_sentence(sp, lc, lag_adj.get(cell)) if lagged else "")}
    return out


def _lag_sentence(sp: StudySpec, c: Any, p_holm: float | None) -> str:
    """What the centred balance test found where the trailing one did not (:func:`reward_balance`): a faster
    arm is further along at its "matched" checkpoint. Arm B learning twice A's rate (5 paired seeds, a
    checkpoint every epoch) sat at a trailing 0.660 vs 0.621 (p = 0.21, "balanced") while its matched epochs'
    own rewards were +0.135 higher (p = 0.009), and the image metrics that follow reward alone differed
    (Holm p = 0.005)."""
    from pcpo_eval.stats.fmt import p_value

    return (f" On a window centred on the matched epoch, which does not lag a rising curve, {sp.pcpo}'s matched "
            f"checkpoints sit at {c.treatment_value:.3f}, {sp.baseline}'s at {c.baseline_value:.3f} ({sp.pcpo} - "
            f"{sp.baseline} {c.estimate:+.3f}, p = {p_value(c.p)}" + (f", Holm p = {p_value(p_holm)}" if p_holm is not
                                                                      None else "")
            + "): the trailing mean that matched them lags, so the arm that learns faster is further along at its "
              "matched checkpoint, and a matched-reward image-metric difference may partly be this reward difference.")


def _balance_sentence(sp: StudySpec, cell: str, c: Any, alpha: float, imbalanced: bool, p_holm: float | None, m: int,
                      left_out: dict[str, int], level: float | None = None) -> str:
    """The balance of one cell in words (:func:`reward_balance`): decimals that keep every CI end's sign
    (:func:`pcpo_eval.stats.fmt.ci_decimals`), p with the digits that keep its side of alpha, why the t test
    is not trusted alone (few seeds), and what could be detected: an MDE, or that the exact test's smallest p
    cannot reach the family's ``level`` (then no imbalance is detectable, whatever the CI says)."""
    from pcpo_eval.stats.fmt import ci_decimals, decimals, p_value

    where = f" ({cell})" if len(sp.cells()) > 1 else ""
    gone = [f"{n} {sp.pcpo if role == 'pcpo' else sp.baseline} run(s) never reached the target or had no shared seed"
            for role, n in left_out.items() if n]
    gone_txt = f"; {', '.join(gone)}" if gone else ""
    if not c.estimable or c.estimate is None:
        return f"Matched-reward balance{where}: not estimable ({c.reason}{gone_txt})."
    design = f"{c.n_baseline} seeds per arm, paired by seed" if c.paired else f"{c.n_treatment} vs {c.n_baseline} runs"
    if c.ci_low is not None:
        d = max(3, ci_decimals(c.estimate, c.ci_low, c.ci_high))
        ci = f", {1 - alpha:.0%} CI {c.ci_low:+.{d}f} to {c.ci_high:+.{d}f}" + (f"; {c.reason}" if c.reason else "")
    else:
        d = max(3, decimals(abs(c.estimate)))
        ci = f", {c.reason}"
    p = (f", p = {p_value(c.p, alpha)}" if c.p is not None else "") + \
        (f", Holm-adjusted over the {m} balance tests p = {p_value(p_holm, alpha)}" if p_holm is not None and m > 1 else "")
    what, noun = {"gain": ("smoothed gain over the untrained control", "gain"),
                  "eval": ("smoothed held-out reward", "reward")}.get(sp.select_on, ("smoothed reward", "reward"))
    head = (f"Matched-reward balance{where}: {sp.pcpo}'s reward-matched checkpoints sit at a {what} of "
            f"{c.treatment_value:.{d}f}, {sp.baseline}'s at {c.baseline_value:.{d}f} ({sp.pcpo} - {sp.baseline} "
            f"{c.estimate:+.{d}f}{ci}{p}; {design}{gone_txt})")
    if imbalanced:
        return (head + f": the arms' matched checkpoints differ in {noun}, so a matched-reward image-metric "
                       f"difference may partly be this {noun} difference; read the matched-epoch comparison beside it.")
    how = "detectable at 80% power" + (f" after Holm over the {m} balance tests" if m > 1 else "")
    lvl = alpha if level is None else level
    n = min(c.n_baseline, c.n_treatment)
    power = (f" ({how}: ±{c.mde:.{d}f})" if c.mde is not None
             else f" (no imbalance is detectable with {n} seed{'s' if n != 1 else ''} per arm: the exact permutation "
                  f"test's smallest p is {c.p_floor:.2g}, not below {lvl:.3g})"
             if c.p_floor is not None and c.p_floor >= lvl
             else " (no spread measured, so no detectable effect)" if c.ci_low is None else "")
    return head + f": no evidence that one arm's matched checkpoints carry more {noun}{power}."
