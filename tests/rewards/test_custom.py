"""Weighted and custom rewards (issue 29): ``reward: {toy_aesthetic: 0.7, mymod:fn: 0.3}`` in configs
and study specs (each component logged as its own column), ``module:function`` factories and
``pcpo_eval.rewards`` entry-point plug-ins, with the built-ins' conventions and one-line errors."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.rewards import (
    WeightedReward,
    component_column,
    make_reward,
    options_on_device,
    parse_reward,
    reward_label,
    reward_parts,
)
from pcpo_eval.rewards.toy import colorfulness
from pcpo_eval.train.config import config_from_dict, load_config
from pcpo_eval.train.trainer import Trainer

PLUGIN = '''
import torch

def redness(scale=1.0, device="cpu"):
    """A reward factory in the built-ins' style: options as keywords, returns fn(images, prompts)."""
    def fn(images, prompts):
        return scale * images[:, 0].float().mean(dim=(1, 2)) / 255.0
    return fn

def as_list(**_):
    return lambda images, prompts: [0.5] * images.shape[0]

def bad_shape(**_):
    return lambda images, prompts: torch.zeros(images.shape[0], 2)

def not_numbers(**_):
    return lambda images, prompts: "high"

BUILT_ON = []

def where(device="unset"):
    """Records the device it was built for."""
    BUILT_ON.append(str(device))
    return lambda images, prompts: torch.zeros(images.shape[0])

def no_device():
    return lambda images, prompts: torch.zeros(images.shape[0])
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> str:
    """A module ``toy_reward_plugin`` on sys.path, also declared as the entry point ``redness_ep``."""
    (tmp_path / "toy_reward_plugin.py").write_text(PLUGIN)
    info = tmp_path / "toy_reward_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-reward-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[pcpo_eval.rewards]\nredness_ep = toy_reward_plugin:redness\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "toy_reward_plugin"


def _images(n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, 16, 16), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def test_parse_reward_forms_and_errors():
    assert parse_reward(" toy_aesthetic ") == "toy_aesthetic"
    assert parse_reward({"aesthetic": 0.7, "hps": 0.3}) == {"aesthetic": 0.7, "hps": 0.3}
    assert parse_reward("{aesthetic: 0.7, hps: 0.3}") == {"aesthetic": 0.7, "hps": 0.3}  # KEY=VALUE text
    assert reward_label({"aesthetic": 0.7, "hps": 0.3}) == "0.7*aesthetic + 0.3*hps"
    for bad, msg in (("", "reward is empty"), ({}, "a name or a mapping"), ({"a": "x"}, "not a finite number"),
                     ({"a": True}, "not a finite number"), ({"a": float("nan")}, "not a finite number"),
                     ("{a: [", "not a YAML mapping"), (3, "a name or a mapping")):
        with pytest.raises(UserError, match=msg):
            parse_reward(bad)
    assert reward_parts("x", {"device": "cpu"}) == [("x", 1.0, {"device": "cpu"})]
    assert reward_parts({"a": 1.0, "b": 2.0}, {"b": {"k": 1}}) == [("a", 1.0, {}), ("b", 2.0, {"k": 1})]
    with pytest.raises(UserError, match="name no component"):
        reward_parts({"a": 1.0}, {"device": "cpu"})
    assert component_column("toy_reward_plugin:redness") == "reward_toy_reward_plugin_redness_mean"


def test_module_function_and_entry_point(plugin):
    imgs = _images()
    expected = imgs[:, 0].float().mean(dim=(1, 2)) / 255.0
    for name in (f"{plugin}:redness", "redness_ep"):
        fn = make_reward(name, scale=2.0)
        out = fn(imgs, ["p"] * 4)
        assert out.dtype == torch.float32 and out.shape == (4,)
        torch.testing.assert_close(out, 2.0 * expected)
    assert make_reward(f"{plugin}:as_list")(imgs, ["p"] * 4).tolist() == [0.5] * 4  # lists become float32 (B,)
    with pytest.raises(UserError, match=r"returned shape \(4, 2\) for 4 images"):
        make_reward(f"{plugin}:bad_shape")(imgs, ["p"] * 4)
    with pytest.raises(UserError, match="returned str"):
        make_reward(f"{plugin}:not_numbers")(imgs, ["p"] * 4)
    for name, msg in (("no_such_module_xyz:f", "cannot import module"), (f"{plugin}:nope", "has no 'nope'"),
                      ("nope", "unknown reward 'nope'.*toy_aesthetic.*entry points.*module:function")):
        with pytest.raises(UserError, match=msg):
            make_reward(name)


