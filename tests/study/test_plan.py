"""``pcpo-eval study SPEC --plan``: seeds per arm for a stated effect, from a pilot or a stated CV.

The plan must give the same seed count as the power function the verdict uses on the pilot's own
spread, and a planted effect of that size must then be detected in about 80% of studies.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.stats.power import seeds_needed, t_power
from pcpo_eval.stats.verdict import verdict_rows
from pcpo_eval.study.plan import plan_rows, plan_text
from pcpo_eval.study.spec import load_spec

SPEC = Path(__file__).resolve().parents[2] / "analysis" / "toy_study.yaml"


def _table(rng: np.random.Generator, n: int, gain_b: float, gain_t: float, sd: float) -> pd.DataFrame:
    """Paired arms: per seed a shared control level; each run's gain ramps to its own final level."""
    rows = []
    e = np.arange(1, 25)
    for s in range(n):
        ctrl = 0.6 + rng.normal(0, 0.05) + rng.normal(0, 0.01, e.size)
        for arm, g in (("DDPO", gain_b), ("PCPO", gain_t)):
            final = g + rng.normal(0, sd)
            reward = ctrl + final * (e - 1) / 23 + rng.normal(0, 0.005, e.size)
            rows += [{"arm": arm, "cell": "all", "seed": str(s), "epoch": int(x), "reward_mean": r,
                      "control_reward_mean": c} for x, r, c in zip(e, reward, ctrl, strict=True)]
    return pd.DataFrame(rows)


def _pilot(tmp_path: Path, table: pd.DataFrame) -> Path:
    rows = verdict_rows(table, "DDPO", ["PCPO"], rng=np.random.default_rng(0), gain_targets=[0.03], k=5, n_boot=50)
    runs = [{"run": f"{a}-{s}", "cell": "all", "arm": a, "compute_s": list(np.cumsum(np.full(24, 2.0)))}
            for a, s in table[["arm", "seed"]].drop_duplicates().itertuples(index=False)]
    out = tmp_path / "pilot"
    (out / "runs" / "r0").mkdir(parents=True)
    (out / "runs" / "r0" / "weights.bin").write_bytes(b"x" * 6_000_000)
    (out / "results.json").write_text(json.dumps({"verdict": [v.to_dict() for v in rows], "runs": runs}))
    return out


def test_plan_from_a_pilot_matches_the_power_function(tmp_path):
    table = _table(np.random.default_rng(3), 3, 0.10, 0.10, 0.02)
    pilot = _pilot(tmp_path, table)
    sp = load_spec(SPEC, check_weights=False)
    rows = {r["endpoint"]: r for r in plan_rows(sp, json.loads((pilot / "results.json").read_text()), None, 0.25)}
    g = rows["paired_gain"]
    # independent check: the SD of the per-seed differences of the pilot's paired gains
    gains = {a: np.asarray([(d["reward_mean"] - d["control_reward_mean"]).to_numpy()[-5:].mean()
                            for _, d in table[table["arm"] == a].groupby("seed")]) for a in ("DDPO", "PCPO")}
    sd = float(np.std(gains["PCPO"] - gains["DDPO"], ddof=1))
    assert g["sd"] == pytest.approx(sd, rel=1e-9)
    assert g["baseline"] == pytest.approx(gains["DDPO"].mean(), rel=1e-9)
    # the pilot's SD is measured from its 3 pairs: the seeds whose power averaged over that SD's uncertainty is
    # 80% (26 here), well above the 12 at the SD taken as the truth
    assert g["seeds"] == seeds_needed(0.25 * gains["DDPO"].mean(), sd, paired=True, measured=3)
    n = g["seeds"]
    plug_in = seeds_needed(0.25 * gains["DDPO"].mean(), sd, paired=True)
    assert t_power(0.25 * g["baseline"], sd, plug_in, paired=True) >= 0.8 > t_power(0.25 * g["baseline"], sd, plug_in - 1,
                                                                                    paired=True)
    assert n > plug_in
    assert "speedup_gain:0.03" in rows and rows["speedup_gain:0.03"]["seeds"] >= 2
    # the pilot's sampler-offset row counts in the secondary family but is no effect to plan seeds for
    res = json.loads((pilot / "results.json").read_text())
    assert any(v["quantity"] == "sampler_offset" for v in res["verdict"])
    assert "sampler_offset" not in rows
    # a pilot analysed before the offset was a secondary row: its family had one row less; planned as it is now
    old = [{**v, "details": {**v["details"], "family_size": v["details"]["family_size"] - (v["family"] == "secondary")}}
           for v in res["verdict"] if v["quantity"] != "sampler_offset"]
    again = {r["endpoint"]: r for r in plan_rows(sp, {**res, "verdict": old}, None, 0.25)}
    assert again["speedup_gain:0.03"] == rows["speedup_gain:0.03"] and again["auc"] == rows["auc"]
    # a secondary row must pass Holm over its family: the pilot's verdict has final, AUC and the gain
    # speed-up as its secondary rows (the spec would allow 6; the pilot knows which exist)
    assert g["level"] == 0.05 and g["family_size"] == 1
    sg = rows["speedup_gain:0.03"]
    seen = json.loads((pilot / "results.json").read_text())["verdict"][1]["details"]["family_size"]
    assert seen == 3 and sg["family_size"] == 3 and sg["level"] == pytest.approx(0.05 / 3)
    f = rows["final_reward"]
    assert f["seeds"] == seeds_needed(0.25 * f["baseline"], f["sd"], paired=True, alpha=0.05 / 3, measured=3)
    assert f["seeds"] >= seeds_needed(0.25 * f["baseline"], f["sd"], paired=True)  # a large effect: 3 either way
    text = plan_text(sp, pilot, None, 0.25)
    assert f"final_reward: +25% of the baseline (baseline {f['baseline']:.4g}, SD {f['sd']:.3g}) -> {f['seeds']} seeds " \
           "per arm (at 0.0167: Holm over 3 rows)" in text
    assert f"paired_gain: +25% of the baseline (baseline {g['baseline']:.4g}" in text
    assert "the spec trains 3 seed(s) per arm" in text and "paired by seed" in text
    assert "process-hours of training" in text and "MB per run as in the pilot" in text
    # the secondary speed-up rows' seeds presume the gate opens: said, with the fix
    assert "are secondary: tested only once the primary (paired_gain) is significant" in text
    assert "name it the primary (primary: [speedup_gain:" in text


