"""generate_set end to end on the stand-in model: identical hashes across batch sizes and process
counts, the output contract, resume after deletion and after SIGKILL, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import FrozenInstanceError
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pcpo_eval.errors import UserError
from pcpo_eval.generate.png import read_png_text
from pcpo_eval.generate.runner import GenerationRequest, generate_set
from pcpo_eval.imageset import MANIFEST_COLUMNS
from pcpo_eval.io import sha256_file
from pcpo_eval.prompts import PromptSet, simple_animals
from tests.support.generate import StandInAdapter

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "support" / "generate_worker.py"
N_PROMPTS, N_SEEDS, STEPS, MICRO = 10, 4, 3, 4


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _prompts(n: int = N_PROMPTS) -> PromptSet:
    a = simple_animals()
    return PromptSet("standin", a.prompt_ids[:n], a.prompts[:n])


def _render(out: Path, batch_size: int, **kw) -> pd.DataFrame:
    generate_set(
        StandInAdapter(), _prompts(), N_SEEDS, out, batch_size=batch_size, steps=STEPS,
        micro_batch=MICRO, progress=False, **kw,
    )  # fmt: skip
    return pd.read_parquet(out / "manifest.parquet")


@pytest.fixture(scope="module")
def reference_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "set"
    _render(out, batch_size=8)
    return out


def _hashes(df: pd.DataFrame) -> dict[tuple[int, int], str]:
    return {(r.prompt_id, r.seed): r.image_sha256 for r in df.itertuples()}


def test_output_contract(reference_set):
    out = reference_set
    df = pd.read_parquet(out / "manifest.parquet")
    assert list(df.columns) == MANIFEST_COLUMNS and len(df) == N_PROMPTS * N_SEEDS
    assert df[["prompt_id", "seed"]].duplicated().sum() == 0
    row = df[(df.prompt_id == 3) & (df.seed == 2)].iloc[0]
    assert row.path == "images/p00003/s0000002.png" and row.prompt == "monkey"
    path = out / row.path
    assert sha256_file(path) == row.image_sha256
    with Image.open(path) as im:
        assert im.format == "PNG" and im.mode == "RGB" and im.size == (8, 8)
    text = read_png_text(path)
    meta = json.loads(text["pcpo_eval"])
    assert text["prompt"] == "monkey" and meta["seed"] == 2 and meta["prompt_id"] == 3
    assert meta["steps"] == STEPS and meta["cfg"] == 5.0 and meta["micro_batch"] == MICRO
    info = json.loads((out / "set.json").read_text())
    assert info["status"] == "complete" and info["settings"]["model_hash"] == row.model_hash
    assert info["run"]["n_images"] == 40 and not (out / ".progress").exists()
    assert not list(out.rglob("*.tmp"))


def test_bit_identical_for_batch_sizes_1_and_37(reference_set, tmp_path):
    ref = _hashes(pd.read_parquet(reference_set / "manifest.parquet"))
    for bs in (1, 37):
        assert _hashes(_render(tmp_path / f"bs{bs}", batch_size=bs)) == ref


def test_rerun_skips_and_resume_after_deleting_images(reference_set, tmp_path):
    out = tmp_path / "set"
    shutil.copytree(reference_set, out)
    before = sha256_file(out / "images/p00000/s0000000.png")
    s = generate_set(
        StandInAdapter(), _prompts(), N_SEEDS, out, batch_size=8, steps=STEPS, micro_batch=MICRO, progress=False
    )
    assert s.n_rendered == 0 and s.n_skipped == 40
    for rel in ("images/p00000/s0000000.png", "images/p00007/s0000003.png"):
        (out / rel).unlink()
    s = generate_set(
        StandInAdapter(), _prompts(), N_SEEDS, out, batch_size=8, steps=STEPS, micro_batch=MICRO, progress=False
    )
    assert s.n_rendered == 2
    assert sha256_file(out / "images/p00000/s0000000.png") == before
    # where the call's seconds went: every phase, none negative, together the whole call up to bookkeeping
    phases = s.phase_seconds
    assert set(phases) == {"load_model", "memory_probes", "model_hash", "open_set_dir", "first_batch",
                           "other_batches", "png_tail", "finish"}
    assert min(phases.values()) >= 0 and phases["first_batch"] > 0
    assert 0.5 * s.seconds <= sum(phases.values()) <= s.seconds
    assert _hashes(pd.read_parquet(out / "manifest.parquet")) == _hashes(
        pd.read_parquet(reference_set / "manifest.parquet")
    )


def test_different_settings_are_refused_without_writing(reference_set, tmp_path):
    out = tmp_path / "set"
    shutil.copytree(reference_set, out)
    mtime = (out / "set.json").stat().st_mtime_ns
    with pytest.raises(UserError, match="steps=3"):
        generate_set(StandInAdapter(), _prompts(), N_SEEDS, out, steps=4, micro_batch=MICRO, progress=False)
    with pytest.raises(UserError, match="model_hash"):
        generate_set(StandInAdapter(1), _prompts(), N_SEEDS, out, steps=STEPS, micro_batch=MICRO, progress=False)
    other = PromptSet("x", (0,), ("a zebra",))  # id 0 was "cat"
    with pytest.raises(UserError, match="prompt_id 0"):
        generate_set(StandInAdapter(), other, N_SEEDS, out, steps=STEPS, micro_batch=MICRO, progress=False)
    assert (out / "set.json").stat().st_mtime_ns == mtime


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"seeds": "3-1"}, "A <= B"),
        ({"seeds": "x"}, "malformed"),
        ({"prompts": "DUPLICATE"}, "duplicate prompt_id"),
        ({"prompts": "EMPTY"}, "no prompts"),
        ({"batch_size": 0}, "batch-size"),
        ({"sampler": "euler"}, "unknown sampler"),
        ({"steps": 0}, "^--steps 0;"),
        ({"steps": 2.5}, "^--steps 2.5;"),
        ({"cfg": float("nan")}, "^--cfg nan;"),  # used to render a complete set of black images
        ({"cfg": float("-inf")}, "^--cfg -inf;"),
        ({"eta": float("nan")}, "^--eta nan;"),  # used to fail in the sampler after writing set.json
        ({"eta": float("inf")}, "^--eta inf;"),
        ({"eta": -0.5}, "^--eta -0.5;"),
        ({"micro_batch": -1}, "^--micro-batch -1;"),
    ],
)
def test_bad_input_writes_nothing(tmp_path, kwargs, match):
    (tmp_path / "dup.csv").write_text("prompt_id,prompt\n1,a\n1,b\n")
    (tmp_path / "empty.txt").write_text("")
    files = {"DUPLICATE": tmp_path / "dup.csv", "EMPTY": tmp_path / "empty.txt"}
    args = {"prompts": _prompts(), "seeds": 2, "batch_size": 4, "sampler": "auto", "steps": 2, **kwargs}
    args["prompts"] = files.get(args["prompts"], args["prompts"]) if isinstance(args["prompts"], str) else args["prompts"]
    out = tmp_path / "out"
    with pytest.raises(UserError, match=match) as info:
        generate_set(StandInAdapter(), args.pop("prompts"), args.pop("seeds"), out, progress=False, **args)
    assert "\n" not in str(info.value)
    assert not out.exists()


def test_bad_numbers_are_refused_before_the_model_is_loaded(tmp_path):
    """GenerationRequest checks numbers at construction: a model spec that cannot load is never tried."""
    out = tmp_path / "out"
    with pytest.raises(UserError, match="^--cfg nan;"):
        generate_set(tmp_path / "no_such_run", "toy", 2, out, cfg=float("nan"), progress=False)
    with pytest.raises(UserError, match="^--eta nan;"):
        GenerationRequest("toy", "toy", 2, out, eta=float("nan"))
    request = GenerationRequest("toy", "toy", 2, out, steps=np.int64(3), cfg=np.float32(4.5))  # numpy numbers pass
    with pytest.raises(FrozenInstanceError):
        request.cfg = float("nan")  # type: ignore[misc]
    assert not out.exists()


def test_foreign_directory_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not an image set"):
        generate_set(StandInAdapter(), _prompts(2), 1, tmp_path, steps=2, progress=False)


def _worker_cmd(out: Path, n_seeds: int, batch: int) -> list[str]:
    return [sys.executable, str(WORKER), str(out), str(N_PROMPTS), str(n_seeds), str(batch), str(STEPS), str(MICRO)]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


@pytest.mark.parametrize("kill_after", [1, pytest.param(23, marks=pytest.mark.slow)])
def test_sigkill_then_resume_gives_the_same_set(reference_set, tmp_path, kill_after):
    """SIGKILL a rendering subprocess once >= kill_after PNGs exist; the re-run completes the set."""
    out = tmp_path / "set"
    proc = subprocess.Popen(_worker_cmd(out, N_SEEDS, 1), env=_env(), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    try:
        while len(list(out.glob("images/*/*.png"))) < kill_after:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "worker too slow"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "manifest.parquet").exists()
    n_done = len(list(out.glob("images/*/*.png")))
    assert n_done < N_PROMPTS * N_SEEDS
    for png in out.glob("images/*/*.png"):  # every image that exists is complete
        with Image.open(png) as im:
            im.load()
    s = generate_set(
        StandInAdapter(), _prompts(), N_SEEDS, out, batch_size=8, steps=STEPS, micro_batch=MICRO, progress=False
    )
    assert s.n_skipped == n_done and s.n_rendered == N_PROMPTS * N_SEEDS - n_done
    assert _hashes(pd.read_parquet(out / "manifest.parquet")) == _hashes(
        pd.read_parquet(reference_set / "manifest.parquet")
    )
    assert not list(out.rglob("*.tmp"))


def test_two_processes_torchrun_match_one_process(reference_set, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun not installed")
    out = tmp_path / "set2"
    cmd = [str(torchrun), "--standalone", "--nproc_per_node=2", *_worker_cmd(out, N_SEEDS, 8)[1:]]
    res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.read_parquet(out / "manifest.parquet")
    assert _hashes(df) == _hashes(pd.read_parquet(reference_set / "manifest.parquet"))
    assert json.loads((out / "set.json").read_text())["run"]["world_size"] == 2
    assert np.all(df.pixel_sha256.str.len() == 64)


@pytest.mark.parametrize("schedule", ["ode", "dance"])
def test_flow_model_sets_are_batch_invariant(tmp_path, schedule):
    """Velocity models go through the flow sampler; ODE and SDE images do not depend on batch size."""
    from pcpo_eval.models.toy_flow import load_toy_flow
    from pcpo_eval.prompts import toy_prompts

    adapter = load_toy_flow(random_init=True)
    toy = toy_prompts()
    prompts = PromptSet("toy3", toy.prompt_ids[:3], toy.prompts[:3])
    hashes = []
    for bs in (1, 5):
        s = generate_set(
            adapter, prompts, 2, tmp_path / f"b{bs}", batch_size=bs, steps=3, cfg=4.5, eta=0.7,
            schedule=schedule, micro_batch=MICRO, progress=False,
        )  # fmt: skip
        assert s.settings.sampler == "flow" and s.settings.schedule == schedule
        hashes.append(_hashes(pd.read_parquet(tmp_path / f"b{bs}" / "manifest.parquet")))
    assert hashes[0] == hashes[1] and len(hashes[0]) == 6
    with pytest.raises(UserError, match="schedule"):
        generate_set(adapter, prompts, 1, tmp_path / "bad", schedule="pcpo", progress=False)


def test_cli_generate_bad_input_is_one_line(cli, tmp_path):
    res = cli("generate", "--model", "toy", "--prompts", "simple_animals", "--seeds", "5-2", "--out", tmp_path / "o")
    assert res.returncode == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()
    (tmp_path / "dup.csv").write_text("prompt_id,prompt\n1,a\n1,b\n")
    res = cli("generate", "--model", "toy", "--prompts", tmp_path / "dup.csv", "--seeds", "2", "--out", tmp_path / "o")
    assert res.returncode == 2 and "duplicate prompt_id 1" in res.stderr
    assert not (tmp_path / "o").exists()
    for flag in ("--cfg", "--eta"):
        res = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "2", "--out", tmp_path / "o", flag, "nan")
        assert res.returncode == 2 and res.stderr.startswith(f"error: {flag} nan; use a finite")
        assert res.stderr.count("\n") == 1 and not (tmp_path / "o").exists()


def test_irg_set_with_zero_weight_reproduces_the_reference_pixels(reference_set, tmp_path):
    """eps_ref + 0 * (eps_ft - eps_ref) == eps_ref exactly, so the images equal the reference set's."""
    from pcpo_eval.generate.irg import IRGAdapter

    irg = IRGAdapter(StandInAdapter(), [(StandInAdapter(1), 0.0)])
    s = generate_set(irg, _prompts(), N_SEEDS, tmp_path / "irg", batch_size=8, steps=STEPS, micro_batch=MICRO,
                     progress=False)  # fmt: skip
    ref = pd.read_parquet(reference_set / "manifest.parquet")
    got = pd.read_parquet(tmp_path / "irg" / "manifest.parquet")
    assert list(got.pixel_sha256) == list(ref.pixel_sha256)
    assert s.settings.model_hash != ref.model_hash.iloc[0]  # a different model identity


