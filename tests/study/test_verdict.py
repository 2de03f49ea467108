"""The study's run-level verdict: defensible or silent.

* An A/A study (one algorithm in both arms, different training seeds) ends with every verdict row
  "no evidence of a difference" (not significant); over 200 synthetic A/A studies the primary
  endpoint is significant in <= 5% of *studies* (plus binomial noise), and any row exactly as often
  (the secondary family is tested only behind a significant primary).
* A frozen arm (reward == its untrained control) is never called faster.
* A planted difference (faster learning, better images) is detected by every row and by the LMM
  with ``(1|run)``.
* 1 run per arm: every row and the LMM say "differences between runs", no CI, no p; the report
  shows the banner.
* Guards: uninformative targets are labelled and kept out of the verdict; a run that never reaches
  ``select_target`` has no reward-matched checkpoint; a sampler offset is named as such.

The statistics run on the fast stand-ins of tests/support/study.py (synthetic ``log.parquet`` curves
with ``control_reward_mean``, synthetic metrics); one small real toy study checks the whole path.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pcpo_eval.report.summary import summary_lines
from pcpo_eval.stats.runlevel import ONE_RUN_PER_ARM
from pcpo_eval.study.image_metrics import ONE_RUN_LMM
from pcpo_eval.study.runner import run_study
from pcpo_eval.study.spec import load_spec
from pcpo_eval.study.verdicts import verdict
from pcpo_eval.testing import isolate_weight_caches
from tests.support.study import install_fakes, rising, write_run, write_spec

ANALYSIS = Path(__file__).resolve().parents[2] / "analysis"
AA_DESIGN = {"algorithm": {"A": {"objective": "ppo_clip"}, "B": {"objective": "ppo_clip"}}}
AA = {"design": AA_DESIGN, "compare": {"factor": "algorithm", "baseline": "A", "pcpo": "B"},
      "lmm": {"formula": "value ~ algorithm + (1|prompt)"}}


@pytest.fixture(autouse=True)
def _no_real_weights(tmp_path, monkeypatch):
    isolate_weight_caches(tmp_path, monkeypatch)


@pytest.fixture
def fakes(monkeypatch):
    return install_fakes(monkeypatch)


def _study(tmp_path: Path, **spec) -> dict:
    out = tmp_path / "study"
    run_study(write_spec(tmp_path / "s.yaml", **spec), out, log=lambda s: None)
    return json.loads((out / "results.json").read_text())


def _fixed(res: dict, metric: str, term: str) -> dict:
    return next(f for f in res["lmm"]["fits"][metric]["fixed"] if f["term"] == term)


# ------------------------------------------------------------------------------------------------
# A/A and a planted difference
# ------------------------------------------------------------------------------------------------


def test_aa_study_finds_no_difference(tmp_path, fakes):
    fakes.curves = {"A": rising(0.07, run_sd=0.01), "B": rising(0.07, run_sd=0.01)}
    fakes.metric_effect = {}
    res = _study(tmp_path, **AA, seeds={"A": [0, 1, 2], "B": [3, 4, 5]}, targets=[0.3, 0.5], gain_targets=[0.3])
    rows = res["verdict"]
    assert [v["quantity"] for v in rows] == ["paired_gain", "final_reward", "auc", "sampler_offset", "speedup_gain:0.3",
                                             "speedup_reward:0.3", "speedup_reward:0.5"]
    assert [v["family"] for v in rows] == ["primary"] + ["secondary"] * 6
    for v in rows:
        assert v["estimable"] and not v["significant"], v
        assert (v["n_baseline_runs"], v["n_treatment_runs"]) == (3, 3)
        assert not v["paired"]  # different seeds: Welch
        # what it could have detected, at its family's level (the 6 secondary rows: alpha / 6); a
        # speed-up beyond what the window allows is "no speed-up is detectable", never a number
        assert v["details"]["mde_level"] == pytest.approx(0.05 if v["family"] == "primary" else 0.05 / 6)
        if v["quantity"].startswith("speedup") and v["mde"] is None:
            if v["details"]["p_floor"] is None:
                assert "no speed-up is detectable at 80% power after Holm over the 6 secondary rows, once the primary is significant" in v["sentence"]
            else:  # an arm without spread (integer epochs): the exact test's floor is above the level
                assert v["details"]["p_floor"] >= 0.05 / 6 and ("no speed-up is detectable with 3 seeds per arm: the "
                                                            "exact permutation test's smallest p is") in v["sentence"]
        else:
            assert v["mde"] > 0
        assert v["p_adjusted"] >= v["p"]
        assert v["sentence"].startswith("no evidence of a difference"), v["sentence"]
    assert res["headline"].startswith("On this study, no evidence of a difference in paired gain")
    off = res["sampler_offset"]["all"]
    assert not off["significant"] and off["ci_low"] <= 0 <= off["ci_high"]
    (row,) = [v for v in rows if v["quantity"] == "sampler_offset"]  # the offset is a row of the verdict's family
    assert off["p_adjusted"] == row["p_adjusted"] and off["mde"] == row["mde"] and off["gated"]
    assert "not tested as a secondary row: the primary endpoint (paired_gain) is not significant" in off["explains"]
    # the matched-reward checkpoints' rewards, compared per cell (tests/study/test_balance.py)
    bal = res["selection"]["balance"]["all"]
    reached = [r for r in res["selection"]["runs"] if r["reached"]]
    assert bal["n_baseline"] + bal["n_pcpo"] == len(reached) and bal["sentence"].startswith("Matched-reward balance")
    fit = res["lmm"]["fits"]["lpips_toy"]  # value ~ algorithm + (1|prompt) + (1|run)
    assert fit["groups"] == ["prompt", "run"]
    assert not (fit["estimable"] and res["lmm"]["adjusted"]["lpips_toy"]["algorithm[T.B]"]["p_holm"] < 0.05)
    assert not res["raw_scores"]["significance"]["all"]["fd_toy"]["significant"]


def _aa_logs(rng: np.random.Generator, epochs: int = 12) -> dict[str, pd.DataFrame]:
    """Logs of one synthetic A/A study: 3 runs per arm from one learning-curve process."""
    logs = {}
    for arm in ("A", "B"):
        for s in range(3):
            reward, control = rising(0.07, run_sd=0.01)(epochs, rng)
            logs[f"algorithm-{arm}__seed-{s}"] = pd.DataFrame(
                {"epoch": np.arange(1, epochs + 1), "reward_mean": reward, "control_reward_mean": control})
    return logs


def test_aa_false_positive_rate_of_the_study_verdict(tmp_path):
    """200 A/A studies through the study's own verdict code (arms share seeds, so rows are paired):
    the primary endpoint is significant in <= 5% of studies + binomial noise, and a study shows a
    significant row exactly when its primary is (gatekeeping). Measured (seed 20240611): primary 4.5%
    (before the gate, any of the 6 rows: 6.0%)."""
    from pcpo_eval.study.verdicts import runs_table

    # the arms share seeds (paired rows); their configs differ only so that the spec is not refused as
    # "identical runs" -- the logs below come from one curve process in both arms
    paired_aa = {**AA, "design": {"algorithm": {"A": {"objective": "ppo_clip"}, "B": {"objective": "pcpo"}}}}
    spec = load_spec(write_spec(tmp_path / "s.yaml", **paired_aa, seeds={"A": [0, 1, 2], "B": [0, 1, 2]},
                                targets=[0.3, 0.5], gain_targets=[0.3]))
    rng = np.random.default_rng(20240611)
    primary = anyrow = 0
    n = 200
    for _ in range(n):
        logs = _aa_logs(rng)
        rows = verdict(spec, runs_table(spec, {r.name: logs[r.name] for r in spec.runs}))
        assert {v["quantity"] for v in rows} == {"paired_gain", "final_reward", "auc", "sampler_offset",
                                                 "speedup_gain:0.3", "speedup_reward:0.3", "speedup_reward:0.5"}
        assert all(v["paired"] for v in rows)
        primary += any(v["significant"] for v in rows if v["family"] == "primary")
        anyrow += any(v["significant"] for v in rows)
    assert primary / n <= 0.05 + 2 * (0.05 * 0.95 / n) ** 0.5, primary / n
    assert anyrow == primary, (anyrow, primary)


def test_planted_difference_is_detected(tmp_path, fakes):
    # B learns 3x faster; epochs to a target are coarse, so 5 runs per arm and 30 epochs (runlevel's
    # measured power for a 2x speed-up: 75% at 5 runs per arm, 33% at 3)
    fakes.curves = {"A": rising(0.02, run_sd=0.002), "B": rising(0.06, run_sd=0.006)}
    fakes.metric_effect = {"B": 0.05}
    fakes.run_sd_metric = 0.01  # between-run SD of the metric, as large as the within-set noise
    res = _study(tmp_path, **AA, seeds={"A": [0, 1, 2, 3, 4], "B": [5, 6, 7, 8, 9]}, targets=[0.2, 0.4],
                 gain_targets=[0.3], select_target=0.4, train={"overrides": {"epochs": 30, "checkpoint_every": 5}})
    assert {v["quantity"] for v in res["verdict"]} == {"paired_gain", "final_reward", "auc", "sampler_offset",
                                                       "speedup_gain:0.3", "speedup_reward:0.2", "speedup_reward:0.4"}
    (off,) = [v for v in res["verdict"] if v["quantity"] == "sampler_offset"]
    assert off["estimable"] and not off["significant"], off  # B learns faster with A's sampler: no offset
    for v in res["verdict"]:
        if v is off:
            continue
        assert v["estimable"] and v["significant"] and v["estimate"] > 0, v
        assert v["ci_low"] > 0 and not v["sentence"].startswith("no evidence"), v
        assert v["p_adjusted"] < 0.05
    assert "B's paired gain is higher than A's" in res["headline"]
    fe = _fixed(res, "lpips_toy", "algorithm[T.B]")
    assert res["lmm"]["fits"]["lpips_toy"]["estimable"], res["lmm"]["fits"]["lpips_toy"]["reason"]
    assert fe["estimate"] == pytest.approx(0.05, abs=0.015)
    assert res["lmm"]["adjusted"]["lpips_toy"]["algorithm[T.B]"]["p_holm"] < 0.05
    assert fe["df"] < 10  # tested against the 10 runs, not the 10 x 3 prompt rows
    fd = res["raw_scores"]["significance"]["all"]["fd_toy"]  # overall FD per run, Welch over runs
    assert fd["significant"] and fd["estimate"] < 0 and fd["ci_high"] < 0


# ------------------------------------------------------------------------------------------------
# 1 run per arm
# ------------------------------------------------------------------------------------------------


def test_one_run_per_arm_is_never_a_verdict(tmp_path, fakes):
    res = _study(tmp_path)  # default: one seed per arm
    assert res["verdict"] and all(not v["estimable"] and v["p"] is None and not v["significant"]
                                  and v["ci_low"] is None and v["reason"] == ONE_RUN_PER_ARM for v in res["verdict"])
    assert all(v["sentence"].startswith("1 run per arm: differences between runs, not algorithms")
               for v in res["verdict"])
    for m, fit in res["lmm"]["fits"].items():
        assert fit["estimable"] is False and fit["reason"].startswith(ONE_RUN_LMM), m
        assert all(fe["p"] is None and fe["ci_low"] is None for fe in fit["fixed"])
        assert all(a["p_holm"] is None for a in res["lmm"]["adjusted"][m].values())
    assert res["lmm"]["formula"] == "value ~ algorithm * batch + (1|prompt)"  # no (1|run) to estimate
    for per in res["raw_scores"]["significance"].values():
        assert all(e["p"] is None and not e["significant"] for e in per.values())
    html = (tmp_path / "study" / "report.html").read_text()
    assert 'id="one-run-banner"' in html and "not estimable: 1 run per arm" in html
    lines = summary_lines(tmp_path / "study")
    assert lines[0].startswith("headline: On this study (batch=16), 1 run per arm: differences between runs")
    assert lines[1] == "verdict (runs are the replicates):" and lines[2].strip().startswith("1 run per arm")
    assert not any("None" in line or "nan" in line for line in lines)


# ------------------------------------------------------------------------------------------------
# guards
# ------------------------------------------------------------------------------------------------


def test_uninformative_target_is_labelled_not_headlined(tmp_path, fakes):
    """-1.0 is reached by the untrained controls (they sit at 0): the sampler reaches it, not learning."""
    res = _study(tmp_path, seeds=[0, 1], targets=[-1.0, 0.3])
    t0 = res["targets"][0]
    assert (t0["target"], t0["curve"], t0["status"], t0["headline"]) == (-1.0, "reward", "uninformative", False)
    assert t0["note"].startswith("uninformative: the untrained control reaches -1 in 8 of 8 runs")
    assert {v["quantity"] for v in res["verdict"] if v["quantity"].startswith("speedup")} == {"speedup_reward:0.3"}
    for block in res["speedup"]:
        row = block["rows"][0]
        assert row["uninformative"] and row["speedup"] is None and row["status"] == t0["note"]
    lines = summary_lines(tmp_path / "study")
    assert any("reward -1:" in line and line.endswith(t0["note"]) for line in lines)
    assert not any("+0.0%" in line for line in lines)
    # the matched-reward balance per cell, as results.json says it
    bal = [b["sentence"] for b in res["selection"]["balance"].values()]
    assert bal and all(f"  {b}" in lines for b in bal) and all(b.startswith("Matched-reward balance") for b in bal)


def falling(epochs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A run whose reward falls from its start (its updates hurt)."""
    control = rng.normal(0, 0.005, epochs)
    return control - 0.02 * np.arange(epochs), control


