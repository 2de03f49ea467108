"""Study pipeline: spec validation (every problem at once), stage skipping and crash recovery.

Stage logic is tested with fast stand-ins for the trainer, generator and metric workers
(tests/support/study.py; they write the documented run / image-set / metrics layouts); the real
toy-model study is the one ``slow`` test at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.stats.formula import parse_lmm_formula
from pcpo_eval.study.runner import StageError, run_study
from pcpo_eval.study.spec import STAGES, load_spec
from pcpo_eval.testing import isolate_weight_caches
from tests.support.study import install_fakes, write_run, write_spec


@pytest.fixture(autouse=True)
def no_weights(tmp_path, monkeypatch):
    """Empty weight caches and no backend variables: real backends are absent whatever the machine holds,
    and a stray hub call fails instead of downloading (``HF_HUB_OFFLINE``)."""
    isolate_weight_caches(tmp_path / "empty_cache", monkeypatch)


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------


def test_valid_spec_expands_factorial_times_seeds(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", seeds=[0, 1, 2]))
    assert len(spec.runs) == 12
    assert {r.name for r in spec.runs if r.seed == 1} == {
        "algorithm-DDPO__batch-16__seed-1", "algorithm-DDPO__batch-32__seed-1",
        "algorithm-PCPO__batch-16__seed-1", "algorithm-PCPO__batch-32__seed-1"}
    r = next(r for r in spec.runs if r.levels == {"algorithm": "PCPO", "batch": "32"} and r.seed == 2)
    assert r.overrides == {"objective": "pcpo", "sample_batch_size": 32} and r.cell == "algorithm-PCPO__batch-32"
    assert spec.cell_key(r) == "batch=32" and spec.role(r) == "pcpo" and spec.arm(r) == "PCPO"
    # resolved once at validation: defaults < train.overrides < the cell's levels < the study's seed and control
    assert (r.train.objective, r.train.sample_batch_size, r.train.epochs, r.train.checkpoint_every) == ("pcpo", 32, 12, 2)
    assert (r.train.seed, r.train.paired_control) == (2, True)
    assert spec.base_model == "toy" and spec.eval.sigma_schedule == "ddim"  # unset = the ddim sampler's default
    assert spec.cells() == ["batch=16", "batch=32"]
    assert spec.per_prompt_metrics == ("lpips_toy",) and spec.select_epoch == "final" and spec.parallel == 1


def test_default_seed_is_the_train_configs_and_control_can_be_switched_off(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.yaml", train={"overrides": {"epochs": 4, "seed": 7}},
                                paired_control=False))
    assert spec.seeds == {"DDPO": (7,), "PCPO": (7,)}
    assert {(r.name.split("__")[-1], r.train.seed, r.train.paired_control) for r in spec.runs} == {("seed-7", 7, False)}


def test_seeds_per_arm_for_an_aa_study(tmp_path):
    design = {"algorithm": {"A": {"objective": "ppo_clip"}, "B": {"objective": "ppo_clip"}}}
    spec = load_spec(write_spec(tmp_path / "s.yaml", design=design, compare={"factor": "algorithm", "baseline": "A",
                                "pcpo": "B"}, seeds={"A": [0, 1], "B": [2, 3]}, lmm={"formula": "value ~ algorithm + (1|prompt)"}))
    assert sorted((r.levels["algorithm"], r.train.seed) for r in spec.runs) == [("A", 0), ("A", 1), ("B", 2), ("B", 3)]
    with pytest.raises(UserError, match=r"seeds per arm must give a list for each level of the compared factor \(A, B\)"):
        load_spec(write_spec(tmp_path / "s.yaml", design=design, seeds={"A": [0, 1]},
                             lmm={"formula": "value ~ algorithm + (1|prompt)"}))


def test_study_keys_are_not_overrides(tmp_path):
    design = {"algorithm": {"DDPO": {"objective": "ppo_clip", "seed": 3}, "PCPO": {"objective": "pcpo",
                                                                                  "paired_control": False}}}
    with pytest.raises(UserError) as ei:
        load_spec(write_spec(tmp_path / "s.yaml", design=design, seeds=[0, 0], lmm={"formula": "value ~ algorithm + (1|prompt)"}))
    msg = str(ei.value)
    assert "has 3 problem(s)" in msg and "\n" not in msg
    assert "seeds lists a seed twice" in msg
    assert "design.algorithm.DDPO sets seed; list the training seeds at the top of the spec (seeds: [0, 1, 2])" in msg
    assert "design.algorithm.PCPO sets paired_control; set it once at the top of the spec" in msg


def test_run_names_that_sanitise_to_one_directory_are_refused(tmp_path):
    design = {"algorithm": {"DDPO": {"objective": "ppo_clip"}, "PCPO v1": {"objective": "pcpo"},
                            "PCPO/v1": {"objective": "pcpo"}}}
    with pytest.raises(UserError, match=r"design cells \(algorithm='PCPO v1'\) and \(algorithm='PCPO/v1'\) share the "
                                        r"run directory algorithm-PCPO_v1 .*rename one of the levels"):
        load_spec(write_spec(tmp_path / "s.yaml", design=design,
                             compare={"factor": "algorithm", "baseline": "DDPO", "pcpo": "PCPO v1"},
                             lmm={"formula": "value ~ algorithm + (1|prompt)"}))


def test_rank_deficient_per_prompt_metric_is_refused_with_the_fix(tmp_path):
    with pytest.raises(UserError) as ei:
        load_spec(write_spec(tmp_path / "s.yaml", metrics=["fd_toy", "is_toy", "lpips_toy"], overall_only=None))
    msg = str(ei.value)
    assert "has 2 problem(s)" in msg and "\n" not in msg
    assert ("per-prompt fd_toy with 4 images per prompt in 128-d features fits a degenerate Gaussian" in msg
            and "(in the spec: eval.seeds: 129, or overall_only: [fd_toy], or per_prompt_rank_deficient_ok: [fd_toy]"
            in msg)
    assert "per-prompt is_toy with 4 images per prompt" in msg and "or overall_only: [is_toy])" in msg
    # the explicit opt-in (the paper's per-prompt FID protocol) is accepted for FD metrics only
    spec = load_spec(write_spec(tmp_path / "s.yaml", overall_only=None, per_prompt_rank_deficient_ok=["fd_toy"]))
    assert spec.per_prompt_metrics == ("fd_toy", "lpips_toy") and spec.per_prompt_rank_deficient_ok == ("fd_toy",)
    with pytest.raises(UserError, match=r"per_prompt_rank_deficient_ok names 'lpips_toy': only Frechet distances"):
        load_spec(write_spec(tmp_path / "s.yaml", per_prompt_rank_deficient_ok=["lpips_toy"]))


def test_existing_runs_per_seed(tmp_path):
    runs = []
    for alg in ("DDPO", "PCPO"):
        for b in ("16", "32"):
            for seed in (0, 1):
                rd = tmp_path / f"run_{alg}_{b}_{seed}"
                write_run(rd, 8, 0.05 if alg == "DDPO" else 0.08, 2, rng_key=rd.name)
                runs.append({"levels": {"algorithm": alg, "batch": b}, "seed": seed, "run_dir": str(rd)})
    spec = load_spec(write_spec(tmp_path / "s.yaml", runs=runs, seeds=[0, 1], targets=[0.3], select_target=0.3))
    assert all(r.run_dir and r.train is None for r in spec.runs) and len(spec.runs) == 8
    assert next(r for r in spec.runs if r.name == "algorithm-PCPO__batch-32__seed-1").run_dir.endswith("run_PCPO_32_1")
    bad = [{**runs[0], "seed": 5}, {k: v for k, v in runs[1].items() if k != "seed"}]
    with pytest.raises(UserError) as ei:
        load_spec(write_spec(tmp_path / "s.yaml", runs=bad, seeds=[0, 1], targets=[0.3], select_target=0.3))
    assert "runs[0].seed 5 is not one of the study's seeds (0, 1)" in str(ei.value)
    assert "runs[1] needs seed: (one of the study's seeds 0, 1)" in str(ei.value)


def test_train_config_file_read_once_with_overrides_on_top(tmp_path):
    cfg = tmp_path / "base.yaml"
    cfg.write_text("epochs: 30\nlearning_rate: 0.003\nsample_steps: 6\n")
    spec = load_spec(write_spec(tmp_path / "s.yaml", train={"config": "base.yaml", "overrides": {"epochs": 4}}))
    assert {(r.train.epochs, r.train.learning_rate, r.train.sample_steps) for r in spec.runs} == {(4, 0.003, 6)}
    assert spec.sampling()["steps"] == 4  # eval.steps of the spec; cfg / eta from the first run's config
    cfg.write_text("epochs: [1\n")
    with pytest.raises(UserError, match=r"has 1 problem\(s\): \(1\) config file .*base.yaml is not valid YAML"):
        load_spec(tmp_path / "s.yaml")


def test_every_problem_listed_at_once(tmp_path):
    path = write_spec(
        tmp_path / "bad.yaml",
        colour="blue",  # unknown top-level key
        eval={"prompts": "toy", "seeds": "4", "stepz": 3},  # unknown eval key
        runs=[{"levels": {"algorithm": "DDPO", "batch": "16"}, "run_dir": str(tmp_path / "nope")}],  # missing run
        compare={"factor": "algorithm", "baseline": "DDPO", "pcpo": "PPO"},  # bad level
        metrics=["fid", "fd_toy", "bogus"],  # fid: inception weights absent; bogus: unknown
        overall_only=["fid", "fd_toy"],
        lmm={"formula": "value ~ algorithm * lr + (1|prompt)"},  # lr is not a column
        targets=[0.3, "high"],
        parallel=0,
    )
    with pytest.raises(UserError) as ei:
        load_spec(path)
    msg = str(ei.value)
    assert "\n" not in msg
    for needle in ("unknown key(s) colour", "unknown key(s) stepz in eval", "missing run", "compare.pcpo 'PPO'",
                   "unknown metric 'bogus'", "inception weights not found", "names 'lr'", "target 'high'",
                   "parallel must be a positive integer"):
        assert needle in msg, needle
    assert "has 9 problem(s)" in msg


def test_yaml_booleans_are_not_counts(tmp_path):
    """YAML reads `on` / `yes` as True, which passed as the integer 1: a one-epoch smoothing window, one IS split,
    a one-prompt preference set, all without a word."""
    path = write_spec(tmp_path / "s.yaml", window=True, metric_options={"batch_size": True, "is_splits": True},
                      preference=[{"name": "p", "prompts": "simple_animals", "max_prompts": True,
                                   "max_prompt_tokens": True, "seeds": True}])
    with pytest.raises(UserError) as ei:
        load_spec(path, check_weights=False)
    msg = str(ei.value)
    for needle in ("window must be a positive integer (got True)", "metric_options.batch_size must be a positive "
                   "integer (got True)", "metric_options.is_splits must be a positive integer (got True)",
                   "preference p.max_prompts True: use a whole number >= 1", "preference p.max_prompt_tokens True",
                   "preference p.seeds: seeds True is a YAML boolean"):
        assert needle in msg, needle


def test_bad_train_overrides_are_reported_per_run(tmp_path):
    path = write_spec(tmp_path / "s.yaml", train={"overrides": {"epochs": 0, "learning_rte": 1}})
    with pytest.raises(UserError, match=r"run algorithm-DDPO__batch-16__seed-0: unknown config key\(s\) learning_rte"):
        load_spec(path)


def test_baseline_must_be_reference_level(tmp_path):
    path = write_spec(tmp_path / "s.yaml", compare={"factor": "algorithm", "baseline": "PCPO", "pcpo": "DDPO"})
    with pytest.raises(UserError, match="must sort first"):
        load_spec(path)


def test_parse_lmm_formula():
    assert parse_lmm_formula("value ~ a * b + (1|prompt)") == ("value ~ a * b", ["prompt"], None)
    assert parse_lmm_formula("value ~ a + (1|prompt) + (1 | seed)") == ("value ~ a", ["prompt", "seed"], None)
    assert parse_lmm_formula("value ~ a + (a|prompt)") == ("value ~ a", ["prompt"], "~a")


def test_unreachable_target_of_existing_runs(tmp_path):
    runs = []
    for alg in ("DDPO", "PCPO"):
        for b in ("16", "32"):
            rd = tmp_path / f"run_{alg}_{b}"
            write_run(rd, 8, 0.05 if alg == "DDPO" else 0.08, 2, rng_key=rd.name)
            runs.append({"levels": {"algorithm": alg, "batch": b}, "run_dir": str(rd)})
    path = write_spec(tmp_path / "s.yaml", runs=runs, targets=[0.3, 5.0], select_target=0.3)
    with pytest.raises(UserError, match=r"target 5 is reached by no run \(best smoothed reward"):
        load_spec(path)
    spec = load_spec(write_spec(tmp_path / "s.yaml", runs=runs, targets=[0.3], select_target=0.3))
    assert all(r.run_dir for r in spec.runs)


def test_runs_shorter_than_the_smoothing_window_reach_no_target(tmp_path):
    """Targets and the matched checkpoint are reached over full windows only: 3-epoch runs with window 5
    reach none, and the message names the window instead of a best reward of -inf."""
    runs = []
    for alg in ("DDPO", "PCPO"):
        for b in ("16", "32"):
            rd = tmp_path / f"run_{alg}_{b}"
            write_run(rd, 3, 0.05, 1, rng_key=rd.name)
            runs.append({"levels": {"algorithm": alg, "batch": b}, "run_dir": str(rd)})
    with pytest.raises(UserError, match=r"no run has logged 5 epochs \(the smoothing window\).*set a smaller window"):
        load_spec(write_spec(tmp_path / "s.yaml", runs=runs, targets=[-1.0], select_target=-1.0))
    spec = load_spec(write_spec(tmp_path / "s.yaml", runs=runs, targets=[-1.0], select_target=-1.0, window=3))
    assert spec.window == 3


# ------------------------------------------------------------------------------------------------
# stand-ins for the heavy pieces (they write the documented layouts)
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def fakes(monkeypatch):
    return install_fakes(monkeypatch)


def _n_sets(out: Path) -> int:
    """Base + every distinct selected checkpoint (reward-matched and matched-epoch)."""
    sel = json.loads((out / "selection.json").read_text())
    return 1 + len({(c["name"], c["epoch"]) for c in [*sel["runs"], *sel["at_epoch"]] if c["path"]})


def test_stages_run_then_skip_finished_work(tmp_path, fakes):
    spec = write_spec(tmp_path / "s.yaml", seeds=[0, 1])
    out = tmp_path / "study"
    logs: list[str] = []
    report = run_study(spec, out, log=logs.append)
    assert report == out / "report.html" and report.is_file()
    assert len(fakes.train_calls) == 8 and not any(r for _, r in fakes.train_calls)
    n_sets = _n_sets(out)
    assert 9 <= n_sets <= 17 and len(fakes.generate_calls) == n_sets and len(fakes.metrics_calls) == n_sets
    res = json.loads((out / "results.json").read_text())
    assert {b["cell"] for b in res["speedup"]} == {"batch=16", "batch=32"}
    row = res["speedup"][0]["rows"][1]  # reward target 0.5 (full window 5)
    assert (row["quantity"], row["curve"]) == ("speedup_reward:0.5", "reward") and row["speedup"] > 0
    assert float(row["baseline_epochs"].split()[0]) > float(row["pcpo_epochs"].split()[0])
    assert set(res["lmm"]["fits"]) == {"lpips_toy", "lpips_toy @ epoch 12"}
    assert res["lmm"]["formula"] == "value ~ algorithm * batch + (1|prompt) + (1|run)"  # 2 runs per arm
    fit = res["lmm"]["fits"]["lpips_toy"]
    fe = {f["term"]: f for f in fit["fixed"]}
    assert fe["algorithm[T.PCPO]"]["estimate"] == pytest.approx(0.05, abs=0.02)
    assert fit["groups"] == ["prompt", "run"]
    sig = res["raw_scores"]["significance"]
    assert sig["batch=16"]["fd_toy"]["method"].startswith("Welch t over runs of the overall fd_toy (2 vs 2 runs)")
    assert sig["batch=16"]["lpips_toy"]["method"].endswith("+ (1|prompt) + (1|run) (REML, Satterthwaite df)")
    assert {v["quantity"] for v in res["verdict"]} == {"paired_gain", "final_reward", "auc", "sampler_offset",
                                                       "speedup_reward:0.3", "speedup_reward:0.5"}
    assert all(v["paired"] for v in res["verdict"])  # both arms train seeds 0 and 1
    assert {(r["cell"], r["arm"]) for r in res["runs"]} == {(c, a) for c in ("batch=16", "batch=32") for a in ("DDPO", "PCPO")}
    html = report.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>" not in html
    # the rliable panels' numbers reach results.json and the report draws them (they were computed and
    # dropped: every study's report said "holds no rliable numbers")
    panels = res["rliable"]
    assert {(i["cell"], i["arm"]) for i in panels["intervals"]} == {(c, a) for c in ("batch=16", "batch=32")
                                                                    for a in ("DDPO", "PCPO")}
    assert {i["arm"] for i in panels["improvement"]} == {"PCPO"} and panels["profiles"]
    assert "holds no rliable numbers" not in html
    written = {p.name for p in (out / "figures").iterdir()}
    assert {f"{n}.png" for n in ("interval_estimates", "probability_of_improvement", "performance_profiles")} <= written, written

    # second run: nothing is recomputed
    state = json.loads((out / "study_state.json").read_text())
    logs.clear()
    run_study(spec, out, log=logs.append)
    assert len(fakes.train_calls) == 8 and len(fakes.generate_calls) == n_sets and len(fakes.metrics_calls) == n_sets
    assert json.loads((out / "study_state.json").read_text()) == state
    assert sum("skipped" in line for line in logs) == 8 + 2 * (n_sets - 1) + 2 + 3  # runs, sets, metrics, base, stages


def test_a_changed_select_on_selects_again(tmp_path, fakes):
    """A resume with another ``select_on`` kept the selection made under the old one ("selection unchanged,
    skipped"; results.json's selection said ``on: gain`` under a spec saying ``train``)."""
    out, stages = tmp_path / "study", ("train", "select")
    run_study(write_spec(tmp_path / "s.yaml", seeds=[0], select_on="train"), out, stages, log=lambda _: None)
    assert json.loads((out / "selection.json").read_text())["on"] == "train"
    logs: list[str] = []
    run_study(write_spec(tmp_path / "s.yaml", seeds=[0], select_on="gain"), out, stages, log=logs.append)
    assert not any("selection unchanged, skipped" in line for line in logs), logs
    assert json.loads((out / "selection.json").read_text())["on"] == "gain"


def test_crash_names_stage_and_rerun_continues(tmp_path, fakes):
    spec = write_spec(tmp_path / "s.yaml")
    out = tmp_path / "study"
    fakes.fail_train_once = "algorithm-PCPO__batch-16__seed-0"
    with pytest.raises(StageError, match=r"study stage 'train' failed: RuntimeError: simulated crash"):
        run_study(spec, out, log=lambda s: None)
    assert (out / "logs" / "train.error.txt").is_file()
    done_before = [n for n, _ in fakes.train_calls]
    assert (out / "runs" / "algorithm-DDPO__batch-16__seed-0" / "log.parquet").is_file()  # earlier output kept

    fakes.fail_metrics_on = "algorithm-PCPO__batch-32__seed-0/epoch_0012"  # the last set measured
    with pytest.raises(StageError, match="study stage 'metrics' failed"):
        run_study(spec, out, log=lambda s: None)
    new = fakes.train_calls[len(done_before):]
    assert ("algorithm-PCPO__batch-16__seed-0", True) in new  # resumed from its checkpoint
    assert all(name not in done_before or name == "algorithm-PCPO__batch-16__seed-0" for name, _ in new)
    n_metrics = len(fakes.metrics_calls)

    fakes.fail_metrics_on = None
    run_study(spec, out, log=lambda s: None)
    assert len(fakes.metrics_calls) == n_metrics + 1  # only the failed set is measured again
    assert (out / "report.html").is_file()


def test_runs_trained_for_another_spec_are_not_reused(tmp_path, fakes):
    out = tmp_path / "study"
    run_study(write_spec(tmp_path / "s.yaml", paired_control=False), out, stages=("train",), log=lambda s: None)
    with pytest.raises(StageError, match=r"'train' failed: run\(s\) trained with other settings than the spec gives: "
                                         r"algorithm-DDPO__batch-16__seed-0 \(paired_control\);.* delete them under"):
        run_study(write_spec(tmp_path / "s.yaml"), out, stages=("train",), log=lambda s: None)
    assert len(fakes.train_calls) == 4  # nothing retrained or resumed silently


def test_runs_from_before_a_new_config_key_are_reused(tmp_path, fakes):
    """A key an older run's config.yaml lacks counts as its default: such runs are not 'other settings'."""
    out = tmp_path / "study"
    spec_path = write_spec(tmp_path / "s.yaml")
    run_study(spec_path, out, stages=("train",), log=lambda s: None)
    n = len(fakes.train_calls)
    configs = sorted((out / "runs").glob("*/config.yaml"))
    assert len(configs) == n == 4
    for cfg in configs:
        saved = yaml.safe_load(cfg.read_text())
        assert saved.pop("step_weighting") == "native"  # as written before the key existed
        cfg.write_text(yaml.safe_dump(saved))
    run_study(spec_path, out, stages=("train",), log=lambda s: None)
    assert len(fakes.train_calls) == n  # reused, not refused and not retrained


def test_wall_clock_prefers_the_trainers_cumulative_column():
    from pcpo_eval.study.verdicts import _wall_clock

    log = pd.DataFrame({"wall_time_s": [2.0, 3.0], "wall_clock_s": [1.5, 3.0]})
    assert _wall_clock(log) == [1.5, 3.0]
    assert _wall_clock(log.drop(columns="wall_clock_s")) == [2.0, 5.0]  # older runs: cumulative epoch time
    assert _wall_clock(pd.DataFrame({"reward_mean": [0.1]})) is None


def test_unreachable_target_after_training(tmp_path, fakes):
    spec = write_spec(tmp_path / "s.yaml", targets=[0.3, 2.0], select_target=0.3)
    with pytest.raises(StageError, match=r"'train' failed: target 2 is reached by no run"):
        run_study(spec, tmp_path / "study", log=lambda s: None)
    assert len(fakes.train_calls) == 4 and not fakes.generate_calls


def test_study_cli_validation_error(tmp_path, cli):
    path = write_spec(tmp_path / "s.yaml", metrics=["nope"])
    res = cli("study", str(path), "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "unknown metric 'nope'" in res.stderr
    assert not (tmp_path / "o").exists()  # nothing written before validation passes


def test_stage_names():
    assert STAGES == ("train", "select", "generate", "metrics", "stats", "report")


@pytest.mark.parametrize(("epoch", "needle"), [(99, "trains 12 epochs, fewer than 99"),
                                               (5, "saves every 2 epochs, not at epoch 5")])
def test_a_select_epoch_no_run_will_save_is_refused_before_training(tmp_path, epoch, needle):
    """An integer ``select_epoch`` past the runs' epochs (or between their checkpoints) failed only in the
    select stage, after every run had trained (a review: 86 s on the toy world); a mapping was checked."""
    with pytest.raises(UserError, match=f"select_epoch: run .* {needle}"):
        load_spec(write_spec(tmp_path / "s.yaml", select_epoch=epoch))
    assert load_spec(write_spec(tmp_path / "ok.yaml", select_epoch=12)).select_epoch == 12
