"""Runs given by hand are paired and checked as a study pairs and checks its own
(:mod:`pcpo_eval.stats.given_runs`), by ``pcpo-eval speedup`` and by :func:`pcpo_eval.speedup` alike.

Found by a consistency review: on the demo's six run folders ``speedup --curve gain --target 0.03``
was unpaired by default and printed "-29% (95% CI -46% to -0.2%), p 0.049" where the study, pairing the
same runs by seed, said "-29% (-55% to +23%), p 0.109"; and the Python API compared a run with itself
(the command refused it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import pcpo_eval
from pcpo_eval.errors import UserError
from pcpo_eval.rundir import load_log
from pcpo_eval.stats.given_runs import choose_pairing, compare_given_runs
from tests.support.study import write_run

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CONFIG = {"model": "toy", "objective": "ppo_clip", "reward": "toy_aesthetic", "sample_batch_size": 4,
          "sample_batches_per_epoch": 2, "gradient_updates": 2, "num_inner_epochs": 1, "learning_rate": 3e-4,
          "sample_steps": 8, "sample_eta": 1.0, "cfg": 5.0, "prompts": "toy", "lora_rank": 4, "clip_range": 1e-4,
          "beta_kl": 0.0, "train_batch_size": 2, "timestep_fraction": 1.0}


def seed_curve(seed: int, rate: float):
    """A rising gain whose pace depends mostly on the training seed (shared by both arms of a pair)."""
    pace = 1.0 + 0.6 * seed

    def make(epochs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        e = np.arange(1, epochs + 1)
        control = 0.5 + 0.002 * rng.standard_normal(epochs)
        return control + rate * pace * e + 0.002 * rng.standard_normal(epochs), control

    return make


def _runs(box: Path, seeds_b=(0, 1, 2, 3), seeds_t=(0, 1, 2, 3)) -> tuple[list[str], list[str]]:
    b, t = [], []
    for s in seeds_b:
        write_run(box / f"b{s}", 16, 0.0, 4, curve=seed_curve(s, 0.010), rng_key=f"b{s}", config={**CONFIG, "seed": s})
        b.append(str(box / f"b{s}"))
    for s in seeds_t:
        write_run(box / f"t{s}", 16, 0.0, 4, curve=seed_curve(s, 0.012), rng_key=f"t{s}",
                  config={**CONFIG, "seed": s, "objective": "pcpo"})
        t.append(str(box / f"t{s}"))
    return b, t


def _speedup(b: list[str], t: list[str], *extra: str) -> list[str]:
    return ["speedup", *(a for x in b for a in ("--baseline", x)), *(a for x in t for a in ("--pcpo", x)),
            "--target", "0.05", "--curve", "gain", "--json", *extra]


def test_default_pairs_by_recorded_seed_as_the_study_does(cli, tmp_path):
    b, t = _runs(tmp_path)
    shuffled = [t[2], t[0], t[3], t[1]]  # given out of seed order: the default pairs by seed, not position
    auto = json.loads(cli(*_speedup(b, shuffled)).stdout)
    given = json.loads(cli(*_speedup(b, t, "--paired")).stdout)
    welch = json.loads(cli(*_speedup(b, t, "--unpaired")).stdout)
    row, prow, wrow = auto["targets"][0], given["targets"][0], welch["targets"][0]
    assert row["paired"] and not wrow["paired"]
    assert (row["estimate"], row["ci_low"], row["ci_high"], row["p"]) == (prow["estimate"], prow["ci_low"],
                                                                         prow["ci_high"], prow["p"])
    assert auto["pcpo_runs"] == t  # reordered into the baseline's seed order
    assert auto["pairing"].startswith("by the training seeds the run folders record (0, 1, 2, 3)")
    # the seed effect is shared by a pair, so pairing narrows the interval: the two tests differ
    assert (row["ci_high"] - row["ci_low"]) < (wrow["ci_high"] - wrow["ci_low"])
    assert welch["pairing"] == "as asked (--unpaired)"
    # the same runs, given out of order with --paired, are refused (their recorded seeds differ)
    res = cli(*_speedup(b, shuffled, "--paired"))
    assert res.returncode == 2 and "--paired pair 1" in res.stderr and "same seed order" in res.stderr


def test_the_printed_table_says_how_runs_were_paired(cli, tmp_path):
    b, t = _runs(tmp_path)
    out = cli(*_speedup(b, t)[:-1]).stdout  # markdown
    assert "paired (each pair one training seed): by the training seeds the run folders record (0, 1, 2, 3)" in out


def test_unshared_seeds_are_left_out_and_named(tmp_path):
    b, t = _runs(tmp_path, seeds_b=(0, 1, 2, 3), seeds_t=(1, 2, 3, 4))
    kb, kt, paired, how = choose_pairing(b, t, None)
    assert paired and [Path(x).name for x in kb] == ["b1", "b2", "b3"] and [Path(x).name for x in kt] == ["t1", "t2", "t3"]
    assert "left out, their seed not trained by the other arm" in how and b[0] in how and t[3] in how


@pytest.mark.parametrize("case", ["log_files", "one_seed_shared", "seed_twice"])
def test_unpaired_when_seeds_do_not_pair_and_says_why(tmp_path, case):
    if case == "log_files":
        b, t = _runs(tmp_path)
        b, t = [str(Path(x) / "log.parquet") for x in b], [str(Path(x) / "log.parquet") for x in t]
        why = "records no training seed"
    elif case == "one_seed_shared":
        b, t = _runs(tmp_path, seeds_b=(0, 1, 2), seeds_t=(2, 3, 4))
        why = "share fewer than 2 training seeds"
    else:
        b, t = _runs(tmp_path)
        cfg = Path(t[1]) / "config.yaml"
        cfg.write_text(cfg.read_text().replace("seed: 1", "seed: 0"))
        (Path(t[1]) / "config.yaml").touch()
        why = "two PCPO runs record one training seed"
    _, _, paired, how = choose_pairing(b, t, None)
    assert not paired and why in how


def test_api_checks_what_the_command_checks(tmp_path):
    b, t = _runs(tmp_path)
    with pytest.raises(UserError, match="is the run of --baseline .* again"):
        pcpo_eval.speedup(b, [b[0], *t[1:]], [0.05], curve="gain")
    with pytest.raises(UserError, match="same curves as"):  # a log read twice into two DataFrames
        pcpo_eval.speedup([load_log(b[0]), load_log(b[0])], [load_log(x) for x in t], [0.05], curve="gain")
    api = pcpo_eval.speedup(b, t, [0.05], curve="gain").to_dict()
    lib = compare_given_runs(b, t, [0.05], 5, curve="gain").to_dict()
    assert api == lib and api["targets"][0]["paired"]
    frames = pcpo_eval.speedup([load_log(x) for x in b], [load_log(x) for x in t], [0.05], curve="gain").to_dict()
    assert not frames["targets"][0]["paired"] and "records no training seed" in frames["pairing"]


def test_named_runs_are_checked_by_what_they_name(tmp_path):
    """``(name, log)`` pairs (a review): one name in both arms (runs named by seed) made the PCPO log replace the
    baseline's and the pair was refused as a copy; ``(name, path)`` skipped every run-folder check and said the
    folder recorded no seed."""
    b, t = _runs(tmp_path)
    by_seed = pcpo_eval.speedup([(f"seed{i}", load_log(x)) for i, x in enumerate(b)],
                                [(f"seed{i}", load_log(x)) for i, x in enumerate(t)], [0.05], curve="gain").to_dict()
    assert by_seed["baseline_runs"][0] == "baseline seed0" and by_seed["pcpo_runs"][0] == "PCPO seed0"
    named = pcpo_eval.speedup([(f"b{i}", x) for i, x in enumerate(b)], [(f"t{i}", x) for i, x in enumerate(t)],
                              [0.05], curve="gain").to_dict()
    plain = pcpo_eval.speedup(b, t, [0.05], curve="gain").to_dict()
    assert named["targets"][0]["paired"] and named["targets"][0]["p"] == plain["targets"][0]["p"]
    assert named["pairing"].startswith("by the training seeds the run folders record")
    cfg = Path(t[0]) / "config.yaml"
    cfg.write_text(cfg.read_text().replace("reward: toy_aesthetic", "reward: jpeg_compressibility"))
    with pytest.raises(UserError, match="trained on different reward"):
        pcpo_eval.speedup([(f"b{i}", x) for i, x in enumerate(b)], [(f"t{i}", x) for i, x in enumerate(t)], [0.05],
                          curve="gain")