def test_planted_effect_is_detected_at_the_planned_seed_count(tmp_path):
    """The planning rule's promise, checked: plan a +50% paired gain from a 5-seed pilot, then simulate
    studies at that seed count with the effect planted; the primary row is significant in ~80%.
    Measured (seeds 11 and 20261125, 200 studies): the plan asked for 5 seeds and power was 0.825."""
    sd, base = 0.02, 0.10
    pilot = _pilot(tmp_path, _table(np.random.default_rng(11), 5, base, base, sd))
    sp = load_spec(SPEC, check_weights=False)
    rows = {r["endpoint"]: r for r in plan_rows(sp, json.loads((pilot / "results.json").read_text()), None, 0.5)}
    n = rows["paired_gain"]["seeds"]
    assert 3 <= n <= 40
    rng = np.random.default_rng(20261125)
    hits = 0
    studies = 200
    for _ in range(studies):
        rows_ = verdict_rows(_table(rng, n, base, 1.5 * base, sd), "DDPO", ["PCPO"], rng=rng, k=5, n_boot=20)
        hits += next(v for v in rows_ if v.quantity == "paired_gain").significant
    assert hits / studies >= 0.65, (n, hits / studies)  # 80% planned; the pilot's SD is itself uncertain


def test_plan_from_a_stated_cv():
    sp = load_spec(SPEC, check_weights=False)
    text = plan_text(sp, None, 0.3, 0.25)
    assert "no pairing benefit assumed" in text and "give --pilot STUDY_DIR" in text
    n = seeds_needed(0.25, 0.3 * math.sqrt(2), paired=True)
    assert f"paired_gain: +25% -> {n} seeds per arm\n" in text  # the primary, alone in its family
    # the secondary family: final reward, AUC, the sampler offset, 2 gain and 2 reward speed-ups
    n_sg = seeds_needed(1 - 1 / 1.25, 0.3 * math.sqrt(2), paired=True, alpha=0.05 / 7)
    assert f"speedup_gain:0.03: +25% speed-up -> {n_sg} seeds per arm (at 0.00714: Holm over 7 rows)" in text
    assert "speedup_reward:0.92" in text
    # without paired controls there is no gain curve: the final reward is the primary endpoint
    import dataclasses

    text = plan_text(dataclasses.replace(sp, paired_control=False, primary=()), None, 0.3, 0.25)
    assert f"final_reward: +25% -> {n} seeds per arm\n" in text
    assert "paired_gain" not in text and "speedup_gain" not in text and "speedup_reward:0.92" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--plan"], "--plan needs either --pilot STUDY_DIR"),
    (["--plan", "--cv", "-1"], "--cv must be a positive number"),
    (["--plan", "--cv", "0.3", "--effect", "0"], "--effect must be a positive fraction"),
    (["--plan", "--pilot", "{tmp}/nope"], "has no results.json"),
    (["--cv", "0.3"], "--pilot and --cv go with --plan"),
])
def test_plan_bad_input_is_one_line(tmp_path, cli, args, message):
    res = cli("study", str(SPEC), *[a.format(tmp=tmp_path) for a in args])
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and message in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "nope").exists() and not any(tmp_path.iterdir())


def test_a_speedup_plan_covers_the_midpoint_test_too(tmp_path):
    """"Sooner" needs the first-crossing test and the midpoint-crossing test (stats.speedup.bound_by_midpoint):
    the plan asks for the seeds of whichever needs more, so a pilot whose midpoints spread more (noisy
    curves crossing back and forth) is not planned from its first crossings alone."""
    sp = load_spec(SPEC, check_weights=False)
    pilot = json.loads((_pilot(tmp_path, _table(np.random.default_rng(3), 5, 0.10, 0.10, 0.01))
                        / "results.json").read_text())
    row = next(r for r in pilot["verdict"] if r["quantity"] == "speedup_gain:0.03")
    d = row["details"]
    assert len(d["midpoint_baseline_epochs"]) == len(d["baseline_epochs"]) == 5

    def seeds(details):
        pl = {**pilot, "verdict": [{**row, "details": details}]}
        return next(r for r in plan_rows(sp, pl, None, 0.25) if r["endpoint"] == "speedup_gain:0.03")["seeds"]

    same = {**d, "midpoint_baseline_epochs": d["baseline_epochs"], "midpoint_treatment_epochs": d["treatment_epochs"]}
    spread = np.asarray(d["treatment_epochs"], dtype=float) + np.array([-4.0, 3.0, -2.0, 4.0, -1.0])
    noisy = {**d, "midpoint_baseline_epochs": d["baseline_epochs"], "midpoint_treatment_epochs": spread.tolist()}
    assert seeds(noisy) is None or seeds(noisy) > seeds(same)
