"""Reliability issue 30, the remaining items: integrity as a property, import checks, stale temp files,
no stray set.json, study-stage exit codes, and the last stray tracebacks.

Each case runs the real CLI (the ``cli`` fixture) and, for bad input, checks the one ``error:`` line,
exit code 2 and an unchanged folder (sha256 of every file before/after: ``rejected`` of
tests/support/cli.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.support.cli import rejected, snapshot

GEN = ["--model", "toy", "--prompts", "toy", "--max-prompts", "2", "--seeds", "2", "--steps", "2", "--no-progress"]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


@pytest.fixture
def image_set(box) -> Path:
    from tests.support.metrics import make_image_set

    return make_image_set(box / "set ü", {0: "a red circle", 1: "a blue square"}, [0, 1, 2])


# ---- 1. a warm cache does not hide a corrupt or modified image ----------------------------------

@pytest.mark.parametrize("damage", ["truncate", "other-image", "delete"])
def test_warm_cache_does_not_hide_a_damaged_png(cli, box, image_set, damage):
    out = box / "feats.npy"
    assert cli("features", image_set, "--extractor", "toy", "-o", out).returncode == 0
    assert cli("metrics", image_set, "--metrics", "lpips_toy", "--out", box / "m").returncode == 0
    pngs = sorted((image_set / "images").rglob("*.png"))
    if damage == "truncate":
        _truncate(pngs[2])
        needles = ["does not match its image_sha256", pngs[2].name, "re-render"]
    elif damage == "other-image":
        pngs[2].write_bytes(pngs[3].read_bytes())  # decodes fine: only the hash tells
        needles = ["does not match its image_sha256", pngs[2].name]
    else:
        pngs[2].unlink()
        needles = ["cannot read image", pngs[2].name]
    # every feature and LPIPS value is cached: before, both commands succeeded without reading a PNG
    rejected(cli, box, "features", image_set, "--extractor", "toy", "-o", out, needles=needles)
    rejected(cli, box, "metrics", image_set, "--metrics", "lpips_toy", "--out", box / "m", needles=needles)


def test_generate_rerenders_a_file_whose_hash_does_not_match(cli, box):
    out = box / "set"
    assert cli("generate", *GEN, "--out", out).returncode == 0
    man = pd.read_parquet(out / "manifest.parquet")
    victim = out / man["path"].iloc[1]
    good = _sha(victim)
    others = {p: _sha(p) for p in (out / "images").rglob("*.png") if p != victim}
    _truncate(victim)
    assert cli("metrics", out, "--metrics", "lpips_toy", "--out", box / "m").returncode == 2
    res = cli("generate", *GEN, "--out", out)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "rendered 1, skipped 3" in res.stdout and "rendering it again" in res.stderr
    assert _sha(victim) == good  # the same bytes as first rendered (images are deterministic)
    assert {p: _sha(p) for p in others} == others
    assert pd.read_parquet(out / "manifest.parquet").equals(man)
    assert cli("metrics", out, "--metrics", "lpips_toy", "--out", box / "m").returncode == 0


# ---- 4. a generate error after rendering started leaves no stray set.json ----------------------

@pytest.mark.parametrize("existing", [False, True], ids=["new-out", "empty-out"])
def test_generate_error_mid_render_leaves_no_set_json(cli, box, monkeypatch, existing):
    import pcpo_eval.generate.runner as runner
    from pcpo_eval.errors import UserError

    def fail(*a, **k):
        raise UserError("simulated failure in the sampler")

    monkeypatch.setattr(runner, "render_latents", fail)
    out = box / "set"
    if existing:
        out.mkdir()
    rejected(cli, box, "generate", *GEN, "--out", out, needles=["simulated failure"])
    assert not (out / "set.json").exists()
    monkeypatch.undo()
    assert cli("generate", *GEN[:-3], "--steps", "3", "--no-progress", "--out", out).returncode == 0  # not tied


def test_generate_error_keeps_the_set_json_of_a_partial_set(cli, box, monkeypatch):
    import pcpo_eval.generate.runner as runner
    from pcpo_eval.errors import UserError

    out = box / "set"
    assert cli("generate", *GEN[:-5], "--seeds", "1", "--steps", "2", "--no-progress", "--out", out).returncode == 0
    (out / "manifest.parquet").unlink()  # a partly rendered set: images, no manifest yet
    (out / "set.json").write_text(json.dumps({**json.loads((out / "set.json").read_text()), "status": "rendering"}))
    calls = []

    def fail(*a, **k):
        calls.append(1)
        raise UserError("simulated failure in the sampler")

    monkeypatch.setattr(runner, "render_latents", fail)
    rejected(cli, box, "generate", *GEN, "--out", out, needles=["simulated failure"])
    assert calls and json.loads((out / "set.json").read_text())["status"] == "rendering"


def test_metrics_refuse_a_set_whose_resume_was_interrupted(cli, box, monkeypatch):
    """Extending a complete set keeps its old manifest until the run ends: killed in between, the folder
    must not pass for a finished set (metrics of the old images, as if they were the extended set)."""
    import pcpo_eval.generate.runner as runner
    from pcpo_eval.errors import UserError

    out, m = box / "set", box / "m"
    more = [*GEN[:-5], "--seeds", "3", *GEN[-3:]]  # the same set, one seed more
    assert cli("generate", *GEN, "--out", out).returncode == 0
    assert cli("metrics", out, "--metrics", "lpips_toy", "--out", m).returncode == 0

    def fail(*a, **k):
        raise UserError("simulated failure in the sampler")

    monkeypatch.setattr(runner, "render_latents", fail)
    res = cli("generate", *more, "--out", out)
    assert res.returncode == 2 and "simulated failure" in res.stderr
    assert json.loads((out / "set.json").read_text())["status"] == "rendering"
    rejected(cli, box, "metrics", out, "--metrics", "lpips_toy", "--out", m,
             needles=["unfinished image set", "status 'rendering'", "re-run that generate command"])
    monkeypatch.undo()
    assert cli("generate", *more, "--out", out).returncode == 0
    assert json.loads((out / "set.json").read_text())["status"] == "complete"
    res = cli("metrics", out, "--metrics", "lpips_toy", "--out", m, "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["settings"]["n_images"] == 6


# ---- 2. import refuses truncated weights, non-finite rewards, corrupt logs, unknown models ----

def _dance_run(root: Path, base: Path) -> Path:
    from diffusers import UNet2DConditionModel
    from safetensors.torch import save_file

    unet = UNet2DConditionModel.from_pretrained(base / "unet")
    ck = root / "dance" / "checkpoint_epoch_1"
    ck.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in unet.state_dict().items()}, ck / "diffusion_pytorch_model.safetensors")
    (root / "dance" / "reward.txt").write_text("0.31\n0.33\n0.36\n")
    return root / "dance"


@pytest.fixture(scope="module")
def sd1_base(tmp_path_factory):
    from pcpo_eval.testing import save_tiny_sd1

    return save_tiny_sd1(tmp_path_factory.mktemp("sd1") / "sd1", seed=0)


def test_import_dancegrpo_checks(cli, box, sd1_base):
    src = _dance_run(box, sd1_base)
    weights = src / "checkpoint_epoch_1" / "diffusion_pytorch_model.safetensors"
    out = box / "run"
    for model, needles in [
        ("nosuch:x", ["unknown --model 'nosuch:x'", "valid kinds"]),
        ("toy", ["fine-tunes sd1 or flux, not toy"]),
        ("sd3", ["fine-tunes sd1 or flux, not sd3"]),
        ("sd1", ["needs a location"]),
        (f"sd1:{box / 'no model'}", ["does not exist"]),
    ]:
        rejected(cli, box, "import", "dancegrpo", src, "--out", out, "--model", model, needles=needles)
    # a base model whose UNet differs from the checkpoint's (another tiny SD-1 layout)
    from safetensors.torch import load_file, save_file

    state = load_file(str(weights))
    key = next(iter(state))
    save_file({**state, key: state[key][..., :1].contiguous()}, weights)
    rejected(cli, box, "import", "dancegrpo", src, "--out", out, "--model", f"sd1:{sd1_base}",
             needles=["does not fit --model", key, "pass the base model"])
    _truncate(weights)
    rejected(cli, box, "import", "dancegrpo", src, "--out", out, "--model", f"sd1:{sd1_base}",
             needles=["is truncated or corrupt", "diffusion_pytorch_model.safetensors", "copy the reference run"])
    (src / "reward.txt").write_text("0.31\ninf\n0.36\n")
    rejected(cli, box, "import", "dancegrpo", src, "--out", out, "--model", f"sd1:{sd1_base}",
             needles=["non-finite"])


def _flow_history(box: Path, reward) -> Path:
    rows = [{"_step": 2 * e, "epoch": e, "reward_avg": r} for e, r in enumerate(reward)]
    path = box / "history.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("reward, needle", [
    ([0.1, float("inf"), 0.3], "non-finite or non-numeric"),
    ([0.1, float("-inf"), 0.3], "non-finite or non-numeric"),
    ([0.1, "abc", 0.3], "non-finite or non-numeric"),
], ids=["inf", "-inf", "text"])
def test_import_flowgrpo_refuses_bad_rewards(cli, box, reward, needle):
    src = box / "flow"
    (src / "checkpoints" / "checkpoint-2" / "lora").mkdir(parents=True)
    log = _flow_history(box, reward)
    rejected(cli, box, "import", "flowgrpo", src, "--out", box / "run", "--model", "sd3", "--log", log,
             needles=[needle, "reward_avg", "_step 2"])


@pytest.mark.parametrize("data", [b":W&B" + b"\x00\x01\x00" + b"\xff" * 40,
                                  b":W&B\x00\x01\x00" + bytes(7) + b"\x05\x00" + os.urandom(3),
                                  b"garbage"], ids=["bad-record", "short", "no-header"])
def test_import_refuses_corrupt_wandb_log(cli, box, data):
    pytest.importorskip("wandb")
    src = box / "flow"
    src.mkdir()
    (src / "run-abc.wandb").write_bytes(data)
    line = rejected(cli, box, "import", "flowgrpo", src, "--out", box / "run", "--model", "sd3",
                    needles=["run-abc.wandb"])
    assert "corrupt" in line or "not a W&B transaction log" in line or "no _step column" in line


# ---- 3. temp files of killed writers are removed by the next run --------------------------------

def test_stale_temp_files_are_removed_but_not_held_ones(cli, box):
    from pcpo_eval.io import atomic_dir

    out = box / "set"
    assert cli("generate", *GEN, "--out", out).returncode == 0
    sub = next((out / "images").iterdir())
    stale = [out / ".manifest.parquet.ab12cd34.tmp", sub / ".s0000000.png.x_9y8z7w.tmp",
             out / ".progress" / ".a-r000.parquet.qwertyui.tmp"]
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half a file")
    stale_dir = out / ".extra.zzzzzzzz.tmp"
    (stale_dir / "inner").mkdir(parents=True)
    keep = [out / ".notes", out / "my.tmp", out / ".a.tmp", sub / "README.txt"]  # not our pattern
    for p in keep:
        p.write_text("mine")
    held = out / ".set.json.hhhhhhhh.tmp"
    with open(held, "wb") as fh, atomic_dir(out / "writing") as live_dir:  # a live writer's file and folder
        fh.write(b"being written")
        res = cli("generate", *GEN, "--out", out)
        assert res.returncode == 0, res.stderr[-2000:]
        assert held.exists() and live_dir.exists()
    assert not any(p.exists() for p in [*stale, stale_dir])
    assert all(p.read_text() == "mine" for p in keep)


@pytest.mark.parametrize("command", ["train", "import", "metrics"])
def test_other_commands_remove_stale_temps(cli, box, image_set, command):
    from tests.support.cli import TOY_CFG

    folder = {"train": box / "run", "import": box / "run", "metrics": box / "m"}[command]
    (folder / "checkpoints").mkdir(parents=True)  # (a metrics folder holds only its files: removed below)
    stale = [folder / ".log.parquet.k3j4h5g6.tmp", folder / "checkpoints" / ".epoch_0001.a1b2c3d4.tmp"]
    if command == "metrics":  # its --out folder (not below it) and the set's feature cache (all of it)
        (folder / "checkpoints").rmdir()
        stale[1] = image_set / ".pcpo_cache" / "lpips" / "toy-0123" / ".prompt-1.json.a1b2c3d4.tmp"
        stale[1].parent.mkdir(parents=True)
    stale[0].write_bytes(b"x")
    stale[1].mkdir()
    if command == "train":
        cli("train", TOY_CFG, "--out", folder, "epochs=1", "sample_batch_size=4", "sample_batches_per_epoch=1",
            "train_batch_size=4", "gradient_updates=1", "sample_steps=2", "log_to=none")  # its own outcome aside
    elif command == "import":
        (box / "dance").mkdir()
        (box / "dance" / "reward.txt").write_text("0.1\n")
        cli("import", "dancegrpo", box / "dance", "--out", folder, "--model", "toy")  # refused later: no checkpoints
    else:
        cli("metrics", image_set, "--metrics", "lpips_toy", "--out", folder)
    assert not any(p.exists() for p in stale)


# ---- 5. study-stage failures caused by the input exit 2 ----------------------------------------

def test_study_stage_failure_from_input_exits_2(cli, box, monkeypatch):
    from tests.support.study import write_run, write_spec

    runs = []
    for arm in ("DDPO", "PCPO"):
        rd = box / f"run {arm}"
        write_run(rd, 8, 0.05, 2, rng_key=arm)
        runs.append({"levels": {"algorithm": arm}, "seed": 0, "run_dir": str(rd)})
    design = {"algorithm": {"DDPO": {"objective": "ppo_clip"}, "PCPO": {"objective": "pcpo"}}}
    spec = write_spec(box / "runs.yaml", design=design, runs=runs, seeds=[0], targets=[0.2], select_target=0.2,
                      lmm={"formula": "value ~ algorithm + (1|prompt)"})
    import pcpo_eval.study.runner as sr
    from pcpo_eval.errors import UserError

    def bad_input(self):  # what a stage finds wrong with its input (e.g. a checkpoint that no longer loads)
        raise UserError("checkpoint epoch_0004 of run DDPO is missing; re-train it")

    monkeypatch.setattr(sr.Study, "stage_select", bad_input)
    before = snapshot(box)
    res = cli("study", spec, "--out", box / "study", "--stages", "train,select")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.stderr
    # a refusal names its own fix (re-train it); re-running the same command would fail the same way
    assert "study stage 'select' failed: checkpoint epoch_0004" in lines[0] and "re-train it" in lines[0]
    assert "re-run the same command" not in lines[0]
    after = snapshot(box)
    assert {k: v for k, v in after.items() if k in before} == before  # only the study folder was added
    assert all(k.startswith("study") for k in set(after) - set(before))


def test_study_stage_crash_still_exits_1(cli, box, monkeypatch):
    import pcpo_eval.study.runner as sr
    from tests.support.study import write_run, write_spec

    def crash(self):
        raise RuntimeError("a bug")

    monkeypatch.setattr(sr.Study, "stage_select", crash)
    runs = []
    for arm in ("DDPO", "PCPO"):
        write_run(box / f"run {arm}", 8, 0.05, 2, rng_key=arm)
        runs.append({"levels": {"algorithm": arm}, "seed": 0, "run_dir": str(box / f"run {arm}")})
    design = {"algorithm": {"DDPO": {"objective": "ppo_clip"}, "PCPO": {"objective": "pcpo"}}}
    spec = write_spec(box / "runs.yaml", design=design, runs=runs, seeds=[0], targets=[0.2], select_target=0.2,
                      lmm={"formula": "value ~ algorithm + (1|prompt)"})
    res = cli("study", spec, "--out", box / "study", "--stages", "train,select")
    assert res.returncode == 1 and "RuntimeError: a bug" in res.stderr and "traceback in" in res.stderr


# ---- 6. the last stray tracebacks --------------------------------------------------------------

def test_wandb_online_without_api_key(cli, box, monkeypatch):
    from tests.support.cli import TOY_CFG

    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(box / "no netrc"))
    rejected(cli, box, "train", TOY_CFG, "--out", box / "run", "log_to=wandb", "wandb_mode=online",
             needles=["no W&B API key", "wandb login", "WANDB_API_KEY", "wandb_mode=offline"])
    (box / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    os.chmod(box / "netrc", 0o600)
    monkeypatch.setenv("NETRC", str(box / "netrc"))
    from pcpo_eval.train.tracking import wandb_api_key_present

    assert wandb_api_key_present()


@pytest.mark.parametrize("extractor, weights, needles", [
    ("toy", "no such folder", ["toy weights", "classifier.safetensors"]),
    ("toy", "plain file", ["toy weights", "is not a folder with"]),
    ("inception", "plain file", ["inception"]),
    ("inception", "garbage.parquet", ["inception"]),
    ("dinov2", "no such folder", ["dinov2 weights"]),
], ids=["toy-missing", "toy-file", "inception-text", "inception-garbage", "dinov2-missing"])
def test_features_bad_weights(cli, box, image_set, extractor, weights, needles):
    rejected(cli, box, "features", image_set, "--extractor", extractor, "-o", box / "f.npy",
             "--weights", box / weights, needles=needles)


@pytest.mark.parametrize("content, needles", [
    ('{"beta_start": "abc"}', ["beta_start=\"abc\"", "a number in [0, 1)"]),
    ('{"num_train_timesteps": -5}', ["num_train_timesteps=-5", "whole number >= 1"]),
    ('{"num_train_timesteps": "1000"}', ["num_train_timesteps=\"1000\""]),
    ('{"num_train_timesteps": 1000.5}', ["num_train_timesteps=1000.5"]),
    ('{"set_alpha_to_one": "no"}', ["set_alpha_to_one", "true or false"]),
    ('{"steps_offset": [1]}', ["steps_offset=[1]"]),
    ('{"trained_betas": "x"}', ["trained_betas"]),
    ('{"beta_start": 0.5, "beta_end": 0.1}', ["beta_start=0.5 is above beta_end=0.1"]),
    ('{"beta_end": NaN}', ["beta_end=NaN"]),
    ("[1, 2]", ["must hold a JSON object"]),
    ('"text"', ["must hold a JSON object"]),
    ("beta_start: 0.1\n", ["cannot read --scheduler-config"]),
], ids=["str-beta", "negative-steps", "str-steps", "float-steps", "str-bool", "list-offset", "str-betas",
        "start-above-end", "nan-beta", "list", "string", "yaml"])
def test_credit_scheduler_config_types(cli, box, content, needles):
    (box / "sched ü.json").write_text(content)
    rejected(cli, box, "credit", "ddim", "--scheduler-config", box / "sched ü.json", needles=needles)


def test_huge_batch_is_one_line(cli, box, monkeypatch):
    from tests.support.cli import TOY_CFG

    rejected(cli, box, "train", TOY_CFG, "--out", box / "run", "sample_batch_size=100000000",
             "train_batch_size=100000000", needles=["cannot fit", "GiB", "smaller sample_batch_size"])
    # what still runs out of memory (a batch that passed the lower bound) is one line too
    import pcpo_eval.stats.speedup as sp

    def oom(*a, **k):
        raise MemoryError

    monkeypatch.setattr(sp, "speedup_table", oom)
    pd.DataFrame({"epoch": np.arange(1, 6), "reward_mean": np.linspace(0, 1, 5)}).to_parquet(box / "a.parquet")
    pd.DataFrame({"epoch": np.arange(1, 6), "reward_mean": np.linspace(0, 0.9, 5)}).to_parquet(box / "b.parquet")
    rejected(cli, box, "speedup", "--baseline", box / "a.parquet", "--pcpo", box / "b.parquet", "--target", "0.5",
             needles=["out of memory", "lower the batch size"])
