"""The weights' moving average (``ema_decay``, Flow-GRPO's ``train.ema``): the reference's update rule at the
reference's call points, validation and checkpoints on the average, training itself unchanged, resume exact."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from pcpo_eval.errors import UserError
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.ema import ParamEMA, ema_decay_at
from pcpo_eval.train.trainer import Trainer
from tests.support.train import TINY

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

#: 8 samples an epoch in 4 micro-batches of 2, 2 optimizer steps: 2 training batches per step (Flow-GRPO's
#: accumulation window), averaged every 2 steps; validation every epoch on 4 images (of the training prompts: a warning, not a test)
EMA = {**TINY, "sample_batches_per_epoch": 2, "gradient_updates": 2, "ema_decay": 0.9, "ema_every": 2,
       "validation_every": 1, "validation_prompts": "toy", "validation_images": 4}


def _flow_grpo_average(initial: list[torch.Tensor], after_step: list[list[torch.Tensor]], steps_per_epoch: int,
                       batches_per_step: int, epochs: int, decay: float, every: int) -> list[list[torch.Tensor]]:
    """Flow-GRPO's average (``flow_grpo/ema.py``: ``ema += (1 - min((1+s)/(10+s), decay)) (p - ema)`` when
    ``(s + 1) % every == 0``), called as ``scripts/train_sd3.py`` calls it: after every training batch with
    ``s`` the optimizer steps so far, the step itself after the last batch of its window. Written from the
    reference, not from pcpo_eval.train.ema; returns the average at the end of each epoch."""
    ema = [t.clone().double() for t in initial]
    s, now, out = 0, initial, []
    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            for b in range(batches_per_step):
                if b == batches_per_step - 1:
                    now, s = after_step[s], s + 1
                if (s + 1) % every == 0:
                    d = min((1 + s) / (10 + s), decay)
                    ema = [e + (1 - d) * (p.double() - e) for e, p in zip(ema, now, strict=True)]
        out.append([e.float() for e in ema])
    return out


def _recording(tr: Trainer) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """The trainer's raw weights at the start, after each optimizer step, and as validation scores them."""
    initial = [p.detach().clone() for p in tr.params]
    steps: list[list[torch.Tensor]] = []
    scored: list[list[torch.Tensor]] = []
    step, validate = tr._optimizer_step, tr.validation_row

    def recorded_step():
        out = step()
        steps.append([p.detach().clone() for p in tr.params])
        return out

    def recorded_validation():
        scored.append([p.detach().clone() for p in tr.params])
        return validate()

    tr._optimizer_step, tr.validation_row = recorded_step, recorded_validation  # type: ignore[method-assign]
    return initial, steps, scored


def _lora(run, epoch: int) -> dict[str, torch.Tensor]:
    return load_file(str(ck.checkpoint_dir(run, epoch) / ck.LORA_FILE))