def test_run_that_never_reaches_the_select_target_has_no_matched_checkpoint(tmp_path, fakes, monkeypatch):
    train = fakes.train

    def one_run_falls(cfg, out_dir, resume=False):
        if Path(out_dir).name == "algorithm-DDPO__batch-16__seed-1":
            write_run(Path(out_dir), cfg.epochs, 0, cfg.checkpoint_every, curve=falling, rng_key="f")
            return None
        return train(cfg, out_dir, resume)

    import pcpo_eval.train.trainer

    monkeypatch.setattr(pcpo_eval.train.trainer, "train", one_run_falls)
    res = _study(tmp_path, seeds=[0, 1])
    row = next(c for c in res["selection"]["runs"] if c["name"] == "algorithm-DDPO__batch-16__seed-1")
    assert (row["reached"], row["epoch"], row["path"]) == (False, None, None)
    # a falling run: its best full-window checkpoint (epoch 6, the first after 5 logged epochs; epochs 2 and 4 average
    # fewer and never count, not even as the nearest)
    assert row["status"].startswith("not reached: best smoothed reward") and row["best_epoch"] == 6
    sets = tmp_path / "study" / "sets" / "algorithm-DDPO__batch-16__seed-1"
    assert [p.name for p in sets.iterdir()] == ["epoch_0012"]  # only its matched-epoch set
    raw = next(r for r in res["raw_scores"]["rows"] if r["cell"] == "batch=16" and r["role"] == "baseline")
    assert raw["n_runs"] == 1 and raw["n_without_checkpoint"] == 1
    raw_e = next(r for r in res["raw_scores"]["rows"] if r["cell"] == "batch=16 @ epoch 12" and r["role"] == "baseline")
    assert raw_e["n_runs"] == 2 and raw_e["n_without_checkpoint"] == 0
    html = (tmp_path / "study" / "report.html").read_text()
    assert "algorithm-DDPO__batch-16__seed-1" in html and "None" not in html