def test_weighted_sum_and_components(plugin):
    imgs = _images(6, seed=1)
    fn = make_reward({"toy_aesthetic": 0.7, f"{plugin}:redness": 0.3}, **{f"{plugin}:redness": {"scale": 2.0}})
    assert isinstance(fn, WeightedReward)
    out = fn(imgs, ["red circle"] * 6)
    a = (colorfulness(imgs) / 100.0).double()
    r = 2.0 * imgs[:, 0].double().mean(dim=(1, 2)) / 255.0
    torch.testing.assert_close(out.double(), 0.7 * a + 0.3 * r, rtol=1e-5, atol=1e-6)
    assert out.dtype == torch.float32 and set(fn.last_components) == {"toy_aesthetic", f"{plugin}:redness"}
    np.testing.assert_allclose(fn.last_components["toy_aesthetic"], a.numpy(), rtol=1e-6)


def test_configs_accept_weighted_rewards(tmp_path, plugin):
    cfg = load_config(None, ["reward={toy_aesthetic: 0.7, jpeg_compressibility: 0.3}"])
    assert cfg.reward == {"toy_aesthetic": 0.7, "jpeg_compressibility": 0.3}
    path = tmp_path / "c.yaml"
    path.write_text("reward:\n  toy_aesthetic: 0.5\n  toy_reward_plugin:redness: 0.5\nreward_options:\n"
                    "  toy_reward_plugin:redness: {scale: 3.0}\n")
    assert load_config(path).reward_options == {"toy_reward_plugin:redness": {"scale": 3.0}}
    with pytest.raises(UserError, match="reward weight 'hps'"):
        config_from_dict({"reward": {"aesthetic": 0.7, "hps": "high"}})
    with pytest.raises(UserError, match="invalid training config: reward_options key"):
        config_from_dict({"reward": {"toy_aesthetic": 1.0}, "reward_options": {"device": "cpu"}})


def test_trainer_logs_each_component(tmp_path, plugin):
    cfg = config_from_dict(dict(
        model="toy", prompts="toy", epochs=1, sample_steps=3, cfg=3.0, sample_batch_size=4, sample_batches_per_epoch=1,
        train_batch_size=2, gradient_updates=1, learning_rate=1e-4, lora_rank=2, lora_alpha=2.0, device="cpu",
        reward={"toy_aesthetic": 0.7, f"{plugin}:redness": 0.3}, paired_control=True))
    log = Trainer(cfg, tmp_path / "run").run()
    a, r = log["reward_toy_aesthetic_mean"].iloc[0], log["reward_toy_reward_plugin_redness_mean"].iloc[0]
    assert log["reward_mean"].iloc[0] == pytest.approx(0.7 * a + 0.3 * r, rel=1e-5)
    assert np.isfinite(log["control_reward_mean"].iloc[0])
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["reward"] == {"toy_aesthetic": 0.7, f"{plugin}:redness": 0.3}


def test_study_spec_with_weighted_reward(tmp_path, plugin):
    from pcpo_eval.study.spec import load_spec

    spec = yaml.safe_load((Path(__file__).parents[2] / "analysis" / "toy_study.yaml").read_text())
    spec["train"]["overrides"]["reward"] = {"toy_aesthetic": 0.7, f"{plugin}:redness": 0.3}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    sp = load_spec(tmp_path / "s.yaml")  # checks every component's weights backends (a dict is not hashable)
    rewards = {json.dumps(r.train.reward, sort_keys=True) for r in sp.runs}
    assert rewards == {json.dumps({"toy_aesthetic": 0.7, f"{plugin}:redness": 0.3}, sort_keys=True)}
    # a level of the compared factor with another weighted reward: two reward scales, refused by name
    other = {**spec, "design": {"algorithm": {**spec["design"]["algorithm"], "PCPO": {
        **spec["design"]["algorithm"]["PCPO"], "reward": {"toy_aesthetic": 0.5, "toy_alignment": 0.5}}}}}
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(other))
    with pytest.raises(UserError, match=r"trained on different reward \(DDPO \{'toy_aesthetic': 0.7"):
        load_spec(tmp_path / "two.yaml")
    (tmp_path / "bad.yaml").write_text(textwrap.dedent(yaml.safe_dump({**spec, "train": {"overrides": {
        **spec["train"]["overrides"], "reward": {"toy_aesthetic": "x"}}}})))
    with pytest.raises(UserError, match="reward weight 'toy_aesthetic'"):
        load_spec(tmp_path / "bad.yaml")


