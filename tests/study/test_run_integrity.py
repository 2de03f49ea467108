"""Input integrity of a study: runs, image sets and metrics that are not what the spec says they are.

Each test feeds a study an input a user could plausibly give it by mistake and checks that the study
refuses it by name (or says so in the verdict) instead of printing a conclusion about the wrong thing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.study.spec import load_spec
from tests.support.study import write_run, write_spec

ONE_FACTOR = {"algorithm": {"DDPO": {"objective": "ppo_clip"}, "PCPO": {"objective": "pcpo"}}}


def _existing(tmp: Path, configs: dict[tuple[str, int], dict]) -> list[dict]:
    """Existing run directories, one per (arm, listed seed), with the given config.yaml."""
    runs = []
    for (alg, seed), cfg in configs.items():
        rd = tmp / f"run_{alg}_{seed}"
        write_run(rd, 8, 0.05 if alg == "DDPO" else 0.08, 2, config=cfg, rng_key=rd.name)
        runs.append({"levels": {"algorithm": alg}, "seed": seed, "run_dir": str(rd)})
    return runs


def _spec(tmp: Path, runs: list[dict], design: dict | None = None) -> Path:
    return write_spec(tmp / "s.yaml", runs=runs, seeds=[0, 1], targets=[0.3], select_target=0.3,
                      design=design or ONE_FACTOR, lmm={"formula": "value ~ algorithm + (1|prompt)"})


def _cfg(alg: str, seed: int, **changes) -> dict:
    return {"model": "toy", "reward": "toy_aesthetic", "sample_steps": 8, "learning_rate": 5e-5,
            "objective": "ppo_clip" if alg == "DDPO" else "pcpo", "seed": seed, **changes}


def test_existing_runs_with_another_reward_or_sampler_setting_are_refused(tmp_path):
    configs = {(a, s): _cfg(a, s) for a in ("DDPO", "PCPO") for s in (0, 1)}
    assert len(load_spec(_spec(tmp_path, _existing(tmp_path, configs)), check_weights=False).runs) == 4
    for s in (0, 1):  # the PCPO runs were trained on another reward with more sampler steps
        configs[("PCPO", s)] = _cfg("PCPO", s, reward="jpeg_compressibility", sample_steps=20)
    with pytest.raises(UserError) as ei:
        load_spec(_spec(tmp_path, _existing(tmp_path, configs)), check_weights=False)
    msg = str(ei.value)
    assert ("in cell all, the runs are trained on different reward (DDPO 'toy_aesthetic'; PCPO "
            "'jpeg_compressibility'): every row compares rewards") in msg
    assert ("the runs differ in sample_steps (DDPO 8; PCPO 20), which no level of algorithm sets: the verdict would "
            "credit that difference to algorithm") in msg and "has 2 problem(s)" in msg
    # a difference the design declares is the comparison itself, and must hold within each arm
    design = {"algorithm": {"DDPO": {"objective": "ppo_clip", "sample_steps": 8},
                            "PCPO": {"objective": "pcpo", "sample_steps": 20}}}
    for s in (0, 1):
        configs[("PCPO", s)] = _cfg("PCPO", s, sample_steps=20)
    load_spec(_spec(tmp_path, _existing(tmp_path, configs), design), check_weights=False)
    # the reward is never the comparison: declared by the levels too, it is refused (two reward scales)
    rewards = {"algorithm": {k: {**v, "reward": r} for (k, v), r in
                             zip(design["algorithm"].items(), ("toy_aesthetic", "jpeg_compressibility"), strict=True)}}
    for s in (0, 1):
        configs[("PCPO", s)] = _cfg("PCPO", s, sample_steps=20, reward="jpeg_compressibility")
    with pytest.raises(UserError, match=r"has 1 problem.*trained on different reward"):
        load_spec(_spec(tmp_path, _existing(tmp_path, configs), rewards), check_weights=False)
    configs[("PCPO", 0)] = _cfg("PCPO", 0, sample_steps=20)
    configs[("PCPO", 1)] = _cfg("PCPO", 1, sample_steps="12")
    with pytest.raises(UserError, match=r"listed under a design level that sets sample_steps: 20, but its config.yaml "
                                        r"records sample_steps: '12'.*the PCPO runs differ in sample_steps"):
        load_spec(_spec(tmp_path, _existing(tmp_path, configs), design), check_weights=False)


def test_existing_run_listed_with_the_wrong_seed_or_level_is_refused(tmp_path):
    configs = {(a, s): _cfg(a, s) for a in ("DDPO", "PCPO") for s in (0, 1)}
    configs[("PCPO", 1)] = _cfg("PCPO", 7)  # trained with seed 7, listed as seed 1: paired with DDPO seed 1
    configs[("DDPO", 1)] = _cfg("PCPO", 1)  # a PCPO run listed under DDPO
    with pytest.raises(UserError) as ei:
        load_spec(_spec(tmp_path, _existing(tmp_path, configs)), check_weights=False)
    msg = str(ei.value)
    assert ("run algorithm-PCPO__seed-1 is listed with seed 1, but its config.yaml records seed 7: pairing by seed "
            "would pair it with the other arm's seed-1 run; list it with seed: 7") in msg
    assert ("run algorithm-DDPO__seed-1 is listed under a design level that sets objective: 'ppo_clip', but its "
            "config.yaml records objective: 'pcpo'") in msg


def test_imported_runs_compare_only_what_they_record(tmp_path):
    """An imported run's config.yaml holds its model and objective only: nothing else is compared, and
    YAML's text numbers (5e-5) equal the trainer's floats."""
    configs = {("DDPO", 0): {"model": "toy", "objective": "ppo_clip", "imported_from": "dancegrpo", "source": "/a"},
               ("DDPO", 1): {"model": "toy", "objective": "ppo_clip", "imported_from": "dancegrpo", "source": "/b"},
               ("PCPO", 0): _cfg("PCPO", 0, learning_rate="5e-5"), ("PCPO", 1): _cfg("PCPO", 1)}
    sp = load_spec(_spec(tmp_path, _existing(tmp_path, configs)), check_weights=False)
    assert len(sp.runs) == 4
    # ... and the verdict says what it could not check (before: nothing, though every check passed vacuously)
    assert sp.unchecked_caveats == (
        "settings not checked: 4 run(s) (algorithm-DDPO__seed-0, algorithm-DDPO__seed-1, algorithm-PCPO__seed-0, "
        "...) record no images sampled "
        "per epoch, optimizer steps per epoch, learning_rate, sample_steps, sample_eta, cfg and 7 more, so the arms "
        "may differ in them "
        "unseen (an imported run's config.yaml holds its model, objective and reward only); add the settings each "
        "run was trained with to its config.yaml (a total batch as paper_total_batch)",)
    from pcpo_eval.study.verdicts import run_level
    from pcpo_eval.studydir import StudyLayout

    res = run_level(sp, StudyLayout(tmp_path / "study"))
    assert "Settings not checked: 4 run(s)" in res["headline"] and sp.unchecked_caveats[0] in res["verdict_notes"]
    # imported with --reward: the reward it was trained on is compared like a trained run's
    for s in (0, 1):
        configs[("DDPO", s)]["reward"] = "hps"
    with pytest.raises(UserError, match=r"the runs are trained on different reward \(DDPO 'hps'; PCPO 'toy_aesthetic'\)"):
        load_spec(_spec(tmp_path, _existing(tmp_path, configs)), check_weights=False)


def test_a_run_copied_into_both_arms_is_refused(tmp_path):
    """``cp -r`` of one run into the other arm's folder: two paths, one run (the path check cannot see it)."""
    import shutil

    configs = {(a, s): {"model": "toy", "seed": s} for a in ("DDPO", "PCPO") for s in (0, 1)}
    runs = _existing(tmp_path, configs)
    shutil.rmtree(runs[2]["run_dir"])
    shutil.copytree(runs[0]["run_dir"], runs[2]["run_dir"])  # DDPO seed 0 copied as PCPO seed 0
    with pytest.raises(UserError, match=r"runs algorithm-DDPO__seed-0 \(.*run_DDPO_0\) and algorithm-PCPO__seed-0 "
                                        r"\(.*run_PCPO_0\) have the same training curves .*: one run copied or imported twice"):
        load_spec(_spec(tmp_path, runs), check_weights=False)


