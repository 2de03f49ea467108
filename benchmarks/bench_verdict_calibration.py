"""Calibration of the shipped verdict on REAL toy runs: A/A false positives, power, CI coverage,
and two negative controls (frozen policies), resampled from many trained seeds.

Data: ``benchmarks/data/toy_demo_runs.parquet`` (``benchmarks/calibration_runs.py``): every seed
of the demo regime (``analysis/toy_study.yaml``) trained once per arm, DDPO and PCPO, each with its
paired untrained control. Each simulated study draws seeds *without replacement* from that pool and
runs the study's own verdict code (:func:`pcpo_eval.stats.verdict.verdict_rows` with the demo's
targets, gain targets, window, k and default primary endpoint), so what is measured is exactly what
``pcpo-eval study`` would print. Scenarios:

* ``A/A DDPO`` / ``A/A PCPO``: both arms from one algorithm's pool, 2n distinct seeds. ``unpaired``:
  the arms carry different seed labels (Welch, as ``analysis/toy_aa_study.yaml``); ``paired``: the
  same labels (the paired t test on runs that share nothing: still valid, no gain from pairing).
* ``2x gain (planted)``: the treatment arm's runs (distinct seeds of the DDPO pool) are rewritten as
  ``control + 2 (reward - control)``: the same runs learning twice as much per epoch. Same labels
  (paired test, no shared noise: conservative).
* ``PCPO vs DDPO``: the real comparison, paired by real seeds (the same seed draws the same prompts
  and noises in both arms).
* ``frozen DDPO`` / ``frozen PCPO sampler`` (negative controls): the treatment is an untrained
  policy, i.e. its reward curve IS its paired control (the control is the untrained model on the same
  prompts and noises; a run trained at learning rate 1e-12 logs reward == control). "Frozen PCPO
  sampler" uses PCPO's controls against trained DDPO: the sampler offset trap of a raw-reward
  speed-up. A frozen arm must never be called faster.

Printed (markdown, for benchmarks/RESULTS.md): per scenario and seeds per arm, the share of
studies in which the primary endpoint is significant, in which ANY row is (family-wise; the sampler
offset is a secondary row), in which any row or the offset's own test at alpha is (what a study claimed
before 2026-11-28, when the offset was tested beside the verdict), per-row
rates, the coverage of the 95% speed-up CI of the gain targets (truth: the RMST speed-up over the
whole pool), and, for the planted effect, the seeds the planning rule asks for and the power at
that count. 95% Clopper-Pearson intervals on every rate.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_verdict_calibration.py [--studies 500]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcpo_eval.stats.runlevel import no_power_figures  # noqa: E402
from pcpo_eval.stats.speedup import epochs_to_target, speedup_runs  # noqa: E402
from pcpo_eval.stats.verdict import run_curves, verdict_rows  # noqa: E402
from pcpo_eval.study.spec import load_spec  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "toy_demo_runs.parquet"
SPEC = ROOT / "analysis" / "toy_study.yaml"
SEED = 20261125
#: the verdict's level
ALPHA = 0.05


def clopper(k: int, n: int) -> str:
    lo = scipy.stats.beta.ppf(0.025, k, n - k + 1) if k else 0.0
    hi = scipy.stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    return f"{k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def pool(runs: pd.DataFrame, arm: str) -> dict[int, pd.DataFrame]:
    d = runs[runs["arm"] == arm]
    return {int(s): g.sort_values("epoch") for s, g in d.groupby("seed")}


def arm_frame(curves: list[pd.DataFrame], arm: str, labels: list[str], transform: Callable | None = None) -> pd.DataFrame:
    out = []
    for g, lab in zip(curves, labels, strict=True):
        r, c = g["reward_mean"].to_numpy(), g["control_reward_mean"].to_numpy()
        if transform is not None:
            r = transform(r, c)
        out.append(pd.DataFrame({"arm": arm, "cell": "all", "seed": lab, "epoch": g["epoch"].to_numpy(),
                                 "reward_mean": r, "control_reward_mean": c}))
    return pd.concat(out, ignore_index=True)


def twice_gain(r: np.ndarray, c: np.ndarray) -> np.ndarray:
    return c + 2.0 * (r - c)


def frozen(r: np.ndarray, c: np.ndarray) -> np.ndarray:
    return c.copy()


class Scenario:
    """How one simulated study's two arms are drawn from the pools."""

    def __init__(self, name: str, draw: Callable[[np.random.Generator, int], pd.DataFrame]) -> None:
        self.name, self.draw = name, draw