def test_validation_and_control_log_each_component(tmp_path, plugin):
    """Issue 29: a weighted reward's components are logged in the paired control and the validation
    rows too (``control_reward_<name>_mean``, ``val_reward_<name>_mean``, ``val_control_reward_<name>_mean``)."""
    from pcpo_eval.toy.data import TOY_PROMPTS

    train, val = tmp_path / "train.txt", tmp_path / "val.txt"
    train.write_text("\n".join(TOY_PROMPTS[:30]) + "\n")
    val.write_text("\n".join(TOY_PROMPTS[30:]) + "\n")
    cfg = config_from_dict(dict(
        model="toy", prompts=str(train), epochs=2, sample_steps=3, cfg=3.0, sample_batch_size=4,
        sample_batches_per_epoch=1, train_batch_size=2, gradient_updates=1, learning_rate=1e-4, lora_rank=2,
        lora_alpha=2.0, device="cpu", reward={"toy_aesthetic": 0.7, f"{plugin}:redness": 0.3}, paired_control=True,
        validation_every=1, validation_prompts=str(val), validation_images=3))
    log = Trainer(cfg, tmp_path / "run").run()
    names = ("toy_aesthetic", "toy_reward_plugin_redness")
    for prefix in ("control_reward", "val_reward", "val_control_reward"):
        a, r = (log[f"{prefix}_{n}_mean"] for n in names)
        assert log[f"{prefix}_mean"].to_numpy() == pytest.approx((0.7 * a + 0.3 * r).to_numpy(), rel=1e-5), prefix
    assert log["val_control_reward_toy_aesthetic_mean"].nunique() == 1  # the untrained model: scored once


def test_single_reward_logs_no_component_columns(tmp_path):
    cfg = config_from_dict(dict(
        model="toy", prompts="toy", epochs=1, sample_steps=3, cfg=3.0, sample_batch_size=4, sample_batches_per_epoch=1,
        train_batch_size=2, gradient_updates=1, learning_rate=1e-4, lora_rank=2, lora_alpha=2.0, device="cpu",
        reward="toy_aesthetic", paired_control=True))
    log = Trainer(cfg, tmp_path / "run").run()
    assert not [c for c in log.columns if c.startswith(("reward_toy", "control_reward_toy"))]


def test_rewards_are_built_on_the_training_device_unless_options_name_one(plugin, tmp_path):
    """A factory that declares ``device`` gets the trainer's (ddpo-pytorch scores on the accelerator's
    device); an explicit ``device`` is kept; a factory without the parameter gets nothing."""
    assert options_on_device(f"{plugin}:where", {}, "cuda:1") == {"device": "cuda:1"}
    assert options_on_device(f"{plugin}:where", {"device": "cpu"}, "cuda:1") == {"device": "cpu"}
    assert options_on_device(f"{plugin}:no_device", None, "cuda:1") == {}
    assert options_on_device("no_such_reward", {"a": 1}, "cuda:1") == {"a": 1}  # make_reward's error to give
    mixed = {"aesthetic": 0.5, f"{plugin}:no_device": 0.5}
    assert options_on_device(mixed, {"aesthetic": {"batch_size": 8}}, "cuda:1") == {
        "aesthetic": {"batch_size": 8, "device": "cuda:1"}, f"{plugin}:no_device": {}}
    # every built-in that runs a network declares it (so none is left on the host of a GPU run)
    for name in ("aesthetic", "hps", "hps_v20", "pickscore", "imagereward", "clipscore", "vlm_bertscore", "ocr",
                 "toy_alignment"):
        assert options_on_device(name, {}, "cuda") == {"device": "cuda"}, name
    for name in ("jpeg_compressibility", "toy_aesthetic", "llava_bertscore"):  # no network of their own here
        assert options_on_device(name, {}, "cuda") == {}, name
    import toy_reward_plugin

    cfg = load_config("train/configs/toy_ddpo.yaml", [f"reward={plugin}:where", "epochs=1", "log_to=none"])
    Trainer(cfg, tmp_path / "run")
    assert toy_reward_plugin.BUILT_ON[-1] == "cpu"  # the trainer's device, not the factory's "unset"
    from pcpo_eval.metrics.extract import load_reward  # the metrics' preference scores: the pass's device

    load_reward(f"{plugin}:where", {}, device="cuda:0")
    assert toy_reward_plugin.BUILT_ON[-1] == "cuda:0"
    load_reward(f"{plugin}:where", {"device": "cpu"}, device="cuda:0")
    assert toy_reward_plugin.BUILT_ON[-1] == "cpu"


def test_an_option_the_factory_does_not_take_is_one_line_before_anything_loads():
    from pcpo_eval.rewards import make_reward

    with pytest.raises(UserError, match=r"reward 'vlm_bertscore' has no option 'foo'; its options: captioner, "):
        make_reward("vlm_bertscore", foo=1)
    with pytest.raises(UserError, match=r"reward 'vlm_bertscore' has no option 'q'"):  # per component
        make_reward({"jpeg_compressibility": 0.5, "vlm_bertscore": 0.5}, vlm_bertscore={"q": 1})
    # the built-in factories name their options, so a misspelt one is refused (they took **options: a typo
    # in reward_options trained on the defaults); a plug-in factory with **options still takes any
    with pytest.raises(UserError, match=r"reward 'jpeg_compressibility' has no option 'anything'; its options: none"):
        make_reward("jpeg_compressibility", anything=1)
    with pytest.raises(UserError, match=r"reward 'toy_aesthetic' has no option 'nope'"):
        make_reward("toy_aesthetic", nope=1)