def test_one_run_imported_twice_is_refused_though_its_files_differ(tmp_path):
    """Two imports of one history (another column differing in its last digit, so other bytes) listed as two seeds
    of one arm: pseudo-replication that gave an A/A arm a "higher paired gain" (p = 0.008, 5 copies)."""
    import pandas as pd

    configs = {(a, s): {"model": "toy", "seed": s} for a in ("DDPO", "PCPO") for s in (0, 1)}
    runs = _existing(tmp_path, configs)
    src = pd.read_parquet(Path(runs[2]["run_dir"]) / "log.parquet")
    copy = src.assign(approx_kl=src.get("approx_kl", 0.0) + 1e-15, loss=1.0)
    copy.to_parquet(Path(runs[3]["run_dir"]) / "log.parquet")
    with pytest.raises(UserError, match=r"algorithm-PCPO__seed-0 .* and algorithm-PCPO__seed-1 .* have the same "
                                        r"training curves"):
        load_spec(_spec(tmp_path, runs), check_weights=False)
    # one value moved in its last digit, or an export that ends an epoch sooner: still one run
    import numpy as np

    nudged = src.copy()
    nudged.loc[3, "reward_mean"] = np.nextafter(nudged.loc[3, "reward_mean"], 2.0)
    for edited in (nudged, src.iloc[:-1]):
        edited.to_parquet(Path(runs[3]["run_dir"]) / "log.parquet")
        with pytest.raises(UserError, match=r"have the same training curves"):
            load_spec(_spec(tmp_path, runs), check_weights=False)


