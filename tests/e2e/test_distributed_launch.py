"""Launchers: `accelerate launch` runs pcpo-eval's trainer as 2 gloo processes, and the Slurm
examples in docs/examples/ name commands, flags, configs and specs that exist.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pcpo_eval.study.spec import STAGES, load_spec
from pcpo_eval.train.config import load_config
from tests.support.train import TINY

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"


def test_accelerate_launch_runs_two_processes(tmp_path):
    accelerate = Path(sys.executable).with_name("accelerate")
    if not accelerate.exists():
        pytest.skip("accelerate's launcher is not installed in this environment")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "epochs": 1, "device": "cpu", "log_to": "none"}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_DISABLE_RICH": "1"}
    res = subprocess.run(
        [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29541",
         "-m", "pcpo_eval", "train", str(cfg), "--out", str(tmp_path / "run"), "--device", "cpu"],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 process(es)" in res.stdout, res.stdout
    per_process = TINY["sample_batch_size"] * TINY["sample_batches_per_epoch"]
    assert f"{2 * per_process} samples/epoch" in res.stdout  # both processes sampled
    log = pd.read_parquet(tmp_path / "run" / "log.parquet")
    assert len(log) == 1 and log["reward_mean"].notna().all()


def _script(name: str) -> tuple[dict[str, str], list[str]]:
    """The example's defaults (``X=${X:-default}``) and its pcpo_eval command line, defaults substituted."""
    text = (EXAMPLES / name).read_text()
    defaults = {k: v.strip('"') for k, v in re.findall(r'^(\w+)=\$\{\w+:-(.*)\}$', text, re.M)}
    joined = re.sub(r"\\\n\s*", " ", text)
    line = next(ln for ln in joined.splitlines() if ln.startswith("srun "))
    for k, v in defaults.items():
        line = line.replace(f'"${k}"', shlex.quote(v)).replace(f"${k}", v)
    return defaults, shlex.split(line)


def test_slurm_train_example_names_a_valid_launch_and_config():
    defaults, argv = _script("slurm_train.sbatch")
    assert argv[:2] == ["srun", "torchrun"]
    torchrun_help = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--help"],
                                   capture_output=True, text=True, timeout=120).stdout
    i = argv.index("-m")
    for flag in (a for a in argv[2:i] if a.startswith("--")):
        assert flag in torchrun_help, f"torchrun has no {flag}"
    assert argv[i + 1 : i + 3] == ["pcpo_eval", "train"]
    rest = argv[i + 3 :]
    config, overrides = rest[0], [a for a in rest if "=" in a and not a.startswith("--")]
    assert {"--out", "--device"} <= set(rest) and "--resume" not in rest  # $RESUME is empty on a first start
    cfg = load_config(ROOT / config, overrides)
    assert cfg.objective == "pcpo" and cfg.seed == 0 and (ROOT / config).is_file()
    text = (EXAMPLES / "slurm_train.sbatch").read_text()
    nodes = int(re.search(r"--nodes=(\d+)", text).group(1))
    world = nodes * int(argv[argv.index("--nproc_per_node") + 1])
    assert cfg.paper_total_batch > 0 and cfg.total_batch_problem(world) is None  # the paper's total, not 16x it
    assert defaults["RUN"].startswith("runs/")


def test_slurm_study_example_names_a_valid_spec_and_stages():
    defaults, argv = _script("slurm_study.sbatch")
    assert argv[:4] == ["srun", "python", "-m", "pcpo_eval"] and argv[4] == "study"
    spec = load_spec(ROOT / argv[5], check_weights=False)
    assert spec.name and argv[argv.index("--out") + 1] == defaults["OUT"]
    stages = argv[argv.index("--stages") + 1].split(",")
    assert set(stages) <= set(STAGES) and "train" not in stages  # the runs were trained by slurm_train.sbatch