def scenarios(ddpo: dict[int, pd.DataFrame], pcpo: dict[int, pd.DataFrame]) -> list[Scenario]:
    ds, ps = sorted(ddpo), sorted(pcpo)
    common = sorted(set(ds) & set(ps))

    def aa(p: dict[int, pd.DataFrame], seeds: list[int], paired: bool) -> Callable:
        def draw(rng: np.random.Generator, n: int) -> pd.DataFrame:
            s = rng.choice(seeds, 2 * n, replace=False)
            la, lb = [str(i) for i in range(n)], [str(i) for i in range(n)] if paired else [str(n + i) for i in range(n)]
            return pd.concat([arm_frame([p[x] for x in s[:n]], "A", la), arm_frame([p[x] for x in s[n:]], "B", lb)])
        return draw

    def planted(rng: np.random.Generator, n: int) -> pd.DataFrame:
        s = rng.choice(ds, 2 * n, replace=False)
        lab = [str(i) for i in range(n)]
        return pd.concat([arm_frame([ddpo[x] for x in s[:n]], "A", lab),
                          arm_frame([ddpo[x] for x in s[n:]], "B", lab, twice_gain)])

    def real(rng: np.random.Generator, n: int) -> pd.DataFrame:
        s = rng.choice(common, n, replace=False)
        lab = [str(x) for x in s]
        return pd.concat([arm_frame([ddpo[x] for x in s], "A", lab), arm_frame([pcpo[x] for x in s], "B", lab)])

    def frozen_arm(src: dict[int, pd.DataFrame]) -> Callable:
        def draw(rng: np.random.Generator, n: int) -> pd.DataFrame:
            s = rng.choice(common, n, replace=False)
            lab = [str(x) for x in s]
            return pd.concat([arm_frame([ddpo[x] for x in s], "A", lab), arm_frame([src[x] for x in s], "B", lab, frozen)])
        return draw

    return [Scenario("A/A DDPO, unpaired", aa(ddpo, ds, False)), Scenario("A/A DDPO, paired labels", aa(ddpo, ds, True)),
            Scenario("A/A PCPO, unpaired", aa(pcpo, ps, False)), Scenario("2x gain (planted)", planted),
            Scenario("PCPO vs DDPO (real pairs)", real), Scenario("frozen DDPO vs DDPO", frozen_arm(ddpo)),
            Scenario("frozen PCPO sampler vs DDPO", frozen_arm(pcpo))]


def truth_speedups(ddpo: dict[int, pd.DataFrame], targets: list[float], window: int) -> dict[str, float]:
    """Pool-level RMST speed-up of the planted 2x-gain arm over DDPO per gain target (the estimand)."""
    full = pd.concat([arm_frame(list(ddpo.values()), "A", [str(s) for s in ddpo]),
                      arm_frame(list(ddpo.values()), "B", [str(s) for s in ddpo], twice_gain)])
    runs = run_curves(full)
    out = {}
    for t in targets:
        b = [epochs_to_target(r.curve("gain"), t, window, epochs=r.epochs) for r in runs if r.arm == "A"]
        tt = [epochs_to_target(r.curve("gain"), t, window, epochs=r.epochs) for r in runs if r.arm == "B"]
        s = speedup_runs(b, tt, target=t)
        out[f"speedup_gain:{t:g}"] = float(s.estimate) if s.estimate is not None else float("nan")
    return out