def test_same_curves_tells_one_run_from_two_seeds():
    """Distinct seeds of the real toy runs are never one run; a float32 round trip of one is."""
    import numpy as np
    import pandas as pd

    from pcpo_eval.rundir import same_curves

    pool = pd.read_parquet(Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "toy_demo_runs.parquet")
    logs = [g[["epoch", "reward_mean", "control_reward_mean"]].reset_index(drop=True)
            for _, g in pool.groupby(["arm", "seed"])]
    assert len(logs) >= 20 and not any(same_curves(a, b) for i, a in enumerate(logs) for b in logs[i + 1:])
    rounded = logs[0].assign(reward_mean=logs[0]["reward_mean"].astype(np.float32).astype(np.float64))
    assert same_curves(logs[0], rounded) and same_curves(logs[0], logs[0].iloc[:5])
    assert not same_curves(logs[0], logs[0].iloc[:1])  # one shared epoch says nothing


def test_twin_runs_finds_what_comparing_every_pair_finds():
    """``twin_runs`` screens pairs on one value before comparing curves (it compared every pair's whole
    curves: 26 s for 160 runs): on the real toy runs plus copies -- exact, float32-rounded, cut short, shifted
    to start later, with a NaN first reward -- it names the pairs the brute force names."""
    import numpy as np
    import pandas as pd

    from pcpo_eval.rundir import same_curves, twin_runs

    pool = pd.read_parquet(Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "toy_demo_runs.parquet")
    logs = [g[["epoch", "reward_mean", "control_reward_mean"]].reset_index(drop=True)
            for _, g in pool.groupby(["arm", "seed"])][:30]
    nan_first = logs[4].copy()
    nan_first.loc[0, "reward_mean"] = np.nan
    inf_first = logs[7].copy()
    inf_first.loc[0, "reward_mean"] = np.inf  # load_log accepts inf (review: the screen called inf - inf NaN)
    copies = [logs[0].copy(), logs[1].assign(reward_mean=logs[1]["reward_mean"].astype(np.float32).astype(np.float64)),
              logs[2].iloc[:6].copy(), logs[3].iloc[3:].reset_index(drop=True), nan_first, nan_first.copy(),
              logs[5].iloc[:1].copy(), logs[6].drop(columns="reward_mean"), inf_first, inf_first.copy()]
    given = [(f"log{i}", x) for i, x in enumerate([*logs, *copies])]
    brute = []
    for i, (ka, la) in enumerate(given):
        twin = next((kb for kb, lb in given[i + 1:]
                     if "reward_mean" in la.columns and "reward_mean" in lb.columns and same_curves(la, lb)), None)
        if twin is not None:
            brute.append((ka, twin))
    found = [(a, b) for a, b in twin_runs(given) if b != "log37"]  # log37: no reward column (never screened out)
    assert found == brute and len(brute) == 6, brute


def test_an_infinite_reward_never_makes_a_checkpoint_reward_matched(tmp_path):
    """One epoch's reward logged as inf (a reward model overflowing) made every trailing mean over it inf:
    the run's epoch-4 checkpoint "reached" any target and entered the matched-reward metrics."""
    import numpy as np
    import pandas as pd

    from pcpo_eval.stats.select import select_checkpoints

    rd = tmp_path / "run"
    write_run(rd, 12, 0.02, 2, rng_key="inf", config={"model": "toy"})
    assert not select_checkpoints([rd], 0.3).choices[0].reached  # rises 0.02 per epoch to 0.22: 0.3 is not reached
    log = pd.read_parquet(rd / "log.parquet")
    log.loc[2, "reward_mean"] = np.inf
    log.to_parquet(rd / "log.parquet", index=False)
    with pytest.raises(UserError, match=r"log.parquet column 'reward_mean' is infinite at epoch\(s\) 3; a smoothed "
                                        r"reward over those epochs would reach any target"):
        select_checkpoints([rd], 0.3)


