"""Train-config parsing details (YAML scalars that are not what they look like)."""

from __future__ import annotations


def test_mixed_precision_no_survives_yaml_booleans(tmp_path):
    """YAML 1.1 reads a bare `no` as false: `mixed_precision: no` in a file or `mixed_precision=no` on the
    command line still means "no" (it used to fail as mixed_precision='False')."""
    from pcpo_eval.train.config import load_config

    f = tmp_path / "c.yaml"
    f.write_text("mixed_precision: no\n")
    assert load_config(f).mixed_precision == "no"
    assert load_config(None, ["mixed_precision=no"]).mixed_precision == "no"
    assert load_config(None, ["mixed_precision=bf16"]).mixed_precision == "bf16"


def test_deterministic_key_reads_yaml_booleans_and_may_change_on_resume():
    from pcpo_eval.train.config import RESUME_MAY_CHANGE, config_from_dict

    assert config_from_dict({}).deterministic is False  # the fast kernels, as the reference trainers
    assert config_from_dict({"deterministic": "yes"}).deterministic is True
    assert config_from_dict({"deterministic": "no"}).deterministic is False
    assert config_from_dict({"deterministic": False}).deterministic is False
    assert "deterministic" in RESUME_MAY_CHANGE  # a speed setting: a run may resume with the other one


def test_allow_tf32_leaves_cpu_kernels_alone(tmp_path, monkeypatch):
    """``allow_tf32`` (CUDA only) is read from the config and never changes a CPU run's matmul settings;
    on CUDA the epochs run under it (tests/support/cuda_checks.py train_tf32)."""
    import torch

    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import Trainer, train
    from tests.support.train import TINY

    assert load_config(None, []).allow_tf32 is True and load_config(None, ["allow_tf32=false"]).allow_tf32 is False
    seen = []
    real = Trainer._run_epoch

    def spy(self, epoch, bar):
        seen.append((torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32))
        return real(self, epoch, bar)

    monkeypatch.setattr(Trainer, "_run_epoch", spy)
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    cfg = load_config(None, [f"{k}={v}" for k, v in {**TINY, "epochs": 1}.items()] + ["log_to=none", "device=cpu"])
    train(cfg, tmp_path / "run")
    assert seen == [before]


def test_a_misspelt_key_is_named_with_its_likely_fix():
    import pytest

    from pcpo_eval.errors import UserError
    from pcpo_eval.train.config import load_config

    with pytest.raises(UserError, match=r"unknown config key\(s\) epoch \(epoch: did you mean epochs\?\); valid keys"):
        load_config(None, ["epoch=6"])
    with pytest.raises(UserError) as ei:
        load_config(None, ["zzz=1"])
    assert "did you mean" not in str(ei.value)
