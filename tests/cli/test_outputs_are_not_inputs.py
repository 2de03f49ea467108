"""The second CLI review's findings, each a test that failed before: an output path that is (or lies in) one of
the command's inputs is refused before anything is written; ``metrics --out`` keeps other folders' contents;
bad input found late is one ``error:`` line with exit 2 (no traceback) and changes nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest


def _digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` (or ``root`` itself) -> its SHA-256: what a refused command must leave."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _refused(res, *words: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), res
    assert all(w in lines[0] for w in words), lines[0]


@pytest.fixture
def runs(box) -> tuple[Path, Path]:
    from tests.support.study import write_run

    a, b = box / "run a", box / "run b"
    write_run(a, 12, 0.05, 4, rng_key="a")
    write_run(b, 12, 0.05, 4, rng_key="b")
    return a, b


def test_speedup_and_select_refuse_an_output_inside_a_run(cli, runs):
    a, b = runs
    before = _digest(a.parent)
    _refused(cli("speedup", "--baseline", a, "--pcpo", b, "--target", "0.3", "--output", a / "log.parquet"),
             "would overwrite", "an input of this command")
    _refused(cli("select", a, b, "--target", "0.3", "--output", b / "config.yaml"), "would overwrite")
    assert _digest(a.parent) == before
    assert cli("select", a, b, "--target", "0.3", "--output", a.parent / "sel.json").returncode == 0  # beside: fine


def test_select_window_below_one_is_one_error_line(cli, runs):
    _refused(cli("select", *runs, "--target", "0.3", "--window", "-1"), "window", "--window 5")


def test_lmm_refuses_its_data_as_output_and_a_qq_file_that_is_not_png(cli, box):
    data = box / "ok ü.csv"
    before = _digest(data)
    _refused(cli("lmm", data, "--formula", "y ~ x", "--group", "g", "--output", data), "would overwrite")
    _refused(cli("lmm", data, "--formula", "y ~ x", "--group", "g", "--qq", box / "qq.txt"), "--qq", ".png")
    assert _digest(data) == before and not (box / "qq.txt").exists()


def test_report_refuses_to_write_over_the_study_it_reads(cli, box):
    study = box / "study"
    study.mkdir()
    (study / "results.json").write_text("{}")
    (study / "runs").mkdir()
    (study / "runs" / "x.html").write_text("a run's file")
    _refused(cli("report", study, "-o", study / "results.json"), "would overwrite")
    _refused(cli("report", study, "-o", study / "runs" / "x.html"), "would overwrite")
    assert (study / "results.json").read_text() == "{}" and (study / "runs" / "x.html").read_text() == "a run's file"


def test_human_simulate_and_export_refuse_the_design_files(cli, box):
    from tests.support.human import make_human_dir

    lay = make_human_dir(box / "H", n_prompts=4, n_seeds=2, n_checks=2)
    before = _digest(lay.root)
    _refused(cli("human", "simulate", lay.root, "--output", lay.pairs), "would overwrite")
    _refused(cli("human", "simulate", lay.root, "--output", lay.responses), "would overwrite")
    _refused(cli("human", "export", lay.root, "--output", lay.design), "would overwrite")
    assert _digest(lay.root) == before


@pytest.fixture
def two_sets(box) -> tuple[Path, Path]:
    from tests.support.metrics import make_image_set

    prompts = {0: "a red circle", 1: "a blue square"}
    return make_image_set(box / "set a", prompts, [0, 1, 2]), make_image_set(box / "set b", prompts, [3, 4, 5])


def test_metrics_out_keeps_other_folders_and_other_sets_results(cli, box, two_sets):
    a, b = two_sets
    out = box / "m"
    assert cli("metrics", a, "--metrics", "lpips_toy", "--out", out).returncode == 0
    kept = _digest(out)
    _refused(cli("metrics", b, "--metrics", "lpips_toy", "--out", out), "metrics of another image set")
    assert _digest(out) == kept  # a's results, not replaced by b's
    assert cli("metrics", a, "--metrics", "lpips_toy", "--out", out).returncode == 0  # the same set: measured again
    mine = box / "notes"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    _refused(cli("metrics", a, "--metrics", "lpips_toy", "--out", mine), "holds other files", "notes.txt")
    images = a / "images"  # the set's own folder of PNGs
    set_before = _digest(a)
    _refused(cli("metrics", a, "--metrics", "lpips_toy", "--out", images), "would overwrite")
    # a new folder inside the set (or the reference) too: it was written beside the PNGs, exit 0
    _refused(cli("metrics", a, "--metrics", "lpips_toy", "--out", images / "p00000" / "m"), "lies inside the image set")
    _refused(cli("metrics", a, "--metrics", "fd_toy", "--reference", b, "--out", b / "m"), "lies inside the reference")
    assert _digest(a) == set_before and (mine / "notes.txt").read_text() == "mine"


def test_metrics_cache_inside_out_is_its_own(cli, box, two_sets):
    """``--out D --cache-dir D`` (or a cache folder inside D) run twice is a re-run, not a foreign folder."""
    a, _ = two_sets
    for out, cache in ((box / "d", box / "d"), (box / "e", box / "e" / "cache")):
        for _ in range(2):
            res = cli("metrics", a, "--metrics", "fd_toy", "--reference", a, "--out", out, "--cache-dir", cache)
            assert res.returncode == 0, res.stderr
        assert (out / "metrics.json").is_file()
    (box / "notes").mkdir()
    (box / "notes" / "notes.txt").write_text("mine")  # a cache elsewhere makes nothing in --out its own
    _refused(cli("metrics", a, "--metrics", "fd_toy", "--reference", a, "--out", box / "notes", "--cache-dir",
                 box / "d"), "holds other files", "notes.txt")


@pytest.mark.parametrize("damage", ["state", "log"])
def test_resume_from_a_corrupt_state_or_log_is_one_error_line(cli, box, toy_run, damage):
    import shutil

    from tests.support.cli import RESUME_OVERRIDES, TOY_CFG

    run = box / "run"
    shutil.copytree(toy_run, run)
    if damage == "state":
        (run / "checkpoints" / "epoch_0001" / "training_state.pt").write_text("garbage")
    else:
        (run / "log.parquet").write_text("x")
    before = _digest(run)
    res = cli("train", TOY_CFG, "--out", run, "--resume", *RESUME_OVERRIDES)
    _refused(res, "training_state.pt" if damage == "state" else "log.parquet")
    assert "or start the run again" in res.stderr or "restore log.parquet" in res.stderr
    assert _digest(run) == before


def test_a_key_given_twice_and_an_empty_config_are_refused(cli, box):
    from tests.support.cli import TOY_CFG

    _refused(cli("train", TOY_CFG, "--out", box / "r", "epochs=2", "epochs=3"), "override epochs is given twice")
    (box / "empty.yaml").write_text("")
    _refused(cli("train", box / "empty.yaml", "--out", box / "r"), "is empty", "train/configs/toy_ddpo.yaml")
    assert not (box / "r").exists()


def test_several_problems_are_still_one_error_line(cli, box):
    (box / "two.yaml").write_text("epochs: 0\nbogus_key: 1\nlearning_rate: -1\n")
    res = cli("train", box / "two.yaml", "--out", box / "r")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error:")


def test_generate_steps_beyond_the_model_is_refused_before_rendering(cli, box):
    """--steps past the model's 1000 training timesteps was found while rendering: progress lines, then an
    error that named no fix. Now before any folder or progress bar."""
    res = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--steps", "100000",
              "--out", box / "s")
    _refused(res, "--steps 100000", "use --steps <= 1000")
    assert not (box / "s").exists()


def test_select_refuses_a_run_given_twice(cli, runs):
    """One run given twice printed two rows for it (a review; ``speedup`` refused it already)."""
    a, b = runs
    _refused(cli("select", a, b, f"{a}/", "--target", "0.3"), f"run {a}/ is given twice (as {a} before)")
