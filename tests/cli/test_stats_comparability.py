"""The standalone ``speedup`` and ``select --matched-to`` check what a study checks before it compares runs
(:mod:`pcpo_eval.stats.comparability`): one reward, one epoch size, and they name what they could not check.
Before, both compared two sets of DDPO runs, one on a doubled reward (+63%, p 0.026) or at twice the images
per epoch (+63%, p 0.004), without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import rejected
from tests.support.study import write_run

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

BASE = {"model": "toy", "objective": "ppo_clip", "reward": "toy_aesthetic", "sample_batch_size": 4,
        "sample_batches_per_epoch": 2, "gradient_updates": 2, "num_inner_epochs": 1, "learning_rate": 3e-4,
        "sample_steps": 8, "sample_eta": 1.0, "cfg": 5.0, "prompts": "toy", "lora_rank": 4, "clip_range": 1e-4,
        "beta_kl": 0.0, "train_batch_size": 2, "timestep_fraction": 1.0}


def _runs(box: Path, pcpo: dict) -> tuple[list[str], list[str]]:
    b, t = [], []
    for s in range(3):
        write_run(box / f"b{s}", 12, 0.05, 4, rng_key=f"b{s}", config={**BASE, "seed": s})
        write_run(box / f"t{s}", 12, 0.05, 4, rng_key=f"t{s}", config={**BASE, "seed": s, "objective": "pcpo", **pcpo})
        b.append(str(box / f"b{s}"))
        t.append(str(box / f"t{s}"))
    return b, t


def _speedup(b: list[str], t: list[str], *extra: str) -> list[str]:
    return ["speedup", *(a for x in b for a in ("--baseline", x)), *(a for x in t for a in ("--pcpo", x)),
            "--target", "0.3", "--curve", "gain", "--paired", *extra]


def test_two_rewards_are_refused_by_speedup_and_select(cli, box):
    b, t = _runs(box, {"reward": {"toy_aesthetic": 2.0}})
    rejected(cli, box, *_speedup(b, t), needles=["the runs are trained on different reward (baseline 'toy_aesthetic'; "
                                                 "PCPO {'toy_aesthetic': 2.0})", "compare runs trained on one reward"])
    rejected(cli, box, "select", *b, "--target", "0.2", "--on", "gain", "--matched-to", t[0],
             needles=["trained on different reward", "the runs and --matched-to"])


def test_another_epoch_size_is_refused_or_said(cli, box):
    b, t = _runs(box, {"sample_batches_per_epoch": 4})
    rejected(cli, box, *_speedup(b, t), needles=["the arms differ in images sampled per epoch (PCPO 16, baseline 8",
                                                 "--unequal-epochs-ok"])
    res = cli(*_speedup(b, t, "--unequal-epochs-ok", "--json"))
    assert res.returncode == 0, res.stderr
    notes = json.loads(res.stdout)["notes"]
    assert any(n.startswith("the arms differ in images sampled per epoch (PCPO 16, baseline 8") and
               "may be the extra samples or compute" in n for n in notes), notes


def test_what_could_not_be_checked_is_said(cli, box):
    b, t = _runs(box, {})
    res = cli(*_speedup(b, t, "--json"))
    assert res.returncode == 0, res.stderr
    assert not json.loads(res.stdout)["notes"]  # full configs, one reward and epoch size: nothing to say
    for s in range(3):  # an imported run records its model, objective and reward only
        (Path(t[s]) / "config.yaml").write_text("model: toy\nobjective: pcpo\nreward: toy_aesthetic\n")
    res = cli(*_speedup(b, [str(Path(x) / "log.parquet") for x in t[:2]] + [t[2]], "--json"))
    assert res.returncode == 0, res.stderr
    (note,) = json.loads(res.stdout)["notes"]
    assert note.startswith("settings not checked: 1 run(s) (") and "record no images sampled per epoch" in note
    assert "2 log(s) (" in note and "come without their run folder's config.yaml" in note


def test_speedup_output_records_the_direction_and_level(cli, box):
    """``--lower-is-better`` changed every number but neither the JSON nor the table said so."""
    b, t = _runs(box, {})
    for flag, higher in (([], True), (["--lower-is-better"], False)):
        args = _speedup(b, t, "--json", *flag)
        if flag:
            args[args.index("0.3")] = "-0.3"  # a gain target below 0 when lower is better
        res = cli(*args)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["higher_is_better"] is higher and out["alpha"] == 0.05
        table = cli(*[a for a in args if a != "--json"]).stdout
        assert f"({'higher' if higher else 'lower'} is better; alpha 0.05)" in table


def _table(path: Path, runs_per_arm: int, disjoint_prompts: bool = False, run_column: str | None = "run") -> Path:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(1)
    rows = [{"algorithm": arm, **({run_column: f"{arm}_s{r}"} if run_column else {}),
             "prompt": f"p{p + (30 if disjoint_prompts and arm == 'PCPO' else 0)}", "lpips": rng.normal()}
            for arm in ("DDPO", "PCPO") for r in range(runs_per_arm) for p in range(30)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


NO_RUN_GROUP = "no --group is nested in algorithm (a run or seed column, each value in one level of algorithm)"


@pytest.mark.parametrize(("runs", "groups", "disjoint", "column", "needle"), [
    (3, ["prompt"], False, "run", "the table's run column is nested in algorithm (each run in one level) but is not "
                                  "a --group: the rows of one run are not independent replicates"),
    (1, ["prompt", "run"], False, "run", "--group run has one level in algorithm DDPO: the algorithm effect is "
                                         "confounded with run"),
    (3, ["prompt", "run"], True, "run", "no prompt is shared between the levels of algorithm"),
    (1, ["prompt"], False, None, NO_RUN_GROUP),  # two per_prompt.parquet files joined: no run column at all
    (3, ["prompt"], False, "seed", NO_RUN_GROUP),  # the runs in a column of another name, not grouped
    (3, ["prompt", "run"], False, "run", None),
    (3, ["prompt", "seed"], False, "seed", None),
], ids=["run-not-grouped", "one-run-per-arm", "disjoint-prompts", "no-run-column", "seed-not-grouped", "sound",
        "sound-seed"])
def test_lmm_says_when_its_test_is_not_across_replicates(cli, box, runs, groups, disjoint, column, needle):
    """A/A tables of 30 prompts (benchmarks/bench_lmm_replication.py): with the runs left out of the groups,
    p < 0.05 in 68 of 100 (three runs per arm, column run or seed), 90 of 100 with one run per arm and no run
    column; the study adds (1|run) and refuses one run per arm. The command says so for each shape."""
    data = _table(box / "t.csv", runs, disjoint, column)
    res = cli("lmm", data, "--formula", "lpips ~ algorithm", *(a for g in groups for a in ("--group", g)))
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stdout.splitlines() if line.startswith("warning: ")]
    # pure noise: the run variance may be estimated at 0, which has its own warning (test_boundary.py)
    warned = [w for w in said if "is estimated at 0" not in w]
    assert (warned == []) if needle is None else any(needle in w for w in warned), warned
    assert len(warned) <= 1 or needle != NO_RUN_GROUP  # said once, not beside the run column's own warning
    js = json.loads(cli("lmm", data, "--formula", "lpips ~ algorithm", "--json",
                        *(a for g in groups for a in ("--group", g))).stdout)
    assert [f"warning: {w}" for w in js["warnings"]] == said


def test_lmm_on_a_factor_crossed_with_the_runs(cli, box):
    """Runs scored at two epochs (a within-run factor): the run is crossed with the factor, not nested. With a
    random slope the factor is tested against the runs: no warning. Without one, each run x epoch cell's own
    effect is left in the residual and its 20 rows count as replicates: warned, with the slope as the fix
    (before: no warning either way). The runs left out entirely keep their own warning."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(2)
    rows = [dict(run=f"r{r}", epoch=f"e{e}", prompt=f"p{p}", value=rng.normal() + 0.1 * e)
            for r in range(6) for e in (0, 1) for p in range(20)]
    pd.DataFrame(rows).to_csv(box / "e.csv", index=False)

    def warned(*args: str) -> list[str]:
        res = cli("lmm", box / "e.csv", "--formula", "value ~ epoch", *args)
        assert res.returncode == 0, res.stderr
        return [line for line in res.stdout.splitlines() if line.startswith("warning: ") and "estimated at 0" not in line]

    assert not warned("--group", "run", "--re-formula", "~epoch")
    for groups in (["run"], ["run", "prompt"]):
        (w,) = warned(*(a for g in groups for a in ("--group", g)))
        assert "--group run is crossed with epoch" in w and "each run x epoch cell holds 20 rows" in w
        assert ('--re-formula "~epoch"' in w) == (len(groups) == 1)  # slopes take one group only
    assert NO_RUN_GROUP.replace("algorithm", "epoch") in warned("--group", "prompt")[0]  # the runs left out