def covers(v, x: float) -> bool:
    """Whether a speed-up row's CI holds ``x``: within ``ci_low..ci_high`` (unbounded above when None) and
    not inside the hole of a two-piece Fieller set (``details["ci_gap"]``). Rows without a CI (no spread:
    the exact permutation p) are left out of the coverage by the caller."""
    hi = v.ci_high if v.ci_high is not None else np.inf
    gap = v.details.get("ci_gap") or [None, None]
    in_gap = gap[0] is not None and gap[1] is not None and gap[0] < x < gap[1]
    return bool(v.ci_low <= x <= hi and not in_gap)


def run_scenario(sc: Scenario, n: int, studies: int, settings: dict, truth: dict[str, float], rng: np.random.Generator) -> dict:
    with no_power_figures():
        return _run_scenario(sc, n, studies, settings, truth, rng)


def _run_scenario(sc: Scenario, n: int, studies: int, settings: dict, truth: dict[str, float],
                  rng: np.random.Generator) -> dict:
    prim = anyrow = before = 0
    per_row: dict[str, list[int]] = {}
    cover: dict[str, list[int]] = {}
    faster = 0
    for _ in range(studies):
        rows = verdict_rows(sc.draw(rng, n), "A", ["B"], rng=rng, n_boot=50, **settings)
        prim += any(v.significant for v in rows if v.family == "primary")
        anyrow += any(v.significant for v in rows)
        # before 2026-11-28 the sampler offset was a test of its own at alpha beside the verdict's families
        before += any(v.significant or (v.quantity == "sampler_offset" and v.p is not None and v.p < ALPHA)
                      for v in rows)
        faster += any(v.significant and v.quantity.startswith("speedup") and (v.estimate or 0) > 0 for v in rows)
        for v in rows:
            k = per_row.setdefault(v.quantity, [0, 0])
            k[0] += v.significant
            k[1] += 1
            if v.quantity in truth and v.estimable and v.ci_low is not None and sc.name.startswith(("2x", "A/A")):
                c = cover.setdefault(v.quantity, [0, 0])
                c[0] += covers(v, truth[v.quantity] if sc.name.startswith("2x") else 0.0)
                c[1] += 1
    return {"primary": clopper(prim, studies), "any": clopper(anyrow, studies), "before": clopper(before, studies),
            "faster": clopper(faster, studies),
            "rows": {q: clopper(k, m) + ("" if m == studies else f" of {m} studies with the row") for q, (k, m) in per_row.items()},
            "coverage": {q: clopper(k, m) for q, (k, m) in cover.items()}}


def planning_seeds(ddpo: dict[int, pd.DataFrame], settings: dict, pilot: int) -> tuple[int | None, dict]:
    """What ``pcpo-eval study --plan`` recommends for a doubled gain (+100% of the baseline's paired gain),
    from a pilot study of ``pilot`` DDPO seeds against ``pilot`` other seeds rewritten to twice the gain
    (the pilot's verdict rows, exactly as a finished pilot's results.json holds them)."""
    from pcpo_eval.study.plan import plan_rows

    seeds = sorted(ddpo)[: 2 * pilot]
    lab = [str(i) for i in range(pilot)]
    table = pd.concat([arm_frame([ddpo[x] for x in seeds[:pilot]], "A", lab),
                       arm_frame([ddpo[x] for x in seeds[pilot:]], "B", lab, twice_gain)])
    rows = verdict_rows(table, "A", ["B"], rng=np.random.default_rng(0), n_boot=50, **settings)
    plan = {r["endpoint"]: r for r in plan_rows(load_spec(SPEC, check_weights=False),
                                                {"verdict": [v.to_dict() for v in rows]}, None, 1.0)}
    return plan["paired_gain"]["seeds"], plan["paired_gain"]