def test_sampler_offset_is_named_not_passed_for_a_speedup(tmp_path, fakes):
    """Same learning in both arms, but PCPO's untrained control scores 0.2 higher (its sampler). With the
    default primary (paired gain, no difference) the raw-reward speed-up is not even tested (gatekeeping);
    a study whose primary endpoint is that raw speed-up finds it, and is told it is the sampler's."""
    fakes.curves = {"DDPO": rising(0.05, run_sd=0.003), "PCPO": rising(0.05, run_sd=0.003, control=0.2)}
    spec = dict(**{**AA, "design": {"algorithm": {"DDPO": {"objective": "ppo_clip"}, "PCPO": {"objective": "pcpo"}}},
                   "compare": {"factor": "algorithm", "baseline": "DDPO", "pcpo": "PCPO"}},
                seeds={"DDPO": list(range(6)), "PCPO": list(range(6, 12))}, targets=[0.15, 0.5], gain_targets=[0.3],
                select_target=0.5)  # 6 seeds: at 3 an arm whose runs all reach 0.5 at one epoch is not testable
    (tmp_path / "default").mkdir()
    default = {v["quantity"]: v for v in _study(tmp_path / "default", **spec)["verdict"]}
    raw = default["speedup_reward:0.5"]
    assert not raw["significant"] and raw["details"]["gated"] and raw["p_adjusted"] < 0.05  # would have looked fast
    assert "not tested as a secondary row" in raw["sentence"]
    res = _study(tmp_path, **spec, primary=["speedup_reward:0.5"])
    by_q = {v["quantity"]: v for v in res["verdict"]}
    assert "speedup_reward:0.15" not in by_q  # PCPO's untrained control reaches it: uninformative
    assert res["targets"][0]["note"].startswith("uninformative: the untrained control reaches 0.15 in 6 of 12 runs")
    assert by_q["speedup_reward:0.5"]["significant"] and by_q["speedup_reward:0.5"]["estimate"] > 0  # looks fast
    assert by_q["paired_gain"]["estimable"] and not by_q["paired_gain"]["significant"]  # the learning is equal
    assert not by_q["speedup_gain:0.3"]["significant"]  # ... and so is the learning speed
    off = res["sampler_offset"]["all"]
    assert off["difference"] == pytest.approx(0.2, abs=0.01) and off["significant"] and not off["paired"]
    assert off["explains_raw_speedup"].startswith("The raw-reward difference (")  # final reward and AUC too
    assert "speed-up to 0.5: +" in off["explains_raw_speedup"]
    assert "is the sampler's, not learning" in res["headline"]


