"""Feature cache: a SIGKILL mid-run, then a re-run, computes only the unfinished batches; torchrun 2 == 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pcpo_eval import rewards
from pcpo_eval.features import make_extractor
from pcpo_eval.imageset import ImageSet
from pcpo_eval.metrics.cache import FeatureCache
from pcpo_eval.metrics.extract import ExtractionReport, MetricsOptions, extract_set, feature_cache_settings
from pcpo_eval.metrics.workers import compute_metrics
from tests.support.metrics import TOY_PROMPTS, StandInToyClassifier, make_image_set

SCRIPT = Path(__file__).parents[1] / "support" / "metrics_worker.py"
PYTHON = sys.executable


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_cache_roundtrip_and_order(tmp_path) -> None:
    cache = FeatureCache(tmp_path, "x", {"a": 1})
    cache.write_chunk(["k2", "k1"], {"features": np.array([[2.0], [1.0]])})
    cache.write_chunk(["k3"], {"features": np.array([[3.0]])})
    again = FeatureCache(tmp_path, "x", {"a": 1})
    assert len(again) == 3 and again.missing(["k1", "k4", "k4"]) == ["k4"]
    np.testing.assert_array_equal(
        again.gather(["k1", "k3", "k2", "k1"], ["features"])["features"][:, 0], [1, 3, 2, 1]
    )
    assert FeatureCache(tmp_path, "x", {"a": 2}).dir != again.dir


def test_sigkill_then_rerun_resumes(tmp_path) -> None:
    s = make_image_set(tmp_path / "set", TOY_PROMPTS, list(range(8)))  # 24 images, 12 batches of 2
    cache_dir = tmp_path / "cache"
    proc = subprocess.Popen([PYTHON, str(SCRIPT), "extract", str(s), str(cache_dir)], env=_env())
    chunks: list[Path] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        chunks = list(cache_dir.glob("features/toy-*/chunk-*.npz"))
        if len(chunks) >= 3:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the worker finished before it could be killed"
    done = len(FeatureCache(cache_dir / "features", "toy", _settings()))
    assert 0 < done < 24
    assert not list(cache_dir.rglob("*.tmp"))  # atomic chunks: no half-written file left visible
    report = ExtractionReport()
    opts = MetricsOptions(batch_size=2, cache_dir=cache_dir)
    ext = make_extractor("toy", classifier=StandInToyClassifier(0))
    feats = extract_set(ImageSet.load(s), ext, opts, report=report)["features"]
    assert report.cached == done and report.computed == 24 - done
    fresh = extract_set(ImageSet.load(s), ext, MetricsOptions(batch_size=5, cache_dir=tmp_path / "fresh"))[
        "features"
    ]
    np.testing.assert_allclose(feats, fresh, rtol=1e-5, atol=1e-6)  # batch composition moves the last bits


def _settings() -> dict:
    ext = make_extractor("toy", classifier=StandInToyClassifier(0))
    return feature_cache_settings(ext, MetricsOptions())


def test_torchrun_two_processes_equal_one(tmp_path, monkeypatch, one_thread) -> None:
    # one_thread: the workers run with OMP_NUM_THREADS=1, and the in-process run below must use the
    # same kernels to give the same bits
    pytest.importorskip("torch.distributed.run")
    a = make_image_set(tmp_path / "a", TOY_PROMPTS, list(range(10)))
    b = make_image_set(tmp_path / "b", TOY_PROMPTS, list(range(50, 60)))
    out = tmp_path / "two.json"
    cmd = [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(SCRIPT),
        "metrics",
    ]
    r = subprocess.run(
        [*cmd, str(a), str(b), str(tmp_path / "c2"), str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    two = json.loads(out.read_text())
    assert two["world"] == 2
    monkeypatch.setitem(rewards.REGISTRY, "hps", "tests.support.metrics:fake_reward")
    opts = MetricsOptions(
        batch_size=4,
        cache_dir=tmp_path / "c1",
        lpips_batch=3,
        extractor_options={"toy": {"classifier": StandInToyClassifier(0)}},
    )
    one = compute_metrics(a, "fd_toy,is_toy,lpips_toy,hps", b, opts)
    assert one.metrics.keys() == two["metrics"].keys()
    for k, v in one.metrics.items():
        # float64 sums reduced in another order: FD (a difference of large traces) moves in the 8th digit
        assert two["metrics"][k] == pytest.approx(v, rel=1e-6, abs=1e-10), k
    for col in ("fd_toy", "is_toy", "lpips_toy", "hps"):
        np.testing.assert_allclose(two["per_prompt"][col], one.per_prompt[col], rtol=1e-6, atol=1e-10)
    # the same batches were computed (dealt to two ranks instead of one)
    chunks = sorted(p.name for p in (tmp_path / "c2").glob("features/toy-*/chunk-*.npz"))
    assert chunks == sorted(p.name for p in (tmp_path / "c1").glob("features/toy-*/chunk-*.npz"))


def test_a_damaged_chunk_is_one_error_line_then_recomputed(tmp_path) -> None:
    """Bytes damaged inside a chunk's array (its keys still read): one UserError naming the chunk, not a
    traceback; deleting it as the message says recomputes the same features."""
    from pcpo_eval.errors import UserError

    s = ImageSet.load(make_image_set(tmp_path / "a", TOY_PROMPTS, list(range(4))))
    opts = MetricsOptions(batch_size=4, cache_dir=tmp_path / "c")
    ext = make_extractor("toy", classifier=StandInToyClassifier(0))
    want = extract_set(s, ext, opts)["features"]
    chunk = sorted((tmp_path / "c").glob("features/toy-*/chunk-*.npz"))[0]
    data = bytearray(chunk.read_bytes())
    at = data.index(b"features.npy") + 200  # inside the features member's data
    data[at:at + 8] = bytes(8)
    chunk.write_bytes(bytes(data))
    with pytest.raises(UserError, match=f"feature cache chunk {chunk} is damaged.*delete it"):
        extract_set(s, ext, opts)
    chunk.unlink()
    np.testing.assert_array_equal(extract_set(s, ext, opts)["features"], want)
