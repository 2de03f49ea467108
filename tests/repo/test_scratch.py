"""Nothing left in the temporary folder: the tiny test models and the benchmarks' scratch data.

Every run of the suite used to leave about a thousand folders in ``/tmp`` (the tiny CLIP tokenizers'
vocab files, one per model built; the GPU benchmarks' dry runs: sets, caches, a DeBERTa)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _in_fresh_tmpdir(code: str, tmp_path: Path) -> list[str]:
    """Run ``code`` in a new interpreter whose ``TMPDIR`` is an empty folder; what it left there (but
    torch's compile cache ``torchinductor_USER``, which importing diffusers creates: a cache, not litter)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    env = {**os.environ, "TMPDIR": str(folder)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "ok", run.stdout
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("torchinductor_"))


def test_tiny_tokenizers_leave_nothing_and_still_work(tmp_path) -> None:
    code = (
        "from pcpo_eval.testing import tiny_clip_tokenizer, tiny_sd1_components\n"
        "from pcpo_eval.models.sd3 import tiny_clip_tokenizer as sd3_tok\n"
        "tok = tiny_sd1_components(0)['tokenizer']\n"
        "assert tok('a cat')['input_ids'][0] == 0 and tok('a cat')['input_ids'][-1] == 1\n"
        "assert tiny_clip_tokenizer()('a cat')['input_ids'] == tok('a cat')['input_ids']\n"
        "assert sd3_tok(16)('a dog')['input_ids'] == [0, 44, 5, 16, 50, 1]\n"
        "print('ok')\n")
    assert _in_fresh_tmpdir(code, tmp_path) == []


def test_scratch_dir_is_removed_at_exit(tmp_path) -> None:
    code = (
        "from pcpo_eval.io import scratch_dir\n"
        "a = scratch_dir('bench_x_'); (a / 'sub').mkdir(); (a / 'sub' / 'f.bin').write_bytes(b'1' * 10)\n"
        "assert a.is_dir() and a.name.startswith('bench_x_') and a.stat().st_mode & 0o077 == 0\n"
        "print('ok')\n")
    assert _in_fresh_tmpdir(code, tmp_path) == []


def test_benchmarks_make_no_bare_temp_folders() -> None:
    """A benchmark's scratch folder comes from ``io.scratch_dir`` (removed at exit), a
    ``TemporaryDirectory`` or a ``mkdtemp`` it removes itself in a ``finally``."""
    root = Path(__file__).resolve().parents[2]
    bare = []
    for path in sorted((root / "benchmarks").rglob("*.py")) + sorted((root / "pcpo_eval").rglob("*.py")):
        text = path.read_text()
        if "mkdtemp(" in text and "rmtree" not in text and path.name != "io.py":
            bare.append(str(path.relative_to(root)))
    assert bare == []