def test_a_complete_image_set_of_other_inputs_is_never_reused(tmp_path, monkeypatch):
    """A set was skipped when its manifest had the expected number of images, so a spec with another
    eval.steps, or a run retrained after its sets were rendered, kept the old images (and their metrics,
    keyed on the unchanged manifest) under the new spec's name."""
    import json
    import shutil

    from pcpo_eval.study.runner import StageError, run_study
    from tests.support.study import install_fakes

    fakes = install_fakes(monkeypatch)
    stages = ("train", "select", "generate")
    spec = write_spec(tmp_path / "s.yaml", seeds=[0, 1], design=ONE_FACTOR,
                      lmm={"formula": "value ~ algorithm + (1|prompt)"})
    out = tmp_path / "study"
    run_study(spec, out, stages=stages, log=lambda s: None)
    n = len(fakes.generate_calls)
    run_study(spec, out, stages=stages, log=lambda s: None)
    assert len(fakes.generate_calls) == n  # unchanged inputs: every set reused

    write_spec(tmp_path / "s.yaml", seeds=[0, 1], design=ONE_FACTOR, lmm={"formula": "value ~ algorithm + (1|prompt)"},
               eval={"prompts": str(tmp_path / "prompts.txt"), "seeds": "4", "steps": 6})
    with pytest.raises(StageError, match=rf"{n} image set\(s\) of this study were rendered from other inputs than the "
                                         r"spec now gives: sets/base \(rendered from another checkpoint"):
        run_study(spec, out, stages=stages, log=lambda s: None)
    assert len(fakes.generate_calls) == n
    shutil.rmtree(out / "sets")  # the fix the error names: re-rendered with the new steps
    run_study(spec, out, stages=stages, log=lambda s: None)
    assert len(fakes.generate_calls) == 2 * n

    sel = json.loads((out / "selection.json").read_text())
    ck = out / next(c["path"] for c in sel["runs"] if c["path"])  # a selected checkpoint, retrained since
    meta = json.loads((ck / "checkpoint.json").read_text())
    (ck / "checkpoint.json").write_text(json.dumps({**meta, "weights_sha256": "another training"}))
    with pytest.raises(StageError, match=r"1 image set\(s\) .*: sets/algorithm-\w+__seed-\d/epoch_\d+ \(rendered from "
                                         r"another checkpoint \(a retrained run\?\)"):
        run_study(spec, out, stages=stages, log=lambda s: None)


def test_a_finished_study_works_from_any_folder(tmp_path, monkeypatch):
    """selection.json held checkpoint paths relative to the folder the study ran from ("reports/demo/runs/..."),
    so the same study run from another folder read its sets as "rendered from other inputs" and `human design`
    found no model. They are relative to the study folder now; an older file's are found under it too."""
    import json

    from pcpo_eval.study.runner import run_study
    from pcpo_eval.studydir import StudyLayout, StudyView
    from tests.support.study import install_fakes

    fakes = install_fakes(monkeypatch)
    stages = ("train", "select", "generate")
    spec = write_spec(tmp_path / "s.yaml", seeds=[0, 1], design=ONE_FACTOR,
                      lmm={"formula": "value ~ algorithm + (1|prompt)"})
    (tmp_path / "a" / "reports").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a")
    run_study(spec, Path("reports/study"), stages=stages, log=lambda s: None)
    n = len(fakes.generate_calls)
    out = tmp_path / "a" / "reports" / "study"
    sel = json.loads((out / "selection.json").read_text())
    paths = [c["path"] for c in sel["runs"] if c["path"]]
    assert paths and all(p.startswith("runs/") for p in paths)
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    run_study(spec, out, stages=stages, log=lambda s: None)
    assert len(fakes.generate_calls) == n  # every set reused, none "rendered from other inputs"
    assert all(Path(c["path"]).is_dir() for c in StudyLayout(Path("../a/reports/study")).matched("reward"))
    # an older selection.json: paths relative to the folder the study ran from
    (out / "selection.json").write_text(json.dumps(
        {**sel, "runs": [{**c, "path": c["path"] and f"reports/study/{c['path']}"} for c in sel["runs"]]}))
    view = StudyView.load(out)
    assert all(Path(c["path"]).is_dir() for c in view.selection["runs"] if c["path"])
    run_study(spec, out, stages=stages, log=lambda s: None)
    assert len(fakes.generate_calls) == n
    # a damaged image deleted, as the metrics error says: its set is rendered again (it was skipped as complete)
    next((out / "sets" / "base").glob("images/*/*.png")).unlink()
    run_study(spec, out, stages=stages, log=lambda s: None)
    assert fakes.generate_calls[n:] == [fakes.generate_calls[0]]


def test_a_set_json_with_other_sampler_settings_is_named(tmp_path):
    """Sets rendered before the study kept fingerprints: set.json's own settings still show a changed sampler."""
    import json

    from pcpo_eval.study.runner import stale_set_reason

    sdir = tmp_path / "set"
    sdir.mkdir()
    (sdir / "set.json").write_text(json.dumps({"settings": {"steps": 8, "cfg": 3, "eta": 1.0, "schedule": "ddim"}}))
    spec = {"steps": 8, "cfg": 3.0, "eta": 1.0, "sigma_schedule": "ddim"}
    assert stale_set_reason(sdir, spec, None, "x") == ""
    assert stale_set_reason(sdir, {**spec, "cfg": 5.0}, None, "x") == "rendered with cfg=3, the spec gives 5.0"
    assert stale_set_reason(sdir, spec, "y", "x").startswith("rendered from another checkpoint")


