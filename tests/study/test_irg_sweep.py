"""IRG sweeps (``pcpo-eval irg-sweep``, paper Figs. IRG and multi-IRG) on the toy world.

lambda 0 renders the reference model's pixels (FD to its set exactly 0), lambda 1 the checkpoint's
own pixels, and FD grows as lambda moves away from 0; a re-run keeps what exists; every shipped
sweep file validates; bad sweep files are one error line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"prompts": "toy", "seeds": 2, "max_prompts": 4, "steps": 4, "cfg": 3.0, "eta": 1.0, "batch_size": 16}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A toy LoRA checkpoint whose weights differ from the base model (random LoRA B)."""
    from pcpo_eval.models.registry import load_model
    from pcpo_eval.train.checkpoints import save_checkpoint
    from pcpo_eval.train.config import load_config

    adapter = load_model("toy")
    adapter.add_lora(rank=2, alpha=2.0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in adapter.denoiser.named_parameters():
            if "lora_" in name:  # A and B from the seeded generator: add_lora's A comes from the global
                p.copy_(torch.randn(p.shape, generator=gen) * (0.05 if "lora_B" in name else 0.5))  # RNG (order-dependent)
    run = tmp_path_factory.mktemp("run") / "run"
    run.mkdir()
    cfg = load_config(ROOT / "train" / "configs" / "toy_pcpo.yaml", ["lora_rank=2", "lora_alpha=2"])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    ck = run / "checkpoints" / "epoch_0001"
    save_checkpoint(ck, adapter.denoiser, {"epoch": 1, "model": "toy"}, {"epoch": 1})
    return ck


def _image(set_dir: Path, i: int) -> np.ndarray:
    from pcpo_eval.generate.png import read_png_pixels

    m = pd.read_parquet(set_dir / "manifest.parquet").sort_values(["prompt_id", "seed"])
    return read_png_pixels(set_dir / m["path"].iloc[i]).astype(int)


def _pixels(set_dir: Path) -> list[str]:
    return pd.read_parquet(set_dir / "manifest.parquet").sort_values(["prompt_id", "seed"])["pixel_sha256"].tolist()


def test_sweep_interpolates_between_reference_and_checkpoint(checkpoint, tmp_path):
    from pcpo_eval.generate.runner import generate_set
    from pcpo_eval.study.irg_sweep import load_sweep, run_sweep

    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "t", "reference": "toy", "checkpoints": {"ck": str(checkpoint)},
                                         "lambdas": [[0.0], [1.0], [2.0]], "metrics": ["fd_toy"], **SMALL}))
    spec = load_sweep(spec_file)
    out = tmp_path / "out"
    table = run_sweep(spec, out, log=lambda s: None)
    assert list(table["lambda_ck"]) == [0.0, 1.0, 2.0]
    assert table["fd_toy"].iloc[0] == 0.0  # lambda 0 is the reference model: the same pixels
    assert 0 < table["fd_toy"].iloc[1] < table["fd_toy"].iloc[2]
    assert _pixels(out / "sets" / "point_00") == _pixels(out / "sets" / "reference")
    own = tmp_path / "own"
    generate_set(str(checkpoint), "toy", 2, own, batch_size=16, steps=4, cfg=3.0, eta=1.0, max_prompts=4,
                 progress=False)
    # lambda 1 is the checkpoint itself up to float rounding of eps_ref + 1 * (eps - eps_ref)
    diff = max(int(np.abs(_image(out / "sets" / "point_01", i) - _image(own, i)).max()) for i in range(8))
    assert diff <= 2, diff
    assert (out / "tradeoff.png").stat().st_size > 1000 and (out / "sweep.json").is_file()
    before = (out / "metrics" / "point_01" / "metrics.json").stat().st_mtime_ns
    again = run_sweep(spec, out, log=lambda s: None)  # resumes: sets and metrics are kept
    pd.testing.assert_frame_equal(again, table)
    assert (out / "metrics" / "point_01" / "metrics.json").stat().st_mtime_ns == before


def test_a_rerun_with_other_seeds_measures_the_sets_again(tmp_path):
    """The sets follow the sweep file (generate rewrites a point's manifest to the seeds asked for), so the
    metrics kept from the last run must follow too: not the old seeds' values beside the new sets."""
    from pcpo_eval.metrics.workers import compute_metrics
    from pcpo_eval.study.irg_sweep import load_sweep, run_sweep

    spec_file, out = tmp_path / "sweep.yaml", tmp_path / "out"
    first = {"name": "t", "reference": "toy", "checkpoints": {"ck": "toy"}, "lambdas": [[1.5]],
             "metrics": ["fd_toy", "lpips_toy"], **SMALL, "max_prompts": 2, "steps": 2, "seeds": 3}
    for seeds in (3, 2):
        spec_file.write_text(yaml.safe_dump({**first, "seeds": seeds}))
        table = run_sweep(load_sweep(spec_file), out, log=lambda s: None)
        fresh = compute_metrics(out / "sets" / "point_00", ["fd_toy", "lpips_toy"], out / "sets" / "reference")
        assert len(pd.read_parquet(out / "sets" / "point_00" / "manifest.parquet")) == 2 * seeds
        assert table["lpips_toy"].iloc[0] == pytest.approx(fresh.metrics["lpips_toy"], rel=1e-9)


def test_shipped_sweep_files_validate():
    from pcpo_eval.study.irg_sweep import load_sweep

    files = sorted((ROOT / "analysis" / "irg").glob("*.yaml"))
    assert len(files) >= 3
    for f in files:
        spec = load_sweep(f)
        assert all(len(w) == len(spec.checkpoints) for w in spec.lambdas)
    multi = load_sweep(ROOT / "analysis" / "irg" / "ddpo_multi_irg.yaml")
    assert all(sum(w) == pytest.approx(1.5) for w in multi.lambdas)  # paper: lambda_1 + lambda_2 = 1.5


@pytest.mark.parametrize(("change", "msg"), [
    ({"lambdas": [[0.5, 1.0]]}, "one number per checkpoint"),
    ({"metrics": ["nope"]}, "known metrics"),
    ({"colour": 1}, "unknown key 'colour'"),
    ({"lambdas": [[float("nan")]]}, "non-finite"),
    ({"steps": 0}, "steps 0"),
    # a checkpoint path with a typo: refused before the reference set renders (hours with real models)
    ({"checkpoints": {"pcpo": "runs/pcpo/checkpoints/epoch_0O24"}}, "checkpoints.pcpo: runs/pcpo/checkpoints"),
])
def test_bad_sweep_files_are_one_line(cli, tmp_path, change, msg):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"name": "t", "checkpoints": {"ck": "toy"}, "lambdas": [[1.0]],
                                 "metrics": ["fd_toy"], **change}))
    res = cli("irg-sweep", f, "--out", tmp_path / "o")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], lines
    assert not (tmp_path / "o").exists()