#: A learning DDPO arm against a frozen one (learning rate 1e-12; its curves: :func:`_frozen`).
FROZEN_VS_DDPO = {**AA, "design": {"algorithm": {"DDPO": {"objective": "ppo_clip"},
                                                 "Frozen": {"objective": "ppo_clip", "learning_rate": 1e-12}}},
                  "compare": {"factor": "algorithm", "baseline": "DDPO", "pcpo": "Frozen"}}


def _frozen(control: float):
    """A curve model whose reward IS its untrained control every epoch (flat at ``control``, noise 0.005)."""
    def frozen(epochs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        ctrl = control + rng.normal(0, 0.005, epochs)
        return ctrl.copy(), ctrl

    return frozen


def test_frozen_arm_is_never_called_fast(tmp_path, fakes):
    """A frozen policy (reward == its untrained control every epoch) against one that learns, same seeds:
    no speed-up row says it is faster, its paired gain is lower, and a target the controls reach has no row."""
    fakes.curves = {"DDPO": rising(0.05, run_sd=0.003, control=0.25), "Frozen": _frozen(0.25)}
    res = _study(tmp_path, **FROZEN_VS_DDPO, seeds=[0, 1, 2], targets=[0.2, 0.5], gain_targets=[0.1, 0.2],
                 select_target=0.5)
    by_q = {v["quantity"]: v for v in res["verdict"]}
    assert "speedup_reward:0.2" not in by_q  # the untrained controls start above 0.2
    for q, v in by_q.items():
        assert v["paired"]
        if q.startswith("speedup"):
            assert not (v["significant"] and v["estimate"] > 0), v
            assert v["estimate"] < 0 and v["details"]["n_censored_treatment"] == 3  # never reaches it
    assert by_q["paired_gain"]["significant"] and by_q["paired_gain"]["estimate"] < 0
    assert "Frozen's paired gain is lower than DDPO's" in res["headline"]


def test_a_frozen_arm_with_a_better_sampler_is_not_called_better(tmp_path, fakes):
    """A frozen policy whose untrained sampler scores 0.15 higher than the learning baseline's: its raw
    final reward and reward AUC are higher (the sampler's offset), its paired gain lower. The raw rows must
    be explained as the sampler's, in the offset block and the headline (before, only raw speed-ups were:
    'Frozen's reward AUC is higher than DDPO's' stood with nothing pointing at the sampler)."""
    fakes.curves = {"DDPO": rising(0.01, run_sd=0.002, control=0.25), "Frozen": _frozen(0.40)}
    res = _study(tmp_path, **FROZEN_VS_DDPO, seeds=[0, 1, 2], targets=[0.38], gain_targets=[0.05], select_target=0.3)
    by_q = {v["quantity"]: v for v in res["verdict"]}
    assert by_q["paired_gain"]["significant"] and by_q["paired_gain"]["estimate"] < 0  # it learns nothing
    raw = [q for q in ("final_reward", "auc") if by_q[q]["significant"] and by_q[q]["estimate"] > 0]
    assert raw, by_q  # the raw reward reads higher: the sampler's offset
    off = res["sampler_offset"]["all"]
    assert off["significant"] and off["difference"] == pytest.approx(0.15, abs=0.01)
    assert off["explains_raw_speedup"].startswith("The raw-reward difference (")
    for q in raw:
        assert {"final_reward": "final reward: +", "auc": "reward AUC: +"}[q] in off["explains_raw_speedup"]
    assert "is the sampler's, not learning" in res["headline"]


# ------------------------------------------------------------------------------------------------
# the real thing, small
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_toy_aa_study_end_to_end_in_parallel(tmp_path):
    """analysis/toy_aa_study.yaml, shrunk: 2 seeds per arm trained 2 at a time, real toy sets and metrics."""
    data = yaml.safe_load((ANALYSIS / "toy_aa_study.yaml").read_text())
    data["seeds"] = {"A": [0, 1], "B": [2, 3]}
    data["train"]["config"] = str(ANALYSIS.parent / "train" / "configs" / "toy_ddpo.yaml")
    data["train"]["overrides"].update({"epochs": 3, "checkpoint_every": 1, "sample_steps": 4, "sample_batch_size": 4,
                                       "train_batch_size": 4})
    data["eval"].update({"seeds": 2, "max_prompts": 4, "steps": 4})
    data.update(metrics=["fd_toy", "lpips_toy"], overall_only=["fd_toy"])  # IS needs >= 10 images per set
    data.update(targets=[-1e9], select_target=-1e9, grid={"prompts": 2, "seeds": 2})  # plumbing, not the reward
    data["window"] = 3  # the 3rd epoch is each run's one full-window checkpoint (selection's and the speed-up's rule)
    spec = tmp_path / "aa.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "study"
    run_study(spec, out, log=lambda s: None)
    res = json.loads((out / "results.json").read_text())
    assert {(r["arm"], r["seed"]) for r in res["runs"]} == {("A", 0), ("A", 1), ("B", 2), ("B", 3)}
    for r in res["runs"]:
        assert r["epochs"] == [1, 2, 3] and len(r["control_reward_mean"]) == 3
        assert r["control_reward_mean"][0] == pytest.approx(r["reward_mean"][0])  # epoch 1: policy == base
        assert (out / "logs" / "train" / f"{r['run']}.log").is_file()  # trained in a worker process
    assert {"paired_gain", "final_reward", "auc"} <= {v["quantity"] for v in res["verdict"]}
    assert all(v["n_baseline_runs"] == 2 and v["n_treatment_runs"] == 2 for v in res["verdict"])
    reward_targets = [t for t in res["targets"] if "untrained control reaches -1e+09" in t["note"]]
    assert len(reward_targets) == 1 and reward_targets[0]["status"] == "uninformative"
    assert res["selection"]["target_uninformative"]
    assert set(res["lmm"]["fits"]) == {"lpips_toy", "lpips_toy @ epoch 3"}
    html = (out / "report.html").read_text()
    assert "<script" not in html and 'id="verdict-table"' in html
    logs: list[str] = []
    run_study(spec, out, log=logs.append)  # finished: every run, set and stage is skipped
    assert sum(line.startswith("  algorithm-") and line.endswith(": complete, skipped") for line in logs) == 4
    assert not any("training" in line or "resuming" in line for line in logs)


def test_toy_aa_spec_validates():
    spec = load_spec(ANALYSIS / "toy_aa_study.yaml")
    arms = {spec.arm(r) for r in spec.runs}
    assert arms == {"A", "B"} and {r.train.objective for r in spec.runs} == {"ppo_clip"}
    assert not set(spec.seeds["A"]) & set(spec.seeds["B"])  # different seeds, else the arms are identical runs
    assert spec.gain_targets and spec.targets[0] > 0  # toy_aesthetic levels, not the old JPEG ones
    assert all(r.train.paired_control for r in spec.runs) and spec.parallel == 2


@pytest.mark.slow
def test_a_failing_run_in_a_worker_is_named_with_its_log_and_the_others_finish(tmp_path):
    from pcpo_eval.errors import UserError
    from pcpo_eval.study.training import train_runs
    from pcpo_eval.studydir import StudyLayout

    design = {"algorithm": {"DDPO": {"objective": "ppo_clip", "prompts": str(tmp_path / "missing.txt")},
                            "PCPO": {"objective": "pcpo"}}}
    train = {"overrides": {"epochs": 1, "sample_steps": 2, "sample_batch_size": 4, "train_batch_size": 4}}
    spec = load_spec(write_spec(tmp_path / "s.yaml", design=design, train=train, parallel=2,
                                lmm={"formula": "value ~ algorithm + (1|prompt)"}), check_weights=False)
    layout = StudyLayout(tmp_path / "study")
    with pytest.raises(UserError) as ei:
        train_runs(spec, layout, log=lambda s: None)
    msg = str(ei.value)
    log = layout.out / "logs" / "train" / "algorithm-DDPO__seed-0.log"
    assert msg.startswith("1 of 2 run(s) failed: run algorithm-DDPO__seed-0: UserError: ") and f"(log: {log})" in msg
    assert "Traceback" in log.read_text()
    assert (layout.out / "runs" / "algorithm-PCPO__seed-0" / "log.parquet").is_file()  # the other run finished


def test_toy_frozen_spec_is_a_paired_negative_control():
    """analysis/toy_frozen_study.yaml: the same algorithm, one arm at learning rate 1e-12, shared seeds,
    gain targets (so every speed-up row can show that the frozen arm is never faster)."""
    spec = load_spec(ANALYSIS / "toy_frozen_study.yaml")
    lr = {spec.arm(r): r.train.learning_rate for r in spec.runs}
    assert lr["Frozen"] == 1e-12 and lr["DDPO"] > 1e-6 and {r.train.objective for r in spec.runs} == {"ppo_clip"}
    assert spec.seeds["DDPO"] == spec.seeds["Frozen"] and len(spec.seeds["DDPO"]) >= 2  # paired by seed
    assert spec.gain_targets and spec.primary == ("paired_gain",) and spec.pcpo == "Frozen"
    assert all(r.train.paired_control for r in spec.runs)


def test_endpoint_keys_are_validated_before_any_work(tmp_path):
    """NaN / inf targets, a gain target <= 0 and an unknown primary endpoint are refused at load, in one error."""
    from pcpo_eval.errors import UserError

    spec = write_spec(tmp_path / "s.yaml", targets=[float("nan"), 0.5], gain_targets=[-0.1, float("inf")],
                      primary=["paired_gain", "fid"], select_target=0.5)
    with pytest.raises(UserError) as ei:
        load_spec(spec)
    msg = str(ei.value)
    for needle in ("target nan is not a finite number", "gain target inf is not a finite number",
                   "gain_targets: -0.1 must be > 0", "primary: unknown endpoint 'fid'"):
        assert needle in msg, needle
    assert not (tmp_path / "study").exists()
    ok = load_spec(write_spec(tmp_path / "t.yaml", gain_targets=[0.1], primary="speedup_gain:0.1"))
    assert ok.gain_targets == (0.1,) and ok.primary == ("speedup_gain:0.1",)
    spelled = load_spec(write_spec(tmp_path / "v.yaml", gain_targets=[0.06], primary=["speedup_gain:0.060", "auc"]))
    assert spelled.primary == ("speedup_gain:0.06", "auc")  # the row's own spelling, so the row is found
    # a speed-up primary must name a listed target: 0.05 (a typo of 0.06) would have no row, and no primary
    bad = write_spec(tmp_path / "u.yaml", gain_targets=[0.03, 0.06], primary=["speedup_gain:0.05", "speedup_reward:0.4"])
    with pytest.raises(UserError) as ei:
        load_spec(bad)
    assert ("primary: speedup_gain:0.05 names no row: 0.05 is not in gain_targets (speedup_gain:0.03, "
            "speedup_gain:0.06)") in str(ei.value)
    assert "primary: speedup_reward:0.4 names no row: 0.4 is not in targets (speedup_reward:0.3, speedup_reward:0.5)" \
        in str(ei.value)


# ------------------------------------------------------------------------------------------------
# what limits a comparison is said where the verdict is read
# ------------------------------------------------------------------------------------------------


def _planted(tmp_path: Path, monkeypatch, edit=None, seeds_b=(0, 1, 2)) -> dict:
    """``run_level`` of a paired study where B learns twice A's rate (12 epochs), its logs edited by ``edit``."""
    from pcpo_eval.study import verdicts as vd

    design = {**AA, "design": {"algorithm": {"A": {"objective": "ppo_clip"}, "B": {"objective": "pcpo"}}}}
    spec = load_spec(write_spec(tmp_path / "s.yaml", **design, seeds={"A": [0, 1, 2], "B": list(seeds_b)},
                                targets=[0.3, 0.5], gain_targets=[0.3]))
    rng = np.random.default_rng(7)
    logs = {}
    for r in spec.runs:
        reward, control = rising(0.1 if "B" in r.name else 0.05, run_sd=0.005)(12, rng)
        logs[r.name] = pd.DataFrame({"epoch": np.arange(1, 13), "reward_mean": reward, "control_reward_mean": control})
    if edit:
        edit(logs)
    monkeypatch.setattr(vd, "run_logs", lambda sp, layout: logs)
    return vd.run_level(spec, None)


def test_runs_without_controls_say_the_raw_rows_may_be_the_sampler(tmp_path, monkeypatch):
    """No run logged its control: a frozen arm whose sampler scores higher leads the final reward and AUC, and
    the headline said only "no learning measure". It now says what those rows then compare."""
    def no_controls(logs):
        for name, log in logs.items():
            logs[name] = log.drop(columns=["control_reward_mean"])

    res = _planted(tmp_path, monkeypatch, no_controls)
    assert "No learning measure: 6 run(s) lack control_reward_mean" in res["headline"]
    assert ("The final reward and reward AUC then compare each arm's sampler together with what it learned: a "
            "policy that learned nothing but samples higher rewards would lead them") in res["headline"]
    assert any("a policy that learned nothing" in n for n in res["verdict_notes"])


def test_a_missing_control_epoch_keeps_the_primary_endpoint(tmp_path, monkeypatch):
    """One NaN in one run's control (epoch 3) used to drop the control of every run: the paired gain (the
    primary) vanished and reward targets the sampler reaches came back. Now only what needs that epoch goes."""
    whole = _planted(tmp_path, monkeypatch)

    def gap(logs):
        logs["algorithm-A__seed-1"].loc[2, "control_reward_mean"] = np.nan

    (tmp_path / "gap").mkdir()
    res = _planted(tmp_path / "gap", monkeypatch, gap)
    prim = [v for v in res["verdict"] if v["family"] == "primary"]
    assert [v["quantity"] for v in prim] == ["paired_gain"] and prim[0]["significant"]
    assert prim[0]["p"] == pytest.approx(next(v["p"] for v in whole["verdict"] if v["quantity"] == "paired_gain"))
    assert res["headline"].startswith("On this study, B's paired gain is higher than A's")
    assert any("algorithm-A__seed-1 has no paired control at epoch(s) 3" in n for n in res["verdict_notes"])
    assert res["sampler_offset"]["all"]["difference"] == pytest.approx(whole["sampler_offset"]["all"]["difference"],
                                                                      abs=0.01)
    assert [t["status"] for t in res["targets"]] == [t["status"] for t in whole["targets"]]


def test_a_short_run_cut_is_in_the_headline_and_the_report(tmp_path, monkeypatch):
    from pcpo_eval.report.html import render_report

    def cut(logs):
        logs["algorithm-B__seed-2"] = logs["algorithm-B__seed-2"].iloc[:7]

    res = _planted(tmp_path, monkeypatch, cut)
    text = "Compared over epochs up to 7 only: algorithm-B__seed-2 logged 7 of the 12 epochs of the longest run"
    assert text in res["headline"]
    assert any(n.startswith("compared over epochs up to 7 only") for n in res["verdict_notes"])
    html = render_report({"study": {"name": "cut"}, **res})
    assert 'id="verdict-notes"' in html and "compared over epochs up to 7 only" in html


def test_arms_sharing_most_seeds_pair_on_them(tmp_path, monkeypatch):
    """Seeds 0-2 vs 0, 1, 5: the two shared seeds pair; the note names the runs left out."""
    res = _planted(tmp_path, monkeypatch, seeds_b=(0, 1, 5))
    assert all(v["paired"] and v["n_baseline_runs"] == 2 for v in res["verdict"])
    assert any("share 2 seeds; the runs are paired on those" in n and "A seeds 2; B seeds 5" in n
               for n in res["verdict_notes"])
    assert res["sampler_offset"]["all"]["paired"]
    assert "The arms share 2 seeds; the runs are paired on those and the others are left out" in res["headline"]


def test_a_sampler_offset_without_spread_is_reported(tmp_path, monkeypatch):
    """The arms' controls differ by exactly the same amount on every seed: no CI, the exact sign-flip p
    (3 pairs: 0.25), no crash (the offset sentence used to format a missing CI)."""
    def shift(logs):
        for s in range(3):
            logs[f"algorithm-B__seed-{s}"]["control_reward_mean"] = logs[f"algorithm-A__seed-{s}"]["control_reward_mean"] + 0.25

    off = _planted(tmp_path, monkeypatch, shift)["sampler_offset"]["all"]
    assert off["difference"] == pytest.approx(0.25) and off["ci_low"] is None and off["p"] == pytest.approx(0.25)
    assert not off["significant"] and "p = 0.25" in off["explains"]


def test_a_primary_without_a_row_says_why(tmp_path, fakes):
    """A primary endpoint on a target the untrained control reaches has no row: the headline says so."""
    fakes.curves = {"DDPO": rising(0.05, run_sd=0.003), "PCPO": rising(0.05, run_sd=0.003, control=0.2)}
    res = _study(tmp_path, **{**AA, "design": {"algorithm": {"DDPO": {"objective": "ppo_clip"},
                                                             "PCPO": {"objective": "pcpo"}}},
                              "compare": {"factor": "algorithm", "baseline": "DDPO", "pcpo": "PCPO"}},
                 seeds={"DDPO": [0, 1, 2], "PCPO": [0, 1, 2]}, targets=[0.15, 0.5], gain_targets=[0.3],
                 select_target=0.5, primary=["speedup_reward:0.15"])
    assert res["headline"].startswith("No run-level verdict: the primary endpoint speedup_reward:0.15 has no row "
                                      "(uninformative: the untrained control reaches 0.15")
    assert not any(v["significant"] for v in res["verdict"])  # no primary: the secondary family is not tested


def test_arms_that_sample_more_per_epoch_are_refused_or_named(tmp_path, fakes):
    """PCPO sampling 64 images per epoch against DDPO's 32 learns twice as much per epoch at the same rate per
    image; the verdict counted epochs and called that a +44% speed-up with no word about the samples. Now the
    spec is refused, and with ``unequal_epochs_ok: true`` the headline names the difference."""
    from pcpo_eval.errors import UserError

    design = {"algorithm": {"DDPO": {"objective": "ppo_clip", "sample_batch_size": 16},
                            "PCPO": {"objective": "pcpo", "sample_batch_size": 32}}}
    spec = dict(design=design, seeds=[0, 1, 2], lmm={"formula": "value ~ algorithm + (1|prompt)"})
    with pytest.raises(UserError, match=r"the arms differ in images sampled per epoch \(PCPO 64, DDPO 32"):
        load_spec(write_spec(tmp_path / "s.yaml", **spec))
    fakes.curves = {"DDPO": rising(0.05, run_sd=0.003), "PCPO": rising(0.10, run_sd=0.003)}
    res = _study(tmp_path, **spec, unequal_epochs_ok=True, gain_targets=[0.3])
    said = "In cell all, the arms differ in images sampled per epoch (PCPO 64, DDPO 32"
    assert said in res["headline"] and "may be the extra samples or compute" in res["headline"]
    assert any(n.startswith(said[0].lower() + said[1:]) for n in res["verdict_notes"])
    assert {b["unit"] for b in res["speedup"]} == {"epochs"}


@pytest.mark.parametrize("levels", [
    {"DDPO": {"objective": "ppo_clip"}, "PCPO": {"objective": "pcpo", "reward": {"toy_aesthetic": 2.0}}},
    {"DDPO": {"objective": "ppo_clip", "reward": "toy_aesthetic"}, "PCPO": {"objective": "pcpo", "reward": "jpeg_compressibility"}},
], ids=["doubled", "another-reward"])
def test_arms_on_two_rewards_are_refused(tmp_path, levels):
    """A level of the compared factor may not set the reward: the same reward doubled (learning exactly the same)
    gave PCPO a significantly higher paired gain, its scale called a sampler offset; on one scale it was lower."""
    from pcpo_eval.errors import UserError

    with pytest.raises(UserError, match=r"the runs are trained on different reward \(.*two scales.*set reward once"):
        load_spec(write_spec(tmp_path / "s.yaml", design={"algorithm": levels}, seeds=[0, 1]))


def test_one_reward_by_name_or_as_a_sum_of_one_is_one_reward():
    from pcpo_eval.stats.comparability import reward_problems

    runs = [("A", "a0", {"reward": "toy_aesthetic", "reward_options": {"device": "cuda:1"}}),
            ("B", "b0", {"reward": {"toy_aesthetic": 1.0}, "reward_options": {"device": "cpu"}})]
    assert reward_problems("all", runs, "algorithm") == []
    runs[1][2]["reward_options"]["model"] = "other"
    assert "different reward_options" in reward_problems("all", runs, "algorithm")[0]


def test_epoch_budget_reads_what_a_config_records():
    """Images and optimizer steps per epoch from a run's settings; an imported run records neither, and the
    updates part is compared on its own."""
    from pcpo_eval.stats.comparability import epoch_budget, epoch_unit_problems

    assert epoch_budget({"sample_batch_size": 16, "sample_batches_per_epoch": 2, "gradient_updates": 2,
                         "num_inner_epochs": 1}) == {"images": 32, "updates": 2}
    assert epoch_budget({"paper_total_batch": 512, "sample_batch_size": 8, "sample_batches_per_epoch": 4}) == \
        {"images": 512, "updates": None}
    assert epoch_budget({"model": "sd3:x", "objective": "ppo_clip"}) == {"images": None, "updates": None}
    runs = [("A", "a0", {"gradient_updates": 2, "num_inner_epochs": 1}),
            ("B", "b0", {"gradient_updates": 4, "num_inner_epochs": 1}), ("B", "b1", {"model": "x"})]
    [text] = epoch_unit_problems("all", runs, "A", "B", "algorithm")
    assert "optimizer steps per epoch (B 4, A 2" in text
    assert epoch_unit_problems("all", runs[:1] + runs[2:], "A", "B", "algorithm") == []


def test_a_log_missing_epochs_is_not_averaged_across_the_gap(tmp_path, monkeypatch):
    """A log without epochs 3-7 (merged by hand after a crash, or imported from a sampled W&B history) was read
    as consecutive values: its smoothing windows spanned 10 epochs and its AUC and epochs to target changed
    without a word (speedup_gain:0.3 moved from the whole log's value). Now the missing epochs are NaN: what
    needs them is not estimable, and a note names them."""
    whole = _planted(tmp_path, monkeypatch)

    def gap(logs):
        logs["algorithm-B__seed-1"] = logs["algorithm-B__seed-1"].drop(index=range(2, 7))

    (tmp_path / "gap").mkdir()
    res = _planted(tmp_path / "gap", monkeypatch, gap)
    rows = {v["quantity"]: v for v in res["verdict"]}
    assert not rows["auc"]["estimable"] and not rows["speedup_gain:0.3"]["estimable"]
    assert rows["paired_gain"]["p"] == pytest.approx(next(v["p"] for v in whole["verdict"]
                                                          if v["quantity"] == "paired_gain"))  # its last 5 are there
    assert any(n.startswith("algorithm-B__seed-1 has no log row for epoch(s) 3, 4, 5, 6, 7") for n in res["verdict_notes"])


def test_a_log_numbered_from_zero_is_refused(tmp_path):
    """Epoch 0 (ddpo-pytorch's and W&B's numbering) put beside runs numbered from 1 reaches every target one
    epoch early: with identical curves, 5 seeds read as a +7.8% speed-up at the exact sign-flip p 0.0625."""
    from pcpo_eval.errors import UserError
    from pcpo_eval.rundir import load_log

    pd.DataFrame({"epoch": np.arange(0, 6), "reward_mean": np.linspace(0, 1, 6)}).to_parquet(tmp_path / "l.parquet")
    with pytest.raises(UserError, match="starts at epoch 0; epochs are numbered from 1 .*add 1 to its epochs"):
        load_log(tmp_path / "l.parquet")
    pd.DataFrame({"epoch": [1, 1.5, 2], "reward_mean": [0.0, 0.1, 0.2]}).to_csv(tmp_path / "h.csv", index=False)
    with pytest.raises(UserError, match="holds 1.5, not a whole epoch"):
        load_log(tmp_path / "h.csv")


def test_a_verdict_chosen_among_several_analyses_says_so(tmp_path, fakes):
    """Re-analysing the same runs with other verdict settings (the targets, then the primary endpoint), or
    after adding or dropping seeds, is another look at chance: each may show a difference, and keeping the
    one that does raises the study's false-claim rate. Every verdict is logged in analyses.jsonl; a later one
    that follows other settings or another set of runs says so in the headline. An unchanged re-analysis,
    the default primary written out, or reordered metrics say nothing; another metric list changes only the
    image comparisons, said under the raw-score table."""
    fakes.curves = {"A": rising(0.07, run_sd=0.01), "B": rising(0.07, run_sd=0.01)}
    spec = dict(**AA, seeds={"A": [0, 1, 2], "B": [3, 4, 5]}, targets=[0.3], gain_targets=[0.3])
    first = _study(tmp_path, **spec)
    assert first["analysis_history"] is None and "Analysis history" not in first["headline"]
    out = tmp_path / "study"
    same = _study(tmp_path, **{**spec, "primary": ["paired_gain"]})  # the default, written out
    assert same["analysis_history"] is None
    again = _study(tmp_path, **{**spec, "targets": [0.4]})
    hist = again["analysis_history"]
    # the first two analyses had one setting (the default primary written out): one earlier analysis, not two
    assert hist["earlier"] == 1 and hist["changed"] == ["targets"] and not any(hist["other_runs"].values())
    assert again["headline"].endswith(
        "Analysis history: this verdict follows 1 earlier analysis(es) of these runs with other settings (changed: "
        "targets). Each look can show a difference by chance, so a verdict chosen among several has a false-claim "
        "rate above alpha; report the analysis planned before the first look, or every one (analyses.jsonl lists "
        "them).")
    assert hist["note"] in again["verdict_notes"] and hist["image_note"] is None
    primary = _study(tmp_path, **{**spec, "targets": [0.4], "primary": ["speedup_gain:0.3"]})
    assert primary["analysis_history"]["changed"] == ["primary", "targets"]
    more = _study(tmp_path, **{**spec, "seeds": {"A": [0, 1, 2, 6], "B": [3, 4, 5, 7]}})
    assert more["analysis_history"]["other_runs"] == {"added": 4, "dropped": 0, "replaced": 0}
    assert "4 earlier analysis(es) used another set of runs (4 with runs added since)" in more["headline"]
    fewer = _study(tmp_path, **{**spec, "seeds": {"A": [0, 1], "B": [3, 4]}})  # seeds dropped after a look
    assert fewer["analysis_history"]["other_runs"] == {"added": 0, "dropped": 5, "replaced": 0}
    lines = [json.loads(x) for x in (out / "analyses.jsonl").read_text().splitlines()]
    assert [len(x["runs"]) for x in lines] == [6, 6, 6, 6, 8, 4]
    assert lines[0]["settings"]["primary"] == ["all: paired_gain"] and lines[0]["primary"][0]["quantity"] == "paired_gain"
    html = (out / "report.html").read_text()
    assert "Analysis history:" in html
    # image-metric settings: a note under the raw-score table, not the headline; their order means nothing
    reordered = _study(tmp_path, **{**spec, "seeds": {"A": [0, 1], "B": [3, 4]}, "metrics": ["lpips_toy", "fd_toy"]})
    assert reordered["analysis_history"]["image_changed"] == []  # only the earlier 6- and 8-run looks, not metrics
    metrics = _study(tmp_path, **{**spec, "seeds": {"A": [0, 1], "B": [3, 4]}, "metrics": ["lpips_toy"],
                                  "overall_only": []})
    assert metrics["analysis_history"]["changed"] == []  # the verdict settings are those of the 4-run looks
    assert metrics["raw_scores"]["history_note"].startswith("Analysis history: earlier analyses of these runs "
                                                            "compared the images with other settings (changed: "
                                                            "metrics, overall_only)")
    from pcpo_eval.study.history import settings_of

    sp = load_spec(tmp_path / "s.yaml")
    assert settings_of(sp, [])["metrics"] == sorted(sp.metrics)
    # a setting a newer version records (an LMM option an older log lacks) is no change of analysis
    from pcpo_eval.study.history import history_caveat
    from pcpo_eval.studydir import StudyLayout

    lay = StudyLayout(out)
    trimmed = [dict(x, settings=dict(x["settings"], lmm={k: v for k, v in x["settings"]["lmm"].items()
                                                         if k != "adjust"})) for x in lines]
    lay.analyses_file.write_text("".join(json.dumps(x) + "\n" for x in trimmed))
    sp = load_spec(write_spec(tmp_path / "s2.yaml", **{**spec, "targets": [0.4]}))
    rows = [{"cell": "all", "quantity": "paired_gain", "family": "primary"}]
    assert history_caveat(sp, lay, rows)["changed"] == ["primary", "targets"]  # not "lmm"