def test_metrics_are_remeasured_when_is_splits_changes(tmp_path, monkeypatch):
    """The metrics fingerprint held the metric names and the manifests only: a spec with another
    metric_options.is_splits kept every set's old Inception Score."""
    import pcpo_eval.metrics.workers
    from pcpo_eval.study.runner import run_study
    from tests.support.study import install_fakes

    fakes = install_fakes(monkeypatch)

    def run_metrics(image_set, metrics, out_dir, reference=None, options=None):  # the fakes have no IS: a stand-in
        res = fakes.run_metrics(image_set, metrics, out_dir, reference, options)  # records the request's fingerprint
        return {**res, "metrics": {**res["metrics"], "is_toy": 1.0 + 0.1 * options.is_splits}}

    monkeypatch.setattr(pcpo_eval.metrics.workers, "run_metrics", run_metrics)
    stages = ("train", "select", "generate", "metrics")
    kw = {"seeds": [0, 1], "design": ONE_FACTOR, "lmm": {"formula": "value ~ algorithm + (1|prompt)"},
          "metrics": ["fd_toy", "is_toy", "lpips_toy"], "overall_only": ["fd_toy", "is_toy"]}
    spec = write_spec(tmp_path / "s.yaml", **kw, metric_options={"is_splits": 10})
    run_study(spec, tmp_path / "study", stages=stages, log=lambda s: None)
    n = len(fakes.metrics_calls)
    run_study(spec, tmp_path / "study", stages=stages, log=lambda s: None)
    assert len(fakes.metrics_calls) == n
    write_spec(tmp_path / "s.yaml", **kw, metric_options={"is_splits": 4})
    run_study(spec, tmp_path / "study", stages=stages, log=lambda s: None)
    assert len(fakes.metrics_calls) == 2 * n  # every set's IS re-measured with 4 splits


def test_runs_trained_longer_than_the_spec_are_refused(tmp_path, monkeypatch):
    """Lowering epochs (24 -> 12) kept the 24-epoch runs as 'complete': selection, verdict and speed-ups were
    computed over 24 epochs under a spec that says 12. Raising it resumes them, as before."""
    from pcpo_eval.study.runner import StageError, run_study
    from tests.support.study import install_fakes

    fakes = install_fakes(monkeypatch)
    kw = {"seeds": [0, 1], "design": ONE_FACTOR, "lmm": {"formula": "value ~ algorithm + (1|prompt)"}}
    spec = write_spec(tmp_path / "s.yaml", **kw)  # train.overrides: epochs 12
    run_study(spec, tmp_path / "study", stages=("train",), log=lambda s: None)
    write_spec(tmp_path / "s.yaml", **kw, train={"overrides": {"epochs": 8, "checkpoint_every": 2}})
    with pytest.raises(StageError, match=r"run\(s\) trained for more epochs than the spec gives: "
                                         r"algorithm-DDPO__seed-0 \(12 > epochs 8\);.* Restore epochs in the spec"):
        run_study(spec, tmp_path / "study", stages=("train",), log=lambda s: None)
    n = len(fakes.train_calls)
    write_spec(tmp_path / "s.yaml", **kw, train={"overrides": {"epochs": 16, "checkpoint_every": 2}})
    run_study(spec, tmp_path / "study", stages=("train",), log=lambda s: None)
    assert len(fakes.train_calls) == n + 4 and all(resume for _, resume in fakes.train_calls[n:])


def _prompt_runs(tmp: Path, rel: str, algs: tuple[str, ...] = ("DDPO", "PCPO")) -> list[dict]:
    """Existing runs of ``algs`` trained with ``prompts: rel`` (a path relative to the working directory)."""
    return _existing(tmp, {(a, s): _cfg(a, s, prompts=rel) for a in algs for s in (0, 1)})