def test_lmm_on_a_seed_column_both_arms_share(cli, box):
    """Three runs per arm, their seed labels 0-2 shared by the arms, each run with its own effect: grouped by
    the shared seed (crossed with the arms) the runs' effects were left in the residual with no warning (a
    review: p 0.0051 where the runs grouped gave 0.234). Now warned. A seed column unique per run is the run
    grouping under another name: no warning that the run column is ungrouped (a false alarm before)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(5)
    rows = []
    for arm in ("DDPO", "PCPO"):
        for s in range(3):
            run_effect = rng.normal(0, 0.5)
            rows += [{"algorithm": arm, "run": f"{arm}{s}", "shared_seed": s, "own_seed": f"{arm}-{s}",
                      "prompt": f"p{p}", "lpips": run_effect + rng.normal(0, 0.2)} for p in range(12)]
    pd.DataFrame(rows).to_csv(box / "s.csv", index=False)
    pd.DataFrame(rows).drop(columns="run").to_csv(box / "no_run.csv", index=False)  # two per-prompt tables joined

    def lmm(*groups: str, table: str = "s.csv") -> dict:
        res = cli("lmm", box / table, "--formula", "lpips ~ algorithm", "--json",
                  *(a for g in groups for a in ("--group", g)))
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    crossed, by_run, same = lmm("prompt", "shared_seed", table="no_run.csv"), lmm("prompt", "run"), lmm("prompt", "own_seed")
    assert any("--group shared_seed is crossed with algorithm" in w for w in crossed["warnings"])
    assert crossed["fixed"]["algorithm[T.PCPO]"]["df"] > 3 * by_run["fixed"]["algorithm[T.PCPO]"]["df"]
    assert not [w for w in by_run["warnings"] + same["warnings"] if "estimated at 0" not in w]
    assert same["fixed"]["algorithm[T.PCPO]"]["p"] == pytest.approx(by_run["fixed"]["algorithm[T.PCPO]"]["p"], rel=1e-6)


def test_speedup_reads_each_log_once(box, monkeypatch):
    """Each given log is read once for every check and the table (before: up to four times: the finite check,
    the duplicate check, the images per epoch, the table); the result is the library's on the same logs."""
    import pandas as pd
    from typer.testing import CliRunner

    from pcpo_eval.cli import app
    from pcpo_eval.stats.speedup import speedup_table

    b, t = _runs(box, {})
    reads: list[str] = []
    real = pd.read_parquet

    def counting(path, *a, **k):
        reads.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(pd, "read_parquet", counting)
    res = CliRunner().invoke(app, [*_speedup(b, t, "--json")])
    assert res.exit_code == 0, res.output
    logs = [r for r in reads if r.endswith("log.parquet")]
    assert sorted(logs) == sorted(str(Path(x) / "log.parquet") for x in (*b, *t)), reads
    monkeypatch.setattr(pd, "read_parquet", real)
    out = json.loads(res.output)
    lib = speedup_table(b, t, [0.3], paired=True, curve="gain").to_dict()
    assert out["baseline_runs"] == b and out["pcpo_runs"] == t  # named by the paths given, as before
    assert [r["estimate"] for r in out["targets"]] == [r["estimate"] for r in lib["targets"]]


