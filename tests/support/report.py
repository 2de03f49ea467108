"""Small synthetic result objects for the report tests (fast: no training, no images rendered).

The numbers come from the real statistics functions (``fit_lmm``, ``speedup_table``,
``moving_average``) on synthetic tables, so the report is exercised on genuine result shapes.
The run-level keys (``verdict``, ``runs``, ``sampler_offset``, ``progression``) follow the
results.json contract the study writes; their numbers are made up here (the report only formats).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from pcpo_eval.io import to_jsonable
from pcpo_eval.study.image_metrics import family_mdes, fit_record, lmm_study_family

#: A prompt that would run script if the report did not escape it.
EVIL_PROMPT = '<script>document.title="pwned";alert(1)</script> a red <b>cube</b> & "friends"'
EVIL_RUN = "algorithm-<img src=x onerror=alert(2)>"
#: Why the CLIP (toy) fit is not estimable: its scores vary by rounding only (a singular fit alone
#: no longer withholds p-values; it gets lmerTest's tests and a remark).
NOT_ESTIMABLE_REASON = ("residual SD 1e-15 is within 10000 ulps of the response magnitude 0.3: the variation is "
                        "floating-point rounding, estimates are not meaningful")
SAMPLER_SENTENCE = "the samplers alone explain a speed-up of 9% (controls 0.25 vs 0.20)"
#: Verdict sentences as the study writes them (contract examples); checked verbatim in the report.
SENTENCES = {
    "speedup_reward:0.8": "PCPO reaches reward 0.8 sooner than DDPO: 12.0 vs 19.0 epochs (speed-up +58%, 95% CI +21% to +104%)",
    "paired_gain": "no evidence of a difference in paired gain (+0.003, 95% CI -0.010 to +0.016, 3 vs 3 runs)",
    "final_reward": "final reward not comparable: the arms stopped at different epochs (40 vs 35)",
}
ONE_RUN_SENTENCE = "1 run per arm: these are differences between runs, not algorithms"


def synthetic_log(rate: float, epochs: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    e = np.arange(1, epochs + 1)
    r = 1.0 - np.exp(-rate * e) + rng.normal(0, 0.01, epochs)
    return pd.DataFrame({
        "epoch": e, "reward_mean": r, "reward_std": 0.1 + 0 * e, "clipfrac": 0.3 * np.exp(-rate * e),
        "approx_kl": 1e-4 * e, "rho_mean": 1 + 0.01 * rng.normal(size=epochs), "rho_min": 0.9 + 0 * e,
        "rho_max": 1.1 + 0 * e, "rho_std": 0.02 + 0 * e, "grad_first_abs_mean": 1e-3 * (1 + e),
        "grad_first_abs_var": 1e-6 * (1 + e), "wall_time_s": 1.0 + 0 * e,
    })  # fmt: skip


def write_png(path: Path, color: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), color).save(path)


def synthetic_scores() -> pd.DataFrame:
    """Per-prompt scores of a 2 x 2 design: FD with a PCPO effect, LPIPS and CLIP without one.

    Each prompt has one random intercept shared by all conditions (FD, LPIPS); CLIP has none, and
    it varies by floating-point rounding only (a constant score), so its fit is not estimable.
    """
    rng = np.random.default_rng(0)
    prompt_effs = rng.normal(0, 1, 12)
    rows = []
    for alg in ("DDPO", "PCPO"):
        for batch in ("16", "32"):
            for p in range(12):
                rows.append({"algorithm": alg, "batch": batch, "prompt": f"p{p}",
                             "fd_toy": 10 + prompt_effs[p] - 2.0 * (alg == "PCPO") + rng.normal(0, 0.3),
                             "lpips_toy": 0.5 + 0.01 * prompt_effs[p] + rng.normal(0, 0.01)})
    flat = np.random.default_rng(2)
    return pd.DataFrame(rows).assign(clip_toy=lambda d: 0.3 + flat.normal(0, 1e-15, len(d)))


def synthetic_fits(data: pd.DataFrame) -> dict:
    """``value ~ algorithm * batch + (1|prompt)`` per metric (real ``fit_lmm`` results)."""
    from pcpo_eval.stats import fit_lmm

    fits = {m: fit_lmm(data.assign(value=data[m]), "value ~ algorithm * batch", ["prompt"])
            for m in ("fd_toy", "lpips_toy", "clip_toy")}
    assert [f.estimable for f in fits.values()] == [True, True, False], {m: f.reason for m, f in fits.items()}
    return fits


def synthetic_raw_rows() -> list[dict]:
    """Table-2 rows: base, then DDPO and PCPO per cell (PCPO's FD significant, its LPIPS not);
    batch=32 has 3 runs per arm, so its means carry an SD over runs."""
    rows = [{"cell": "", "method": "Base model", "role": "base", "n_runs": 1, "epochs": [],
             "values": {"fd_toy": 0.0, "lpips_toy": 0.55}, "sd": {}, "significant": {}}]
    for b, n in (("16", 1), ("32", 3)):
        sd = {"fd_toy": 0.41, "lpips_toy": 0.02} if n > 1 else {}
        rows.append({"cell": f"batch={b}", "method": "DDPO", "role": "baseline", "n_runs": n, "epochs": [20] * n,
                     "values": {"fd_toy": 12.3456, "lpips_toy": 0.51}, "sd": sd, "significant": {}})
        rows.append({"cell": f"batch={b}", "method": "PCPO", "role": "pcpo", "n_runs": n, "epochs": [12] * n,
                     "values": {"fd_toy": 9.8765, "lpips_toy": 0.52}, "sd": sd,
                     "significant": {"fd_toy": True, "lpips_toy": False}})
    return rows


def synthetic_results(root: Path) -> dict:
    """A results.json-shaped dict with images under ``root`` (the study directory)."""
    from pcpo_eval.stats import adjust_across_metrics, moving_average, speedup_table
    from pcpo_eval.stats.speedup import speedup_cell_epochs

    data = synthetic_scores()
    fits = synthetic_fits(data)
    adjusted = lmm_study_family(adjust_across_metrics(fits))  # results.json's form: with each family's size
    # the fits as results.json holds them, each fixed effect's MDE at its family's level; the
    # not-estimable fit keeps its p-values, to prove the report hides them
    records = {m: fit_record(f, None) if f.estimable else dataclasses.asdict(f) | {
        "reml_criterion": f.reml_criterion, "estimable": False, "reason": f.reason} for m, f in fits.items()}
    _, records = family_mdes({}, records, adjusted, 0.05)
    logs = {(a, b): synthetic_log(0.05 if a == "DDPO" else 0.08, 40, i) for i, (a, b) in
            enumerate([(a, b) for a in ("DDPO", "PCPO") for b in ("16", "32")])}
    speed = []
    for b in ("16", "32"):
        t = speedup_table([logs[("DDPO", b)]], [logs[("PCPO", b)]], [0.5, 0.8, 0.99], 5)
        rows = [{"quantity": f"speedup_reward:{r.target:g}", "curve": "reward", "target": r.target, "uninformative": False,
                 "baseline_epochs": speedup_cell_epochs(r.baseline_mean, r.n_censored_baseline, r.n_baseline),
                 "pcpo_epochs": speedup_cell_epochs(r.treatment_mean, r.n_censored_treatment, r.n_treatment),
                 "speedup": r.estimate, "ci_low": r.ci_low, "ci_high": r.ci_high, "p": r.p, "p_adjusted": r.p,
                 "significant": r.significant, "mde": r.mde, "seeds_for_reference": r.seeds_for_reference, "tau": r.tau,
                 "status": r.reason or "ok"} for r in t.rows]
        rows.append({"quantity": "speedup_gain:0.05", "curve": "gain", "target": 0.05, "uninformative": True,
                     "status": "no paired control logged: a gain curve needs paired_control: true", "speedup": None})
        speed.append({"cell": f"batch={b}", "baseline": "DDPO", "pcpo": "PCPO", "window": 5, "rows": rows})
    traces = []
    for (a, b), log in logs.items():
        tr = {"run": f"{a}_{b}" if a == "DDPO" else EVIL_RUN, "role": "baseline" if a == "DDPO" else "pcpo",
              "cell": f"batch={b}", "levels": {"algorithm": a, "batch": b}, "epoch": log["epoch"].tolist()}
        for c in log.columns[1:]:
            tr[c] = log[c].tolist()
        tr["reward_smoothed"] = moving_average(log["reward_mean"].to_numpy(), 5).tolist()
        tr["clipfrac_smoothed"] = moving_average(log["clipfrac"].to_numpy(), 5).tolist()
        traces.append(tr)
    cols = [("base", (128, 128, 128)), ("ddpo", (30, 100, 200)), ("pcpo", (220, 120, 20))]
    grid_rows = []
    for pid, prompt in enumerate([EVIL_PROMPT, "a blue ball"]):
        imgs = []
        for name, color in cols:
            paths = []
            for s in range(2):
                rel = f"sets/{name}/images/p{pid:05d}/s{s:07d}.png"
                write_png(root / rel, color)
                paths.append(rel)
            imgs.append(paths)
        grid_rows.append({"prompt_id": pid, "prompt": prompt, "seeds": [0, 1], "images": imgs})
    write_png(root / "figures" / "credit.png", (255, 255, 255))  # stand-in for credit_figure_png() (slow import)
    return {
        "study": {"name": "synthetic <study>", "description": f"test study {EVIL_PROMPT}", "source": "spec.yaml",
                  "spec_yaml": f"name: synthetic\ndescription: '{EVIL_PROMPT}'\n", "created": "now",
                  "factors": {"algorithm": ["DDPO", "PCPO"], "batch": ["16", "32"]},
                  "compare": {"factor": "algorithm", "baseline": "DDPO", "pcpo": "PCPO"},
                  "runs": [{"name": EVIL_RUN, "levels": {"algorithm": "PCPO", "batch": "16"}, "run_dir": "x",
                            "trained_by_study": True}],
                  "sampling": {"steps": 10, "cfg": 3.0}, "eval": {"prompts": "toy", "seeds": "4"}, "window": 5},
        "metric_labels": {"fd_toy": "FD (toy)", "lpips_toy": "LPIPS (toy)", "clip_toy": "CLIP (toy)"},
        "metrics": ["fd_toy", "lpips_toy"],
        "speedup": speed,
        "selection": {"target": 0.8, "window": 5, "runs": [
            {"name": EVIL_RUN, "cell": "batch=16", "role": "pcpo", "epoch": 12, "reward": 0.81, "gap": 0.01, "reached": True},
            {"name": "DDPO_16", "cell": "batch=16", "role": "baseline", "epoch": 20, "reward": 0.79, "gap": -0.01, "reached": False}]},
        "raw_scores": {"columns": ["fd_toy", "lpips_toy"], "rows": synthetic_raw_rows(), "rule": "bold: significant",
                       "significance": {"batch=16": {"fd_toy": {"estimate": -2.0, "se": 0.1, "df": 11.0, "p": 1e-6,
                                                                 "p_adj": 2e-6, "significant": True},
                                                      "lpips_toy": {"error": "constant response"},
                                                      "clip_toy": {"estimate": 0.001, "se": 0.003, "df": None, "p": None,
                                                                   "p_adj": None, "significant": False, "converged": True,
                                                                   "estimable": False, "reason": NOT_ESTIMABLE_REASON}}}},
        "lmm": {"formula": "value ~ algorithm * batch + (1|prompt)", "coding": "treatment",
                "df_method": "Satterthwaite (lmerTest)", "estimation": "REML", "adjust": "holm", "alpha": 0.05,
                "fits": {**records,
                         "is_toy": {"error": "grouping column 'prompt' has only one level"}},
                "adjusted": adjusted, "n_rows": len(data)},
        "preference": {"prompts": "unseen.txt", "seeds": "1", "columns": ["hps"], "rows": [
            {"label": "Base model", "role": "base", "values": {"hps": 0.25}, "best": {"hps": False}},
            {"label": f"{EVIL_RUN} (E12)", "role": "pcpo", "values": {"hps": 0.33}, "best": {"hps": True}}]},
        "traces": traces,
        "figures": {"credit": "figures/credit.png"},
        "grids": [{"cell": "batch=16", "columns": [
            {"label": "Base model", "role": "base", "epoch": None, "reward": None},
            {"label": "DDPO (E20)", "role": "baseline", "epoch": 20, "reward": 0.79},
            {"label": "PCPO (E12)", "role": "pcpo", "epoch": 12, "reward": 0.81}], "rows": grid_rows}],
        "verdict": synthetic_verdict(n_runs=3),
        "runs": synthetic_runs(), "rliable": synthetic_rliable(synthetic_runs()),
        "sampler_offset": {f"batch={b}": {"baseline_control_mean": 0.2, "treatment_control_mean": 0.25,
                                          "difference": 0.05, "explains": SAMPLER_SENTENCE} for b in ("16", "32")},
        "progression": synthetic_progression(root),
    }


def verdict_row(quantity: str, estimate: float | None, ci: tuple[float | None, float | None], p: float | None,
                n_runs: int, cell: str = "batch=16", sentence: str | None = None, reason: str | None = None,
                family: str = "secondary") -> dict:
    """One verdict object of the results.json contract (not estimable when ``reason`` is given)."""
    return {"cell": cell, "quantity": quantity, "baseline": "DDPO", "treatment": "PCPO", "estimate": estimate,
            "ci_low": ci[0], "ci_high": ci[1], "n_baseline_runs": n_runs, "n_treatment_runs": n_runs,
            "p": None if reason else p, "estimable": reason is None, "reason": reason,
            "significant": reason is None and p is not None and p < 0.05,
            "sentence": sentence or SENTENCES.get(quantity, f"{quantity}: PCPO vs DDPO"),
            "paired": n_runs > 1, "mde": None if reason else 0.1, "family": family,
            "p_adjusted": None if reason else p, "p_permutation": None, "baseline_value": None,
            "treatment_value": None, "details": {}}


def synthetic_verdict(n_runs: int) -> list[dict]:
    """Verdict rows for two cells; with ``n_runs == 1`` every row is a between-run difference."""
    if n_runs == 1:
        return [verdict_row(q, 0.1, (None, None), None, 1, cell=c, sentence=ONE_RUN_SENTENCE,
                            reason="1 run per arm") for c in ("batch=16", "batch=32") for q in ("speedup_reward:0.8", "auc")]
    return [
        verdict_row("epochs_to_target:0.8", -7.0, (-10.2, -3.8), 0.004, n_runs,
                    sentence="PCPO reaches 0.8 in 12 epochs vs 19 (3 vs 3 runs)"),
        verdict_row("speedup_reward:0.8", 0.58, (0.21, 1.04), 0.01, n_runs),
        verdict_row("paired_gain", 0.003, (-0.010, 0.016), 0.61, n_runs, family="primary"),
        verdict_row("final_reward", 0.02, (None, None), None, n_runs, reason="the arms stopped at different epochs"),
        verdict_row("auc", 1.5, (0.2, 2.8), 0.03, n_runs, cell="batch=32"),
        verdict_row("reward_at_epoch:20", 0.04, (-0.01, 0.09), 0.1, n_runs, cell="batch=32"),
    ]


def kl_warning(median_kl: float) -> str | None:
    """The PPO-health warning the study would attach (threshold 0.03 on the median approx. KL)."""
    return f"median approx. KL {median_kl:.3f} > 0.03: the PPO step is large" if median_kl > 0.03 else None


def runs_frame(runs: list[dict]) -> pd.DataFrame:
    """The tidy verdict table (arm, cell, seed, epoch, reward_mean, control_reward_mean) of ``runs``
    entries, as the stats stage builds it from the logs (a missing control is NaN)."""
    frames = []
    for r in runs:
        n = len(r["epochs"])
        ctl = r.get("control_reward_mean")
        frames.append(pd.DataFrame({
            "arm": r["arm"], "cell": r["cell"], "seed": str(r["seed"]), "epoch": r["epochs"],
            "reward_mean": np.asarray([np.nan if v is None else v for v in r["reward_mean"]], dtype=float),
            "control_reward_mean": np.full(n, np.nan) if ctl is None else np.asarray(
                [np.nan if v is None else v for v in ctl], dtype=float)}))  # fmt: skip
    return pd.concat(frames, ignore_index=True)


def synthetic_rliable(runs: list[dict], baseline: str = "DDPO", k: int = 5) -> dict:
    """``results.json`` ``rliable`` of ``runs`` entries, as the stats stage writes it."""
    from pcpo_eval.stats.rliable import rliable_panels

    return to_jsonable(rliable_panels(runs_frame(runs), baseline, k))


def synthetic_runs(epochs: int = 30) -> list[dict]:
    """``runs`` entries: 2 cells x 2 arms x 3 seeds, paired controls (null for one run), cumulative wall time."""
    out = []
    for b in ("16", "32"):
        for arm, rate, kl in (("DDPO", 0.05, 1e-4), ("PCPO", 0.08, 2e-4)):
            for seed in range(3):
                log = synthetic_log(rate, epochs, 100 * seed + int(b))
                rng = np.random.default_rng(seed)
                reward = log["reward_mean"].to_numpy().copy()
                if seed == 1:
                    reward[3] = np.nan  # a missing epoch (written as null)
                approx_kl = kl * log["epoch"].to_numpy() * (30.0 if (arm, b, seed) == ("PCPO", "16", 2) else 1.0)
                ctl = None if (b, seed) == ("32", 2) else (0.2 + 0.05 * (arm == "PCPO") + rng.normal(0, 0.01, epochs))
                out.append({
                    "run": EVIL_RUN if (arm, b, seed) == ("PCPO", "16", 0) else f"{arm}_{b}_s{seed}",
                    "cell": f"batch={b}", "arm": arm, "seed": seed, "epochs": log["epoch"].tolist(),
                    "reward_mean": reward.tolist(), "control_reward_mean": None if ctl is None else ctl.tolist(),
                    "compute_s": np.cumsum(10.0 + 2.0 * (arm == "PCPO") + rng.normal(0, 0.5, epochs)).tolist(),
                    "approx_kl": approx_kl.tolist(), "clipfrac": log["clipfrac"].tolist(),
                    "ppo_health": {"median_approx_kl": float(np.median(approx_kl)),
                                   "mean_clipfrac": float(log["clipfrac"].mean()),
                                   "warning": kl_warning(float(np.median(approx_kl)))},
                })  # fmt: skip
    return out


def synthetic_progression(root: Path) -> list[dict]:
    """One run's progression: 2 (prompt, seed) rows x 3 epochs of PNGs under ``root``."""
    epochs = [0, 20, 40]
    images = []
    for k in range(2):
        row = []
        for e in epochs:
            rel = f"progression/run/p{k}_e{e}.png"
            write_png(root / rel, (10 * k, 4 * e, 100))
            row.append(rel)
        images.append(row)
    return [{"run": EVIL_RUN, "epochs": epochs, "images": images}]


def legacy_results(results: dict) -> dict:
    """A results.json from before the run-level keys (no verdict, runs, sampler offset, progression)."""
    return {k: v for k, v in results.items() if k not in ("verdict", "runs", "sampler_offset", "progression")}