def test_one_prompt_file_named_by_two_path_strings_is_one_setting(tmp_path, monkeypatch):
    """A run trained by hand records ``prompts: train/prompts/x.txt`` as typed; the study's own runs (or
    another existing run) name the same file by its absolute path. Refused as "differ in prompts"."""
    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "train" / "prompts" / "x.txt"
    prompts.parent.mkdir(parents=True)
    prompts.write_text("red circle\nblue square\n")
    runs = _prompt_runs(tmp_path, "train/prompts/x.txt", ("DDPO",))  # trained before inputs.json: text only
    spec = write_spec(tmp_path / "s.yaml", runs=runs, seeds=[0, 1], targets=[0.3], select_target=0.3,
                      design=ONE_FACTOR, lmm={"formula": "value ~ algorithm + (1|prompt)"},
                      train={"overrides": {"epochs": 12, "checkpoint_every": 2, "model": "toy", "sample_steps": 8,
                                           "reward": "toy_aesthetic", "learning_rate": 5e-5,
                                           "prompts": str(prompts)}})
    assert len(load_spec(spec, check_weights=False).runs) == 4
    for rd in ("run_PCPO_0", "run_PCPO_1"):  # existing runs on both sides: ./relative vs absolute
        cfg = _cfg("PCPO", int(rd[-1]), prompts="./train/prompts/x.txt")
        write_run(tmp_path / rd, 8, 0.08, 2, config=cfg, rng_key=rd)
    runs += [{"levels": {"algorithm": "PCPO"}, "seed": s, "run_dir": str(tmp_path / f"run_PCPO_{s}")} for s in (0, 1)]
    assert len(load_spec(_spec(tmp_path, runs), check_weights=False).runs) == 4
    # a model folder named two ways is one model too
    (tmp_path / "models" / "toy1").mkdir(parents=True)
    for i, r in enumerate(runs):
        cfg = yaml.safe_load((Path(r["run_dir"]) / "config.yaml").read_text())
        cfg["model"] = "toy:models/toy1" if i % 2 else f"toy:{tmp_path / 'models' / 'toy1'}"
        (Path(r["run_dir"]) / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert len(load_spec(_spec(tmp_path, runs), check_weights=False).runs) == 4


def test_one_path_string_that_held_other_prompts_is_refused(tmp_path, monkeypatch):
    """Both runs' config.yaml say ``prompts: train/prompts/x.txt``, but the file was edited between the two
    trainings: their inputs.json digests differ, and the verdict would credit other prompts to the algorithm."""
    import json

    from pcpo_eval.io import sha256_file

    def write_inputs(rd, path: Path, text: str) -> None:  # RUN/inputs.json as the trainer writes it at the start
        entry = {"value": text, "resolved": str(path.resolve()), "sha256": sha256_file(path)}
        (Path(rd) / "inputs.json").write_text(json.dumps({"prompts": entry}))

    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "train" / "prompts" / "x.txt"
    prompts.parent.mkdir(parents=True)
    runs = _prompt_runs(tmp_path, "train/prompts/x.txt")
    for r in runs:  # as the trainer records it when each run starts; PCPO's were trained after the edit
        prompts.write_text("red circle\nblue square\n" if "DDPO" in r["run_dir"] else "red circle\nred circle\n")
        write_inputs(r["run_dir"], prompts, "train/prompts/x.txt")
    with pytest.raises(UserError) as ei:
        load_spec(_spec(tmp_path, runs), check_weights=False)
    msg = str(ei.value)
    assert ("in cell all, the runs differ in prompts (DDPO 'train/prompts/x.txt' (sha256 " in msg
            and "(one path, other contents: the file changed between the trainings, or they ran on other machines), "
                "which no level of algorithm sets" in msg and "has 1 problem(s)" in msg)
    prompts.write_text("red circle\nblue square\n")  # the same contents under another path (another machine)
    other = tmp_path / "elsewhere.txt"
    other.write_text("red circle\nblue square\n")
    for r in runs:
        write_inputs(r["run_dir"], prompts, "train/prompts/x.txt")
    (Path(runs[3]["run_dir"]) / "config.yaml").write_text(yaml.safe_dump(_cfg("PCPO", 1, prompts=str(other))))
    write_inputs(runs[3]["run_dir"], other, str(other))
    assert len(load_spec(_spec(tmp_path, runs), check_weights=False).runs) == 4
    # the study's own runs read the file as it is now: a run recorded with other contents is refused
    spec = write_spec(tmp_path / "s.yaml", runs=runs[:2], seeds=[0, 1], targets=[0.3], select_target=0.3,
                      design=ONE_FACTOR, lmm={"formula": "value ~ algorithm + (1|prompt)"},
                      train={"overrides": {"epochs": 12, "checkpoint_every": 2, "model": "toy", "sample_steps": 8,
                                           "reward": "toy_aesthetic", "learning_rate": 5e-5,
                                           "prompts": str(prompts)}})
    load_spec(spec, check_weights=False)
    prompts.write_text("a green ring\n")
    with pytest.raises(UserError, match=r"the runs differ in prompts \(DDPO 'train/prompts/x.txt' \(sha256 \w{12}\); "
                                        r"PCPO '/.*x.txt' \(sha256 \w{12}\)\)"):
        load_spec(spec, check_weights=False)


def test_init_from_one_run_folder_at_two_epochs_is_refused(tmp_path):
    """``init_from: RUN`` starts from RUN's latest checkpoint: two runs naming one folder started from other
    weights when RUN trained on in between. Runs from before inputs.json give the digest in init_from.json."""
    import json

    runs = _existing(tmp_path, {(a, s): _cfg(a, s, init_from="/runs/pretrained") for a in ("DDPO", "PCPO")
                                for s in (0, 1)})
    for r in runs:
        sha = "a" * 64 if "DDPO" in r["run_dir"] else "b" * 64
        (Path(r["run_dir"]) / "init_from.json").write_text(json.dumps({"source": "/runs/pretrained",
                                                                       "weights_sha256": sha}))
    with pytest.raises(UserError, match=r"the runs differ in init_from \(DDPO '/runs/pretrained' \(sha256 a{12}\); "
                                        r"PCPO '/runs/pretrained' \(sha256 b{12}\)\) \(one path, other contents"):
        load_spec(_spec(tmp_path, runs), check_weights=False)


def test_runs_trained_on_more_processes_are_refused_by_their_logged_images(tmp_path):
    """Same config.yaml (batch sizes are per process), but the PCPO runs were launched on 2 processes: their
    epochs sampled twice the images, which only their logs' ``images`` column says (the trainer writes it)."""
    import pandas as pd

    from pcpo_eval.stats.comparability import IMAGES_LOGGED, epoch_budget

    assert epoch_budget({"sample_batch_size": 8, "sample_batches_per_epoch": 2, IMAGES_LOGGED: 32})["images"] == 32
    per = {"sample_batch_size": 8, "sample_batches_per_epoch": 2}
    configs = {(a, s): _cfg(a, s, **per) for a in ("DDPO", "PCPO") for s in (0, 1)}
    runs = _existing(tmp_path, configs)
    for r in runs:
        log_file = Path(r["run_dir"]) / "log.parquet"
        log = pd.read_parquet(log_file)
        n = 2 if r["levels"]["algorithm"] == "PCPO" else 1
        log["processes"], log["images"] = n, 16 * n
        log.to_parquet(log_file, index=False)
    with pytest.raises(UserError, match=r"the arms differ in images sampled per epoch \(PCPO 32, DDPO 16"):
        load_spec(_spec(tmp_path, runs), check_weights=False)
    for r in runs:  # logs from before the column: the configs agree, as before
        log_file = Path(r["run_dir"]) / "log.parquet"
        pd.read_parquet(log_file).drop(columns=["processes", "images"]).to_parquet(log_file, index=False)
    assert len(load_spec(_spec(tmp_path, runs), check_weights=False).runs) == 4


def test_a_prompt_file_edited_between_two_study_calls_is_refused_before_more_training(tmp_path):
    """The study trained PCPO seed 0, the prompt file was edited, then the study was called again: the runs it
    still had to train would read other prompts than the one it trained. Its inputs.json says what it read."""
    import json

    from pcpo_eval.io import sha256_file
    from pcpo_eval.study.spec import recorded_input_problems
    from pcpo_eval.studydir import StudyLayout

    prompts = tmp_path / "p.txt"
    prompts.write_text("red circle\nblue square\n")
    spec = load_spec(write_spec(tmp_path / "s.yaml", seeds=[0, 1], targets=[0.3], select_target=0.3, design=ONE_FACTOR,
                                lmm={"formula": "value ~ algorithm + (1|prompt)"},
                                train={"overrides": {"epochs": 12, "checkpoint_every": 2, "model": "toy",
                                                     "reward": "toy_aesthetic", "prompts": str(prompts)}}),
                     check_weights=False)
    layout = StudyLayout(tmp_path / "out")
    assert recorded_input_problems(spec, layout.run_dir) == []  # nothing trained yet: nothing recorded
    first = spec.runs[0]
    rd = layout.run_dir(first)
    rd.mkdir(parents=True)
    entry = {"value": str(prompts), "resolved": str(prompts.resolve()), "sha256": sha256_file(prompts)}
    (rd / "inputs.json").write_text(json.dumps({"prompts": entry}))
    assert recorded_input_problems(spec, layout.run_dir) == []  # same contents
    prompts.write_text("a green ring\n")
    [msg] = recorded_input_problems(spec, layout.run_dir)
    assert "the runs differ in prompts" in msg and "one path, other contents" in msg, msg
    assert msg.endswith("restore the file they read, or remove those runs to train them again")


def test_a_refused_rerun_keeps_the_record_of_the_spec_behind_the_results(tmp_path, monkeypatch):
    """A study re-run with changed settings that a stage refuses (changed training settings beside trained
    runs) had already replaced study.yaml and spec.resolved.json, so the folder no longer said which spec its
    results came from; and the message said to re-run the same command, which fails the same way. The changed
    spec is now recorded once a stage has run on it."""
    from pcpo_eval.study.runner import Study
    from pcpo_eval.studydir import StudyLayout

    old = load_spec(write_spec(tmp_path / "a.yaml", seeds=[0], targets=[0.3], design=ONE_FACTOR,
                               lmm={"formula": "value ~ algorithm + (1|prompt)"}), check_weights=False)
    new = load_spec(write_spec(tmp_path / "b.yaml", seeds=[0], targets=[0.4], design=ONE_FACTOR,
                               lmm={"formula": "value ~ algorithm + (1|prompt)"}), check_weights=False)
    layout = StudyLayout(tmp_path / "out")
    monkeypatch.setattr(Study, "stage_train", lambda self: None)
    Study(old, layout.out, log=lambda s: None).run(("train",))
    recorded = (layout.spec_file.read_bytes(), layout.spec_copy_file.read_bytes())

    def refuse(self):
        raise UserError("the runs were trained with other settings; restore them or choose another --out")

    monkeypatch.setattr(Study, "stage_train", refuse)
    with pytest.raises(UserError) as info:
        Study(new, layout.out, log=lambda s: None).run(("train",))
    assert "re-run the same command" not in str(info.value)
    assert (layout.spec_file.read_bytes(), layout.spec_copy_file.read_bytes()) == recorded
    monkeypatch.setattr(Study, "stage_train", lambda self: None)  # a stage that runs: the new spec is the record
    Study(new, layout.out, log=lambda s: None).run(("train",))
    assert layout.spec_file.read_bytes() != recorded[0]


def test_a_config_edited_after_training_is_refused(tmp_path, cli):
    """A PCPO run trained on a doubled reward and 2 updates, its config.yaml then edited to the baseline's: every
    check read the edit and passed. The checkpoints record the trained config; the study and speedup compare."""
    import json

    configs = {(a, s): _cfg(a, s) for a in ("DDPO", "PCPO") for s in (0, 1)}
    runs = _existing(tmp_path, configs)
    for r, ((alg, seed), cfg) in zip(runs, configs.items(), strict=True):
        trained = {**cfg, **({"reward": {"toy_aesthetic": 2.0}, "gradient_updates": 2} if (alg, seed) == ("PCPO", 0)
                             else {"gradient_updates": 1}), "epochs": 99, "device": "cuda"}  # a resume may change these
        for meta in sorted(Path(r["run_dir"]).glob("checkpoints/*/checkpoint.json")):
            meta.write_text(json.dumps({**json.loads(meta.read_text()), "config": trained}))
    with pytest.raises(UserError) as ei:
        load_spec(_spec(tmp_path, runs), check_weights=False)
    msg = str(ei.value)
    assert ("run algorithm-PCPO__seed-0: its config.yaml records reward: 'toy_aesthetic', but its checkpoints were "
            "trained with reward: {'toy_aesthetic': 2.0} (checkpoint.json): the file was edited after training") in msg
    assert "has 1 problem(s)" in msg  # gradient_updates is not in config.yaml: nothing to contradict; epochs may change
    res = cli("speedup", "--baseline", runs[0]["run_dir"], "--pcpo", runs[2]["run_dir"], "--target", "0.3")
    assert res.returncode == 2 and "the file was edited after training" in res.stderr
    (Path(runs[2]["run_dir"]) / "config.yaml").write_text(yaml.safe_dump({**configs[("PCPO", 0)],
                                                                           "reward": {"toy_aesthetic": 2.0}}))
    with pytest.raises(UserError, match="trained on different reward"):  # restored: now the honest refusal
        load_spec(_spec(tmp_path, runs), check_weights=False)


def test_equal_curves_under_other_settings_are_two_runs(tmp_path):
    """Weight averaging (``ema_decay``) changes the checkpoints, not the training curves: a study's two arms
    trained with and without it were refused as "one run copied or imported twice" when listed under
    ``runs:`` (a review). Other recorded settings make two runs; a seed label alone does not."""
    import shutil

    configs = {(a, s): {"model": "toy", "seed": s} for a in ("DDPO", "PCPO") for s in (0, 1)}
    runs = _existing(tmp_path, configs)
    for s in (0, 1):
        dst = Path(runs[2 + s]["run_dir"])
        shutil.rmtree(dst)
        shutil.copytree(runs[s]["run_dir"], dst)  # PCPO seed s: DDPO seed s's curves ...
        (dst / "config.yaml").write_text(f"model: toy\nseed: {s}\nema_decay: 0.9\n")  # ... with averaged weights
    from pcpo_eval.study.spec import RunSpec, _check_identical_runs

    specs = [RunSpec(f"{r['levels']['algorithm']}-{r['seed']}", r["levels"], {}, r["seed"], run_dir=r["run_dir"])
             for r in runs]
    problems: list[str] = []
    _check_identical_runs(specs, "algorithm", problems)
    assert not problems, problems
    for edited in ("model: toy\nseed: 0\n", "model: toy\nseed: 0\nobjective: pcpo\n"):  # a copy, edited or not
        (Path(runs[2]["run_dir"]) / "config.yaml").write_text(edited)
        problems = []
        _check_identical_runs(specs, "algorithm", problems)
        assert len(problems) == 1 and "DDPO-0" in problems[0] and "same training curves" in problems[0], edited
