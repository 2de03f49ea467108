"""Outputs honour the umask (files 0666 & ~umask, folders 0777 & ~umask) and checkpoint bytes are reproducible.

``mkstemp``/``mkdtemp`` create private (0600/0700) entries; every writer must end with the modes
``open``/``mkdir`` would give. Equal tensors must give equal safetensors bytes (``weights_sha256``) in
any process: ``safetensors.torch.save`` orders its header metadata by a per-process random hash.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pcpo_eval.io import (
    atomic_dir,
    atomic_write_json,
    atomic_write_text,
    current_umask,
    dir_mode,
    ensure_dir,
    file_mode,
    safetensors_bytes,
)
from tests.support.train import tiny_lora_module

ROOT = Path(__file__).resolve().parents[2]
UMASKS = [0o022, 0o027, 0o002]


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask{m:03o}")
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_current_umask_reads_without_changing(umask):
    assert current_umask() == umask
    assert current_umask() == umask  # unchanged by reading
    assert file_mode() == 0o666 & ~umask and dir_mode() == 0o777 & ~umask


def test_atomic_write_file_mode(tmp_path, umask):
    atomic_write_text(tmp_path / "a" / "b" / "x.txt", "hi")
    atomic_write_json(tmp_path / "y.json", {"a": 1})
    assert mode(tmp_path / "a" / "b" / "x.txt") == 0o666 & ~umask
    assert mode(tmp_path / "y.json") == 0o666 & ~umask
    assert mode(tmp_path / "a") == 0o777 & ~umask and mode(tmp_path / "a" / "b") == 0o777 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "y.json"]  # no temp file left


def test_atomic_dir_mode_and_replace(tmp_path, umask):
    target = tmp_path / "ck"
    for text in ("old", "new"):
        with atomic_dir(target) as tmp:
            (tmp / "f.txt").write_text(text)
    assert (target / "f.txt").read_text() == "new"
    assert mode(target) == 0o777 & ~umask and mode(target / "f.txt") == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_atomic_dir_failure_keeps_old(tmp_path):
    target = tmp_path / "ck"
    with atomic_dir(target) as tmp:
        (tmp / "f.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "f.txt").write_text("half")
        raise RuntimeError("crash")
    assert (target / "f.txt").read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_ensure_dir_modes(tmp_path, umask):
    ensure_dir(tmp_path / "p" / "q")
    assert mode(tmp_path / "p") == 0o777 & ~umask and mode(tmp_path / "p" / "q") == 0o777 & ~umask


def test_png_file_mode(tmp_path, umask):
    from pcpo_eval.generate.png import encode_png, write_image_file

    data = encode_png(torch.zeros(3, 4, 4, dtype=torch.uint8), {"k": "v"})
    write_image_file(tmp_path / "images" / "0.png", data)
    assert mode(tmp_path / "images" / "0.png") == 0o666 & ~umask
    assert (tmp_path / "images" / "0.png").read_bytes() == data


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_checkpoint_folder_and_file_modes(tmp_path, umask, lora):
    from pcpo_eval.train.checkpoints import save_checkpoint

    net = tiny_lora_module() if lora else torch.nn.Linear(3, 2)
    ck = save_checkpoint(tmp_path / "run" / "checkpoints" / "epoch_0001", net, {"epoch": 1}, {"epoch": 1})
    assert mode(ck) == 0o777 & ~umask and mode(ck.parent) == 0o777 & ~umask
    files = sorted(p.name for p in ck.iterdir())
    assert "checkpoint.json" in files and "training_state.pt" in files and len(files) == 3
    for f in ck.iterdir():
        assert mode(f) == 0o666 & ~umask, f


def test_safetensors_bytes_sorted_and_loadable():
    from safetensors.torch import load

    t = {"b.w": torch.arange(6.0).reshape(2, 3), "a.w": torch.ones(3, dtype=torch.float16), "Z": torch.zeros(1)}
    meta = {"zz": "1", "format": "pt", "lora_adapter_metadata": json.dumps({"r": 2})}
    raw = safetensors_bytes(t, meta)
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert list(header) == sorted(header) and list(header["__metadata__"]) == sorted(meta)
    back = load(raw)
    assert set(back) == set(t) and all(torch.equal(back[k], t[k]) for k in t)
    assert safetensors_bytes(dict(reversed(t.items())), dict(reversed(meta.items()))) == raw


_SAVE_TWICE = """
import json, sys, torch
sys.path.insert(0, {root!r})
from tests.support.train import tiny_lora_module
from pcpo_eval.train.checkpoints import save_checkpoint
ck = save_checkpoint(sys.argv[1], tiny_lora_module(), {{"epoch": 1}})
print(json.loads((ck / "checkpoint.json").read_text())["weights_sha256"])
"""


def test_equal_tensors_equal_hash_across_processes(tmp_path):
    """Two interpreters (different PYTHONHASHSEED, so different dict/HashMap orders) save the same LoRA."""
    script = _SAVE_TWICE.format(root=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / seed / "ck")], cwd=ROOT, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for seed in ("1", "2")]  # side by side: each is mostly interpreter start-up and imports
    hashes = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        hashes.append(out.strip().splitlines()[-1])
    assert hashes[0] == hashes[1] and len(hashes[0]) == 64
    files = [(tmp_path / s / "ck" / "pytorch_lora_weights.safetensors").read_bytes() for s in ("1", "2")]
    assert files[0] == files[1]