def test_unrecorded_truncated_image_is_rendered_again(reference_set, tmp_path):
    """A file cut short (possible only after a power loss) and not in any record is re-rendered."""
    out = tmp_path / "set"
    shutil.copytree(reference_set, out)
    (out / "manifest.parquet").unlink()  # no records: every image must prove itself by decoding
    victim = out / "images/p00002/s0000001.png"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    s = generate_set(
        StandInAdapter(), _prompts(), N_SEEDS, out, batch_size=8, steps=STEPS, micro_batch=MICRO, progress=False
    )
    assert s.n_rendered == 1 and victim.read_bytes() == data
    assert _hashes(pd.read_parquet(out / "manifest.parquet")) == _hashes(
        pd.read_parquet(reference_set / "manifest.parquet")
    )


def test_device_is_read_as_the_device_flag(reference_set, tmp_path):
    """``device`` of the API reads as ``--device``: ``auto`` is this process's GPU or the CPU (the same set
    as ``cpu`` here: resumed, nothing rendered), a misspelt device one UserError before anything is written."""
    out = tmp_path / "set"
    shutil.copytree(reference_set, out)
    s = generate_set(StandInAdapter(), _prompts(), N_SEEDS, out, steps=STEPS, micro_batch=MICRO, device=" AUTO ",
                     progress=False)
    assert s.n_rendered == 0 and s.n_skipped == 40
    with pytest.raises(UserError, match="unknown --device 'gpu'"):
        generate_set(StandInAdapter(), _prompts(), N_SEEDS, tmp_path / "new", device="gpu", progress=False)
    assert not (tmp_path / "new").exists()


