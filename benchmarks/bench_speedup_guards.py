"""How often a speed-up is called "faster" without learning faster: the first crossing alone vs the shipped rule.

Simulated studies (paired runs, a control shared per seed, saturating gain curves with seed-to-seed spread
and per-epoch evaluation noise: :func:`tests.support.curves.learning_study`), each through the shipped :func:`pcpo_eval.stats.verdict.verdict_rows` with
a gain speed-up as the primary endpoint (so no gate hides it; the non-learner scenario keeps the default,
the paired gain, which its lower gain opens). Per scenario, the share of studies in which some speed-up
row says PCPO is faster:

* ``first crossing``: the row's own test on the runs' first crossings (``details["p_first_crossing"]`` <
  alpha, Holm within each family behind the gate, as the verdict): the rule before the midpoint and
  learning bounds;
* ``shipped``: the row's ``significant`` (p the largest of the first-crossing test's, the midpoint
  crossings' test's and the faster arm's learning test's; ``speedup.bound_by_midpoint``,
  ``bound_by_learning``).

Scenarios: A/A whose PCPO arm has 3x the evaluation noise (should be <= 5%); an arm that does not learn
(gain 0, noise 0.03) against a slowly learning baseline (should be 0); PCPO learning 2x with 2x the noise,
and 2x with the same noise (power: what the bounds cost). 95% Clopper-Pearson intervals.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_speedup_guards.py [--studies 200]``
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
import scipy.stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pcpo_eval.stats.power as power  # noqa: E402
import pcpo_eval.stats.runlevel as runlevel  # noqa: E402
from pcpo_eval.stats.adjust import holm  # noqa: E402
from pcpo_eval.stats.verdict import verdict_rows  # noqa: E402
from tests.support.curves import learning_study  # noqa: E402

SEED = 20261127
#: name: (seeds per arm, arms, gain targets, primary endpoint (None: the default, the paired gain), rate of the
#: baseline's learning): the fourth verdict review's scenarios e1 (noisier arm) and e2 (noisy non-learner)
SCENARIOS = {
    "A/A, PCPO 3x the evaluation noise": (20, {"DDPO": {"noise": 0.01}, "PCPO": {"noise": 0.03}}, (0.02, 0.03),
                                          ("speedup_gain",), 0.08),
    "PCPO learns nothing (gain noise 0.03) vs slow DDPO": (20, {"DDPO": {"noise": 0.01}, "PCPO": {"noise": 0.03,
                                                                                                   "gain": None}},
                                                           (0.01, 0.02), None, 0.015),
    "PCPO 2x gain, 2x the noise (power)": (10, {"DDPO": {"noise": 0.01}, "PCPO": {"noise": 0.02, "gain": 2.0}},
                                           (0.02, 0.03), ("speedup_gain",), 0.08),
    "PCPO 2x gain, same noise (power)": (10, {"DDPO": {"noise": 0.01}, "PCPO": {"noise": 0.01, "gain": 2.0}},
                                         (0.02, 0.03), ("speedup_gain",), 0.08),
}


def first_crossing_faster(rows: list) -> bool:
    """Some speed-up row significant for PCPO on the first-crossing test alone (the rule before the bounds):
    Holm within each family, the secondary family only behind significant primary rows, as the verdict."""
    p = {id(r): (r.details["p_first_crossing"] if r.quantity.startswith("speedup") else r.p) for r in rows
         if r.estimable and r.p is not None}
    sig = {}
    for fam in ("primary", "secondary"):
        mine = [r for r in rows if r.family == fam and id(r) in p]
        gate = fam == "primary" or all(sig.get(id(r), False) for r in rows if r.family == "primary")
        for r, pa in zip(mine, holm([p[id(r)] for r in mine]) if mine else [], strict=True):
            sig[id(r)] = gate and pa < 0.05
    return any(sig.get(id(r)) and r.quantity.startswith("speedup") and (r.estimate or 0) > 0 for r in rows)


def clopper(k: int, n: int) -> str:
    lo = scipy.stats.beta.ppf(0.025, k, n - k + 1) if k else 0.0
    hi = scipy.stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return f"{k}/{n} = {k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=200)
    a = ap.parse_args(argv)
    # the power figures enter no p or verdict (as tests/stats/conftest.py's fast_loop)
    power.mde = lambda *x, **k: None
    power.seeds_needed = lambda *x, **k: None
    runlevel._mde = lambda *x, **k: None
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    print("## Speed-up guards: faster without learning faster\n")
    print(f"`benchmarks/bench_speedup_guards.py --studies {a.studies}` (numpy seed {SEED}); a gain speed-up as the "
          "primary endpoint unless the table says otherwise; share of studies with some speed-up row calling PCPO faster, "
          "95% Clopper-Pearson.\n")
    print("| scenario | seeds/arm | primary endpoint | first crossing alone | shipped (midpoint + learning bounds) |")
    print("|---|---:|---|---|---|")
    rng = np.random.default_rng(SEED)
    for name, (n, arms, targets, primary, k_rate) in SCENARIOS.items():
        before = after = 0
        for _ in range(a.studies):
            rows = list(verdict_rows(learning_study(rng, n, arms, k_rate), "DDPO", rng=rng, gain_targets=targets, primary=primary,
                                     n_boot=10))
            before += first_crossing_faster(rows)
            after += any(r.significant and r.quantity.startswith("speedup") and (r.estimate or 0) > 0 for r in rows)
        print(f"| {name} | {n} | {'speed-up' if primary else 'paired gain'} | {clopper(before, a.studies)} | "
              f"{clopper(after, a.studies)} |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
