"""Small synthetic result objects for the report tests (fast: no training, no images rendered).

The numbers come from the real statistics functions (``fit_lmm``, ``speedup_table``,
``moving_average``) on synthetic tables, so the report is exercised on genuine result shapes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

#: A prompt that would run script if the report did not escape it.
EVIL_PROMPT = '<script>document.title="pwned";alert(1)</script> a red <b>cube</b> & "friends"'
EVIL_RUN = "algorithm-<img src=x onerror=alert(2)>"


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


def synthetic_results(root: Path) -> dict:
    """A results.json-shaped dict with images under ``root`` (the study directory)."""
    from pcpo_eval.stats import adjust_across_metrics, fit_lmm, moving_average, speedup_table

    rng = np.random.default_rng(0)
    rows = []
    for alg in ("DDPO", "PCPO"):
        for batch in ("16", "32"):
            for p in range(12):
                prompt_eff = rng.normal(0, 1)
                rows.append({"algorithm": alg, "batch": batch, "prompt": f"p{p}",
                             "fd_toy": 10 + prompt_eff - 2.0 * (alg == "PCPO") + rng.normal(0, 0.3),
                             "lpips_toy": 0.5 + 0.01 * prompt_eff + rng.normal(0, 0.01)})
    data = pd.DataFrame(rows)
    fits = {m: fit_lmm(data.assign(value=data[m]), "value ~ algorithm * batch", ["prompt"]) for m in ("fd_toy", "lpips_toy")}
    adjusted = adjust_across_metrics(fits)
    logs = {(a, b): synthetic_log(0.05 if a == "DDPO" else 0.08, 40, i) for i, (a, b) in
            enumerate([(a, b) for a in ("DDPO", "PCPO") for b in ("16", "32")])}
    speed = []
    for b in ("16", "32"):
        t = speedup_table([logs[("DDPO", b)]], [logs[("PCPO", b)]], [0.5, 0.8, 0.99], 5)
        speed.append({"cell": f"batch={b}", "baseline": "DDPO", "pcpo": "PCPO", "table": t.to_dict()})
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
    raw_rows = [{"cell": "", "method": "Base model", "role": "base", "n_runs": 1, "epochs": [],
                 "values": {"fd_toy": 0.0, "lpips_toy": 0.55}, "sd": {}, "significant": {}}]
    for b in ("16", "32"):
        raw_rows.append({"cell": f"batch={b}", "method": "DDPO", "role": "baseline", "n_runs": 1, "epochs": [20],
                         "values": {"fd_toy": 12.3456, "lpips_toy": 0.51}, "sd": {}, "significant": {}})
        raw_rows.append({"cell": f"batch={b}", "method": "PCPO", "role": "pcpo", "n_runs": 1, "epochs": [12],
                         "values": {"fd_toy": 9.8765, "lpips_toy": 0.52}, "sd": {},
                         "significant": {"fd_toy": True, "lpips_toy": False}})
    return {
        "study": {"name": "synthetic <study>", "description": f"test study {EVIL_PROMPT}", "source": "spec.yaml",
                  "spec_yaml": f"name: synthetic\ndescription: '{EVIL_PROMPT}'\n", "created": "now",
                  "factors": {"algorithm": ["DDPO", "PCPO"], "batch": ["16", "32"]},
                  "compare": {"factor": "algorithm", "baseline": "DDPO", "pcpo": "PCPO"},
                  "runs": [{"name": EVIL_RUN, "levels": {"algorithm": "PCPO", "batch": "16"}, "run_dir": "x",
                            "trained_by_study": True}],
                  "sampling": {"steps": 10, "cfg": 3.0}, "eval": {"prompts": "toy", "seeds": "4"}, "window": 5},
        "metric_labels": {"fd_toy": "FD (toy)", "lpips_toy": "LPIPS (toy)"},
        "metrics": ["fd_toy", "lpips_toy"],
        "speedup": speed,
        "selection": {"target": 0.8, "window": 5, "runs": [
            {"name": EVIL_RUN, "cell": "batch=16", "role": "pcpo", "epoch": 12, "reward": 0.81, "gap": 0.01, "reached": True},
            {"name": "DDPO_16", "cell": "batch=16", "role": "baseline", "epoch": 20, "reward": 0.79, "gap": -0.01, "reached": False}]},
        "raw_scores": {"columns": ["fd_toy", "lpips_toy"], "rows": raw_rows, "rule": "bold: significant",
                       "significance": {"batch=16": {"fd_toy": {"estimate": -2.0, "se": 0.1, "df": 11.0, "p": 1e-6,
                                                                 "p_adj": 2e-6, "significant": True},
                                                      "lpips_toy": {"error": "constant response"}}}},
        "lmm": {"formula": "value ~ algorithm * batch + (1|prompt)", "coding": "treatment",
                "df_method": "Satterthwaite (lmerTest)", "estimation": "REML", "adjust": "holm", "alpha": 0.05,
                "fits": {**{m: dataclasses.asdict(f) | {"reml_criterion": f.reml_criterion} for m, f in fits.items()},
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
    }
