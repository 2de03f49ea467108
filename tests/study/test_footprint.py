"""``pcpo-eval study SPEC --plan`` prints the disk and GPU-hours a spec needs, from the spec alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pcpo_eval.models.registry import FAMILY_SIZES
from pcpo_eval.study.footprint import TRAIN_S_PER_IMAGE, footprint_lines
from pcpo_eval.study.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, **overrides) -> Path:
    data = yaml.safe_load((ROOT / "analysis" / "toy_study.yaml").read_text())
    data["train"]["overrides"].update(overrides)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_toy_plan_disk_counts_the_toy_model_and_kept_checkpoints(tmp_path, cli):
    text = "\n".join(footprint_lines(load_spec(ROOT / "analysis" / "toy_study.yaml", check_weights=False)))
    assert "6 runs x 12 kept of 12 saved (keep_checkpoints=0) x 4.0 MB weights (toy, full weights, 1,005,024" in text
    assert "8.0 MB optimizer state in each run's newest checkpoint only" in text
    assert "eval sets: 13 sets x 64 images" in text and "32 px PNG" in text
    assert "training: not measured for toy" in text and "generation: not measured for toy" in text
    res = cli("study", _spec(tmp_path, keep_checkpoints=20), "--plan", "--cv", "0.3")
    assert res.returncode == 0, res.stderr
    assert "disk written by the spec's 6 runs" in res.stdout and "GPU-hours (H200" in res.stdout


def test_sd1_plan_uses_the_measured_figures():
    """ddpo_aesthetic: SD-1.5 LoRA rank 4 (797,184 params), training from the measured s/image, generation at
    the measured steady-state img/s range."""
    sp = load_spec(ROOT / "analysis" / "ddpo_aesthetic.yaml", check_weights=False)
    text = "\n".join(footprint_lines(sp))
    assert "LoRA rank 4, 797,184 params" in text and "3.2 MB weights" in text
    c = next(r.train for r in sp.runs if r.train is not None)
    runs = [r.train for r in sp.runs if r.train is not None]
    want = sum(TRAIN_S_PER_IMAGE[("sd1", True, r.objective)] * ((r.paper_total_batch or r.samples_per_epoch) * r.epochs)
               for r in runs) / 3600
    assert f"training: {want:,.1f} GPU-hours" in text, text
    # measured with the weight-free JPEG reward: the aesthetic scorer's time is named as left out
    assert "scoring by aesthetic (the figures used a weight-free reward)" in text, text
    # one machine's pair: the plan's PCPO / DDPO cost ratio is the measured 21.07 / 20.25
    assert TRAIN_S_PER_IMAGE[("sd1", True, "pcpo")] / TRAIN_S_PER_IMAGE[("sd1", True, "ppo_clip")] == pytest.approx(1.041, abs=1e-3)
    assert "img/s" in text and "GPU-hours (SD-1.5, 512 px, 50 steps, CFG, bf16)" in text
    assert c.lora_rank == 4


def test_full_fine_tune_and_unmeasured_setups_say_not_measured():
    text = "\n".join(footprint_lines(load_spec(ROOT / "analysis" / "dancegrpo_hps.yaml", check_weights=False)))
    assert f"full weights, {FAMILY_SIZES['sd1'].params:,} params" in text and "3.4 GB weights" in text
    assert "6.9 GB optimizer state in each run's newest checkpoint only" in text
    assert "training: not measured for sd1 full fine-tune" in text


def test_deterministic_kernels_scale_the_training_estimate():
    import dataclasses

    from pcpo_eval.study.footprint import DETERMINISTIC_SLOWDOWN

    sp = load_spec(ROOT / "analysis" / "ddpo_aesthetic.yaml", check_weights=False)
    fast = [line for line in footprint_lines(sp) if "training:" in line][0]
    runs = [dataclasses.replace(r, train=dataclasses.replace(r.train, deterministic=True)) if r.train else r
            for r in sp.runs]
    slow = [line for line in footprint_lines(dataclasses.replace(sp, runs=runs)) if "training:" in line][0]
    hours = lambda line: float(line.split("training: ")[1].split(" GPU")[0].replace(",", ""))  # noqa: E731
    assert hours(slow) == pytest.approx(hours(fast) * DETERMINISTIC_SLOWDOWN, rel=1e-3)
