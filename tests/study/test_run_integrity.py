"""Input integrity of a study: runs, image sets and metrics that are not what the spec says they are.

Each test feeds a study an input a user could plausibly give it by mistake and checks that the study
refuses it by name (or says so in the verdict) instead of printing a conclusion about the wrong thing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
    assert ("in cell all, the runs differ in reward (DDPO 'toy_aesthetic'; PCPO 'jpeg_compressibility'), which no "
            "level of algorithm sets: the verdict would credit that difference to algorithm") in msg
    assert "the runs differ in sample_steps (DDPO 8; PCPO 20)" in msg and "has 2 problem(s)" in msg
    # a difference the design declares is the comparison itself, and must hold within each arm
    design = {"algorithm": {"DDPO": {"objective": "ppo_clip", "sample_steps": 8, "reward": "toy_aesthetic"},
                            "PCPO": {"objective": "pcpo", "sample_steps": 20, "reward": "jpeg_compressibility"}}}
    load_spec(_spec(tmp_path, _existing(tmp_path, configs), design), check_weights=False)
    configs[("PCPO", 1)] = _cfg("PCPO", 1, reward="jpeg_compressibility", sample_steps="12")
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
    assert len(load_spec(_spec(tmp_path, _existing(tmp_path, configs)), check_weights=False).runs) == 4


def test_a_run_copied_into_both_arms_is_refused(tmp_path):
    """``cp -r`` of one run into the other arm's folder: two paths, one run (the path check cannot see it)."""
    import shutil

    configs = {(a, s): {"model": "toy", "seed": s} for a in ("DDPO", "PCPO") for s in (0, 1)}
    runs = _existing(tmp_path, configs)
    shutil.rmtree(runs[2]["run_dir"])
    shutil.copytree(runs[0]["run_dir"], runs[2]["run_dir"])  # DDPO seed 0 copied as PCPO seed 0
    with pytest.raises(UserError, match=r"runs algorithm-DDPO__seed-0 \(.*run_DDPO_0\) and algorithm-PCPO__seed-0 "
                                        r"\(.*run_PCPO_0\) have byte-identical training logs: one run copied"):
        load_spec(_spec(tmp_path, runs), check_weights=False)


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
    ck = Path(next(c["path"] for c in sel["runs"] if c["path"]))  # a selected checkpoint, retrained since
    meta = json.loads((ck / "checkpoint.json").read_text())
    (ck / "checkpoint.json").write_text(json.dumps({**meta, "weights_sha256": "another training"}))
    with pytest.raises(StageError, match=r"1 image set\(s\) .*: sets/algorithm-\w+__seed-\d/epoch_\d+ \(rendered from "
                                         r"another checkpoint \(a retrained run\?\)"):
        run_study(spec, out, stages=stages, log=lambda s: None)


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
