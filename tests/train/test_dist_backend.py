"""The process group a launcher's process joins (``pcpo_eval.dist.init``): gloo on CPU; on CUDA NCCL for
device tensors plus gloo for host tensors (the metrics reduce float64 host states), each rank bound to
its own GPU before the group starts. The real two-process gloo runs are in tests/metrics and tests/train
(torchrun); the CUDA binding is checked here by stand-ins, since CI has no GPU."""

from __future__ import annotations

import pytest
import torch

from pcpo_eval import dist


def test_cpu_processes_use_gloo(monkeypatch):
    assert dist.group_backend("cpu") == ("gloo", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dist.group_backend("auto") == ("gloo", None)


@pytest.mark.parametrize(("device", "local_rank", "want"), [
    ("auto", "3", 3), ("cuda", "2", 2), ("cuda:1", "3", 1), ("cuda", "5", 1),  # 5 % 4 GPUs
])
def test_cuda_processes_bind_their_gpu_and_keep_a_cpu_backend(monkeypatch, device, local_rank, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    backend, dev = dist.group_backend(device)
    assert backend == "cpu:gloo,cuda:nccl"
    assert dev == torch.device("cuda", want)


def test_init_sets_the_device_before_the_group(monkeypatch):
    """``init`` makes the rank's GPU current, then starts the group bound to it (``device_id``)."""
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    for k, v in (("RANK", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):  # as torchrun sets them
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist.dist, "init_process_group",
                        lambda backend, **kw: calls.append(("init", backend, kw.get("device_id"))))
    monkeypatch.setattr(dist.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    assert dist.init("auto") == (1, 2)
    cuda1 = torch.device("cuda", 1)
    assert calls == [("set_device", cuda1), ("init", "cpu:gloo,cuda:nccl", cuda1)]


@pytest.mark.parametrize(("flag", "world", "want"), [
    ("cuda", "2", "cuda:3"), ("cuda:1", "2", "cuda:1"), ("auto", "2", "cuda:3"), ("cuda", "1", "cuda"),
])
def test_a_bare_cuda_flag_under_a_launcher_is_the_ranks_gpu(monkeypatch, flag, world, want):
    """``--device cuda`` under torchrun names this rank's GPU (``LOCAL_RANK``), as ``auto`` does and as the
    group binds it: ``generate`` loads its model before ``init``, when a bare ``cuda`` is still cuda:0, so
    every rank rendered on GPU 0. One process keeps PyTorch's meaning (the current device)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert dist.resolve_device(flag) == want
    if world != "1":  # the device the model is loaded on is the one the group binds
        assert dist.group_backend(flag)[1] == torch.device(want)