def _keys(tr: Trainer) -> list[str]:
    """The LoRA file's key of each trainable parameter, in ``tr.params``' order."""
    den = tr.adapter.denoiser
    named = [(n, p) for n, p in den.named_parameters() if p.requires_grad]
    assert [p for _, p in named] == tr.params
    return [f"{ck.lora_prefix(den)}.{n.replace('.default', '')}" for n, _ in named]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three epochs with the average and without it; two with it, resumed to three."""
    root = tmp_path_factory.mktemp("ema")
    tr = Trainer(config_from_dict({**EMA, "epochs": 3}), root / "ema")
    initial, steps, scored = _recording(tr)
    log = tr.run()
    plain = Trainer(config_from_dict({**EMA, "epochs": 3, "ema_decay": 0.0}), root / "plain").run()
    Trainer(config_from_dict({**EMA, "epochs": 2}), root / "part").run()
    resumed = Trainer(config_from_dict({**EMA, "epochs": 3}), root / "part", resume=True).run()
    return root, tr, log, plain, resumed, initial, steps, scored


def test_the_average_is_flow_grpos_at_its_call_points(runs):
    root, tr, log, _, _, initial, steps, scored = runs
    assert len(steps) == 6  # 2 optimizer steps x 3 epochs
    want = _flow_grpo_average(initial, steps, 2, 2, 3, 0.9, 2)
    names = _keys(tr)
    for epoch in (1, 2, 3):
        saved = _lora(root / "ema", epoch)
        assert sorted(saved) == sorted(names)
        for name, w in zip(names, want[epoch - 1], strict=True):
            torch.testing.assert_close(saved[name], w, rtol=1e-6, atol=1e-7)
        # validation scored the same averaged weights
        for got, w in zip(scored[epoch - 1], want[epoch - 1], strict=True):
            torch.testing.assert_close(got.float(), w, rtol=1e-6, atol=1e-7)
    # s = 1 and s = 3, 5 update twice each (the batch after the step and the next one): 2 per epoch
    assert log["ema_updates"].tolist() == [2, 4, 6]
    meta = ck.read_meta(ck.checkpoint_dir(root / "ema", 3))
    assert meta["ema"] == {"decay": 0.9, "every": 2, "repeats": 0, "updates": 6}
    assert ema_decay_at(1, 0.9) == pytest.approx(2 / 11) and ema_decay_at(80, 0.9) == 0.9


def test_training_itself_is_unchanged_by_the_average(runs):
    """Sampling and updates use the raw weights: every training column equals the run without the average;
    its raw weights (kept for resume) are the plain run's checkpoint; only validation (and the checkpoint's
    weights) differ."""
    root, tr, log, plain, _, _, _, _ = runs
    for col in ("reward_mean", "reward_std", "loss", "clipfrac", "approx_kl", "grad_norm"):
        assert log[col].tolist() == plain[col].tolist(), col
    state = ck.load_training_state(ck.checkpoint_dir(root / "ema", 3))
    raw = _lora(root / "plain", 3)
    for name, r in zip(_keys(tr), state["raw_params"], strict=True):
        assert torch.equal(raw[name], r)
    assert (log["val_reward_mean"] != plain["val_reward_mean"]).all()
    assert "ema_updates" not in plain.columns


def test_resume_restores_the_raw_weights_and_the_average(runs):
    root, _, log, _, resumed, _, _, _ = runs
    for col in ("reward_mean", "loss", "grad_norm", "val_reward_mean", "ema_updates"):
        assert resumed[col].tolist() == log[col].tolist(), col
    a, b = _lora(root / "ema", 3), _lora(root / "part", 3)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pinned_repeats_make_the_average_independent_of_the_micro_batching(tmp_path):
    """Flow-GRPO's call pattern repeats an averaging step once per batch of the accumulation window, so the
    average depends on the launch (batches per optimizer step of one process). ``ema_repeats: k`` applies k
    updates right after the step: two runs that differ only in ``train_batch_size`` (2 or 1 micro-batches per
    step, the same training to float rounding) then hold the same average; without it, not."""
    base = {**EMA, "epochs": 2, "validation_every": 0, "log_to": ""}

    def average(**kw):
        run = tmp_path / "_".join(f"{k}{v}" for k, v in kw.items())
        log = Trainer(config_from_dict({**base, **kw}), run).run()
        return _lora(run, 2), log

    (two, log2), (one, log1) = average(ema_repeats=3), average(ema_repeats=3, train_batch_size=4)
    assert log2["ema_updates"].tolist() == log1["ema_updates"].tolist() == [3, 6]  # s = 1 and 3, 3 each
    for k in two:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-6)
    (a, la), (b, lb) = average(ema_repeats=0), average(ema_repeats=0, train_batch_size=4)
    assert la["ema_updates"].tolist() == [2, 4] and lb["ema_updates"].tolist() == [1, 2]  # k follows the batches
    assert max(float((a[k] - b[k]).abs().max()) for k in a) > 10 * max(float((two[k] - one[k]).abs().max()) for k in two)


def test_the_average_swaps_in_and_out():
    p = torch.nn.Parameter(torch.ones(3))
    ema = ParamEMA([p], decay=0.5, every=1)
    with torch.no_grad():
        p.add_(1.0)
    ema.step([p], 20)  # decay min(21/30, 0.5) = 0.5
    with ema.swapped_in([p]):
        torch.testing.assert_close(p.detach(), torch.full((3,), 1.5))
    torch.testing.assert_close(p.detach(), torch.full((3,), 2.0))
    other = ParamEMA([torch.nn.Parameter(torch.ones(4))], 0.5, 1)
    with pytest.raises(ValueError, match="does not match"):
        other.load_state_dict(ema.state_dict())


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("ema_decay", 1.0, "ema_decay must be in [0, 1) (0 = no moving average; got 1.0)"),
    ("ema_decay", -0.1, "ema_decay must be in [0, 1)"),
    ("ema_every", 0, "ema_every must be >= 1 (got 0)"),
    ("ema_repeats", -1, "ema_repeats must be >= 0 (0 = once per training batch, as Flow-GRPO; got -1)"),
])
def test_bad_settings_are_refused(key, value, needle):
    with pytest.raises(UserError) as err:
        config_from_dict({**TINY, key: value})
    assert needle in str(err.value)