def test_lmm_refuses_a_factor_with_one_level(cli, box):
    """A table holding one level of the compared factor was fitted as intercept only, exit 0, no word (a review)."""
    data = _table(box / "t.csv", 3)
    import pandas as pd

    pd.read_csv(data).query("algorithm == 'DDPO'").to_csv(box / "one.csv", index=False)
    res = cli("lmm", box / "one.csv", "--formula", "lpips ~ algorithm", "--group", "prompt", "--group", "run")
    assert res.returncode == 2 and "column 'algorithm' of the formula has one value (DDPO) in every row" in res.stderr
    # the library keeps fitting it: a study may declare a factor of one level (batch: [256]) beside the compared
    # one, and its algorithm test must survive (the check first sat in build_design and failed every metric)
    from pcpo_eval.stats import fit_lmm

    both = pd.read_csv(data).assign(batch="256")
    fit = fit_lmm(both, "lpips ~ algorithm * batch", ["prompt", "run"], diagnostics=False)
    assert "algorithm[T.PCPO]" in {fe.term for fe in fit.fixed}


def test_lmm_warns_of_a_metric_undefined_per_prompt(cli, box):
    """``metrics`` writes per-prompt FD and IS at any images per prompt; the study refuses them where undefined
    (4 images in 128-d), ``lmm --response fd_toy`` fitted them without a word (a review)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(3)
    rows = [{"algorithm": a, "run": f"{a}{r}", "prompt": f"p{p}", "n_images": 4, "fd_toy": rng.gamma(2.0),
             "lpips_toy": rng.normal()} for a in ("DDPO", "PCPO") for r in range(3) for p in range(10)]
    pd.DataFrame(rows).to_csv(box / "pp.csv", index=False)
    res = cli("lmm", box / "pp.csv", "--formula", "y ~ algorithm", "--group", "prompt", "--group", "run", "--json",
              "--response", "lpips_toy", "--response", "fd_toy")
    assert res.returncode == 0, res.stderr
    said = [w for w in json.loads(res.stdout)["warnings"] if "per prompt at 4 images per prompt" in w]
    assert len(said) == 1 and said[0].startswith("fd_toy per prompt at 4 images per prompt: ") and "degenerate" in said[0]