def test_module_sha256_is_the_documented_digest_of_the_state_dict():
    """model_hash = SHA-256 over sorted (name|dtype|shape| + raw bytes) of the state dict, whatever the dtype
    (the sets on disk carry it: a faster implementation must give the same digests)."""
    import hashlib

    import torch

    from pcpo_eval.generate.loading import module_sha256

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.LayerNorm(5)).to(torch.bfloat16)
    m.register_buffer("odd", torch.arange(12, dtype=torch.float32).reshape(3, 4).T)  # non-contiguous
    h = hashlib.sha256()
    for name, t in sorted(m.state_dict().items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    assert module_sha256(m) == h.hexdigest()


def test_a_dancegrpo_sde_set_records_what_its_images_decode(tmp_path):
    """A set on DanceGRPO's flow SDE decodes the last step's prediction of x_0 (``final_latent: x0_prediction``,
    its reference's convention); a set of that SDE written before the setting decoded the last sample, so it
    is not resumed with the other convention (the old set.json has no ``final_latent``)."""
    out = tmp_path / "dance"
    kw = dict(steps=2, eta=0.3, schedule="dance", progress=False, max_prompts=1)
    generate_set("toyflow", "toy", 1, out, **kw)
    info = json.loads((out / "set.json").read_text())
    assert info["settings"]["final_latent"] == "x0_prediction"
    generate_set("toyflow", "toy", 1, tmp_path / "ode", steps=2, eta=0.3, schedule="ode", progress=False, max_prompts=1)
    assert json.loads((tmp_path / "ode" / "set.json").read_text())["settings"]["final_latent"] == "sample"
    info["settings"].pop("final_latent")
    (out / "set.json").write_text(json.dumps(info))
    with pytest.raises(UserError, match="final_latent"):
        generate_set("toyflow", "toy", 2, out, **kw)


def test_a_cpu_render_is_the_same_whatever_the_callers_thread_count(tmp_path):
    """A plain 2-thread render and a 1-thread render (what each ``torchrun`` process gets: OMP_NUM_THREADS=1)
    of one set: the toy UNet's sums depend on the thread count, and 1 of these 7 images differed by one grey
    level. A CPU render now runs with one thread per process (recorded in set.json) and restores the caller's."""
    import torch

    from pcpo_eval.precision import CPU_RENDER_THREADS

    old = torch.get_num_threads()
    sets = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = tmp_path / f"t{threads}"
            generate_set("toy", "toy", "3-3", out, max_prompts=7, steps=6, micro_batch=4, batch_size=2,
                         progress=False)
            assert torch.get_num_threads() == threads
            sets[threads] = {p.relative_to(out): p.read_bytes() for p in sorted(out.glob("images/*/*.png"))}
            assert json.loads((out / "set.json").read_text())["settings"]["cpu_threads"] == CPU_RENDER_THREADS
    finally:
        torch.set_num_threads(old)
    assert len(sets[1]) == 7 and sets[1] == sets[2]


def test_a_multi_process_run_stopped_before_its_first_image_binds_no_settings(tmp_path):
    """A torchrun render interrupted before any image leaves its ``rendering`` set.json (only a one-process run
    removes it); a re-run with other settings was refused: "holds images rendered with steps=50", with none."""
    from pcpo_eval.generate.setdir import holds_no_image

    out = tmp_path / "set"
    generate_set(StandInAdapter(), _prompts(2), 1, out, steps=3, progress=False)
    first = json.loads((out / "set.json").read_text())
    for p in out.glob("images/*/*.png"):
        p.unlink()
    (out / "manifest.parquet").unlink()
    assert holds_no_image(out)
    generate_set(StandInAdapter(), _prompts(2), 1, out, steps=2, progress=False)  # other settings: accepted
    again = json.loads((out / "set.json").read_text())
    assert first["settings"]["steps"] == 3 and again["settings"]["steps"] == 2 and again["status"] == "complete"
    assert len(list(out.glob("images/*/*.png"))) == 2
    with pytest.raises(UserError, match="steps=2"):  # with its images, the set keeps its settings
        generate_set(StandInAdapter(), _prompts(2), 1, out, steps=3, progress=False)
