"""``reward_overlap``: each sampling batch scored in a background thread while the next one samples
(ddpo-pytorch's reward executor). The run is the same as scoring the epoch at once when a score depends on
its image alone; the scoring really runs beside sampling; a weighted reward's components, a reward's
error and its seconds are kept."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.trainer import Trainer
from tests.support.train import TINY as TINY_TRAIN

TINY = {**TINY_TRAIN, "sample_batch_size": 2, "sample_batches_per_epoch": 3, "gradient_updates": 3, "log_to": "none"}


def _run(tmp_path, name, **over):
    tr = Trainer(config_from_dict({**TINY, **over}), tmp_path / name)
    return tr, tr.run()


def test_per_image_reward_gives_the_same_run(tmp_path):
    for reward in ("jpeg_compressibility", {"toy_aesthetic": 0.7, "jpeg_compressibility": 0.3}):
        a, log_a = _run(tmp_path, f"serial{len(str(reward))}", reward=reward)
        b, log_b = _run(tmp_path, f"overlap{len(str(reward))}", reward=reward, reward_overlap=True)
        cols = [c for c in log_a.columns if c.startswith(("reward_", "clipfrac", "approx_kl", "loss"))
                and c != "reward_time_s"]
        assert len(cols) >= 4 and (not isinstance(reward, dict) or "reward_toy_aesthetic_mean" in cols)
        for c in cols:
            np.testing.assert_array_equal(np.asarray(log_a[c].tolist()), np.asarray(log_b[c].tolist()), err_msg=c)
        for p, q in zip(a.params, b.params, strict=True):
            assert torch.equal(p, q)
        assert (log_b["reward_time_s"] > 0).all()


def test_scoring_runs_in_a_thread_beside_the_next_batch(tmp_path):
    tr = Trainer(config_from_dict({**TINY, "epochs": 1, "reward_overlap": True}), tmp_path / "run")
    score, sample = tr.reward_fn, tr._sample_batch
    started: list[threading.Event] = [threading.Event() for _ in range(TINY["sample_batches_per_epoch"])]
    calls: list[tuple[str, int, bool]] = []

    def sample_batch(epoch, start, prompts, record=True):
        started[start // TINY["sample_batch_size"]].set()
        return sample(epoch, start, prompts, record)

    def reward(images, prompts):
        k = len(calls)
        # batch k is scored while batch k + 1 samples: that batch starts without waiting for this call
        beside = k + 1 >= len(started) or started[k + 1].wait(timeout=60)
        calls.append((threading.current_thread().name, len(images), beside))
        return score(images, prompts)

    tr._sample_batch, tr.reward_fn = sample_batch, reward
    tr.run()
    assert [n for _, n, _ in calls] == [2, 2, 2] and all(b for *_, b in calls)
    assert all(name.startswith("reward") for name, *_ in calls)


def test_a_reward_error_stops_the_epoch(tmp_path):
    tr = Trainer(config_from_dict({**TINY, "epochs": 1, "reward_overlap": True}), tmp_path / "run")
    score, n = tr.reward_fn, []

    def reward(images, prompts):
        n.append(1)
        if len(n) == 2:
            raise RuntimeError("scoring server went away")
        return score(images, prompts)

    tr.reward_fn = reward
    with pytest.raises(RuntimeError, match="scoring server went away"):
        tr.run()
    assert not list((tmp_path / "run").glob("checkpoint*"))


def test_the_scoring_thread_binds_the_process_gpu_read_before_it_starts(tmp_path, monkeypatch):
    """A bare ``cuda`` device (one process) has no index, which ``torch.cuda.set_device`` refuses (a
    ValueError in the reward thread: the first GPU run of ``reward_overlap`` would have crashed). The index
    is read in the trainer's thread (``dist.gpu_index``: the current GPU) and the scoring thread binds it."""
    from pcpo_eval import dist

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert dist.gpu_index(torch.device("cuda")) == 2 and dist.gpu_index(torch.device("cuda:1")) == 1
    assert dist.gpu_index(torch.device("cpu")) is None
    tr = Trainer(config_from_dict({**TINY, "epochs": 1, "reward_overlap": True}), tmp_path / "run")
    monkeypatch.setattr(dist, "gpu_index", lambda device: 3)  # as on a GPU whose current device is cuda:3
    bound: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: bound.append((threading.current_thread().name, d)))
    tr.run()
    assert len(bound) == TINY["sample_batches_per_epoch"]
    assert all(name.startswith("reward") and d == 3 for name, d in bound)