def command(a: argparse.Namespace) -> str:
    """The command line that reproduces this table (every option that shapes the draws)."""
    extra = f' --scenarios "{a.scenarios}"' if a.scenarios else ""
    return f"python benchmarks/bench_verdict_calibration.py --studies {a.studies} --sizes {a.sizes}{extra} --seed {a.seed}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=500)
    ap.add_argument("--sizes", default="2,3,5,10")  # the sizes of RESULTS.md's table (the draws depend on them)
    ap.add_argument("--scenarios", default="", help="only these scenarios (names separated by ';'); then the "
                    "planning rule's seed count is not added to --sizes")
    ap.add_argument("--seed", type=int, default=SEED, help="numpy seed of the draws (a re-check of one cell on "
                    "fresh draws)")
    a = ap.parse_args(argv)
    only = [x.strip() for x in a.scenarios.split(";") if x.strip()]
    runs = pd.read_parquet(DATA)
    ddpo, pcpo = pool(runs, "DDPO"), pool(runs, "PCPO")
    sp = load_spec(SPEC, check_weights=False)
    k = sp.window
    settings = {"targets": list(sp.targets), "gain_targets": list(sp.gain_targets), "window": sp.window, "k": k,
                "primary": list(sp.primary) or None}
    truth = truth_speedups(ddpo, list(sp.gain_targets), sp.window)
    n_need, plan = planning_seeds(ddpo, settings, min(5, len(ddpo) // 2))
    sizes = [int(x) for x in a.sizes.split(",")]
    if n_need is not None and n_need not in sizes and 2 * n_need <= len(ddpo) and not only:
        sizes.append(n_need)
    all_scenarios = scenarios(ddpo, pcpo)
    unknown = [x for x in only if x not in {sc.name for sc in all_scenarios}]
    if unknown:
        ap.error(f"unknown scenario {unknown[0]!r}; choose from: {'; '.join(sc.name for sc in all_scenarios)}")
    rng = np.random.default_rng(a.seed)
    t0 = time.perf_counter()
    print("## Verdict calibration on real toy runs\n")
    print(f"{len(ddpo)} DDPO and {len(pcpo)} PCPO seeds of the demo regime (`benchmarks/calibration_runs.py`, "
          f"`benchmarks/data/toy_demo_runs.parquet`); `{command(a)}`.\n")
    print(f"{a.studies} resampled studies per row (seeds drawn without replacement, numpy seed {a.seed}); targets "
          f"{settings['targets']}, gain targets {settings['gain_targets']}, window {sp.window}; primary endpoint: "
          f"{settings['primary'] or 'paired_gain (default)'}. Rates with 95% Clopper-Pearson intervals.")
    print(f"`study --plan` on a {min(5, len(ddpo) // 2)}-vs-{min(5, len(ddpo) // 2)}-seed pilot of the planted scenario (baseline paired gain {plan['baseline']:.4f}, "
          f"SD of the differences {plan['sd']:.4f}): a doubled gain (+100%) needs {n_need} seeds per arm. Pool truth of "
          "the planted speed-ups: "
          + ", ".join(f"{q} {v:+.1%}" for q, v in truth.items()) + "\n")
    print("| scenario | seeds/arm | primary significant | any row significant | any row, or the offset's own test "
          "(before 2026-11-28) | called faster (any speed-up) | per-row significant | CI coverage (gain speed-ups) |")
    print("|---|---:|---|---|---|---|---|---|")
    for sc in (sc for sc in all_scenarios if not only or sc.name in only):
        for n in sizes:
            need = 2 * n if sc.name.startswith(("A/A", "2x")) else n
            pool_size = len(pcpo) if "PCPO, unpaired" in sc.name else len(ddpo)
            if need > pool_size:
                continue
            r = run_scenario(sc, n, a.studies, settings, truth, rng)
            rows = "; ".join(f"{q} {v}" for q, v in r["rows"].items())
            cov = "; ".join(f"{q} {v}" for q, v in r["coverage"].items()) or "-"
            print(f"| {sc.name} | {n} | {r['primary']} | {r['any']} | {r['before']} | {r['faster']} | {rows} | {cov} |",
                  flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
