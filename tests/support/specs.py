"""Run the paper's study specs end to end on tiny random stand-ins (not a test module).

:func:`standin_spec` rewrites a spec under ``analysis/`` so that it runs in seconds on a CPU and
keeps everything else: the design (factors, levels, their config files), the compared arms, the
paired controls, the trainer keys of the setup (objective, SDE, advantages, credit conventions,
diagnostics, validation), the metric list and the LMM. What changes:

* the base model: a tiny random pipeline of the same architecture saved locally (SD-1.x UNet,
  SD3 MMDiT, FLUX transformer; :func:`tiny_bases`);
* sizes: 2 epochs, 2 seeds per arm, 2 sampler steps, 4 images per epoch, 2 eval prompts x 2 seeds;
* prompt sets: a 4-line prompt file (the datasets are not on this machine);
* targets: below every reward, so every run is reward-matched;
* FD / IS become overall-only (2 images per prompt cannot define them per prompt);
* real rewards, feature nets and LPIPS's AlexNet: stand-ins installed by :func:`install_standins`
  (the toy classifier's features and layers, a brightness reward), and up-front weight checks off.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = ROOT / "analysis"
PROMPTS = ["a cat", "a red ball", "a dog on a mat", 'a sign that says "hello"']
TINY_TRAIN: dict[str, Any] = {
    "epochs": 2, "checkpoint_every": 1, "sample_steps": 2, "sample_batch_size": 4, "sample_batches_per_epoch": 1,
    "train_batch_size": 2, "gradient_updates": 1, "images_per_prompt": 2, "mixed_precision": "no", "device": "cpu",
    "stat_min_count": 1, "log_to": "none", "paper_total_batch": 0,
}  # fmt: skip


def tiny_bases(root: Path) -> dict[str, str]:
    """Model-kind -> spec of a tiny random pipeline saved under ``root`` (sd1, sd3, flux)."""
    from pcpo_eval.models.flux import tiny_flux_pipeline
    from pcpo_eval.models.sd3 import tiny_sd3_pipeline
    from pcpo_eval.testing import save_tiny_sd1

    save_tiny_sd1(root / "sd1", seed=0)
    tiny_sd3_pipeline(seed=0).save_pretrained(root / "sd3")
    tiny_flux_pipeline(seed=0).save_pretrained(root / "flux")
    return {k: f"{k}:{root / k}" for k in ("sd1", "sd3", "flux")}


def toy_features(**options: Any):
    """Feature-extractor stand-in: the toy classifier (any real extractor's options accepted)."""
    from pcpo_eval.features.toy import ToyExtractor

    return ToyExtractor(device=options.get("device", "cpu"))


def install_standins(monkeypatch) -> None:
    """Stand-ins for every real reward, feature net and LPIPS trunk; up-front weight checks off."""
    import pcpo_eval.features
    import pcpo_eval.rewards
    import pcpo_eval.study.spec
    from pcpo_eval.metrics.base import METRICS
    from pcpo_eval.models.flux import FluxAdapter
    from pcpo_eval.models.registry import REGISTRY
    from pcpo_eval.models.sd3 import SD3Adapter

    for name in list(pcpo_eval.rewards.REGISTRY):
        if not name.startswith(("toy_", "jpeg_")):
            monkeypatch.setitem(pcpo_eval.rewards.REGISTRY, name, "tests.support.metrics:fake_reward")
    for name in ("inception", "dinov2"):
        monkeypatch.setitem(pcpo_eval.features.REGISTRY, name, "tests.support.specs:toy_features")
    monkeypatch.setitem(METRICS, "lpips", dataclasses.replace(METRICS["lpips"], source="toy", backends=()))
    monkeypatch.setattr(pcpo_eval.study.spec, "_check_weights", lambda *a, **k: None)
    # SD3 / FLUX adapters render at the real models' sizes (512 / 720 px) unless told otherwise; the
    # stand-ins are 16x16 pipelines (8x8 latents)
    monkeypatch.setitem(REGISTRY, "sd3", lambda arg, device, dtype: SD3Adapter.from_pretrained(
        arg, device=device, dtype=dtype, resolution=16))
    monkeypatch.setitem(REGISTRY, "flux", lambda arg, device, dtype: FluxAdapter.from_pretrained(
        arg, device=device, dtype=dtype, resolution=16))


def _kind(path: Path) -> str:
    from pcpo_eval.study.spec import load_spec

    return load_spec(path, check_weights=False).base_model.split(":", 1)[0]


def _tiny_epochs(value: Any) -> Any:
    """A stated checkpoint epoch (or per-arm epochs) mapped onto the 2 stand-in epochs, order kept:
    the latest stated epoch -> 2, earlier ones -> 1 (PCPO E120 vs DanceGRPO E180 -> E1 vs E2)."""
    if isinstance(value, dict):
        top = max(value.values())
        return {k: 2 if v == top else 1 for k, v in value.items()}
    return TINY_TRAIN["epochs"]


def standin_spec(name: str, tmp: Path, bases: dict[str, str]) -> Path:
    """``analysis/<name>`` rewritten for the stand-ins (see the module docstring); returns its path."""
    src = ANALYSIS / name
    data = yaml.safe_load(src.read_text())
    prompts = tmp / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    train = data.setdefault("train", {})
    if train.get("config"):
        train["config"] = str((src.parent / train["config"]).resolve())
    over = {**(train.get("overrides") or {}), **TINY_TRAIN, "model": bases[_kind(src)], "prompts": str(prompts)}
    if over.get("validation_every"):
        over |= {"validation_every": 1, "validation_prompts": str(prompts), "validation_images": 2}
    train["overrides"] = over
    for levels in (data.get("design") or {}).values():
        for lv in levels.values():
            if isinstance(lv, dict) and lv.get("config"):
                lv["config"] = str((src.parent / lv["config"]).resolve())
    data["seeds"] = [0, 1]
    data.pop("parallel", None)
    data["targets"], data["select_target"], data["window"] = [-1e9], -1e9, 1
    data["eval"] = {**data.get("eval", {}), "prompts": str(prompts), "seeds": 2, "max_prompts": 2, "steps": 2,
                    "batch_size": 4, "device": "cpu"}
    from pcpo_eval.metrics.base import METRICS

    data["overall_only"] = [m for m in data["metrics"] if METRICS[m].kind in ("fd", "is")]
    data.pop("per_prompt_rank_deficient_ok", None)
    data["metric_options"] = {"batch_size": 4, "is_splits": 1}
    prefs = data.get("preference")
    for pr in (prefs if isinstance(prefs, list) else [prefs] if prefs else []):
        pr |= {"prompts": str(prompts), "max_prompts": 2, "seeds": 1}
        pr.pop("max_prompt_tokens", None)
        if "epochs" in pr:
            pr["epochs"] = _tiny_epochs(pr["epochs"])
    if isinstance(data.get("select_epoch"), dict | int) and not isinstance(data.get("select_epoch"), bool):
        data["select_epoch"] = _tiny_epochs(data["select_epoch"])
    grids = data.get("grid")
    if isinstance(grids, list):  # the paper's named prompts kept (2 of them), 2 seeds, stated epochs mapped
        for g in grids:
            g["prompts"] = g["prompts"][:2] if isinstance(g.get("prompts"), list) else 2
            g["seeds"] = g["seeds"][:2] if isinstance(g.get("seeds"), list) else 2
            if "epochs" in g:
                g["epochs"] = _tiny_epochs(g["epochs"])
    else:
        data["grid"] = {"prompts": 2, "seeds": 2}
    out = tmp / name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out
