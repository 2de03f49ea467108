"""The model card (``README.md``) of an exported run (:mod:`pcpo_eval.train.export`).

Hugging Face front matter (``library_name: diffusers``, tags, ``base_model`` when the base is a Hub
id), how to load the folder, the training settings that define the run (base model, reward,
algorithm, the convention keys of :func:`pcpo_eval.train.config.convention_keys`, seed, sampler),
and, when the run belongs to a study whose ``results.json`` was found, the study's headline, its
verdict rows for the run's cell and the metric values of the run's arm. Numbers are copied from
the files, never recomputed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.rewards import reward_label
from pcpo_eval.rundir import run_dir_of
from pcpo_eval.train.checkpoints import LORA_FILE

OBJECTIVE_NAMES = {"ppo_clip": "PPO clipped surrogate (DDPO / DanceGRPO / Flow-GRPO)", "pcpo": "PCPO",
                   "log_hinge": "log-ratio hinge (ablation)", "eps_matching": "eps matching (ablation)"}


def _num(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _hub_id(model: str) -> str | None:
    """``sd1:CompVis/stable-diffusion-v1-4`` -> the Hub id; local paths and the toy model -> None."""
    arg = model.partition(":")[2]
    if arg.count("/") == 1 and not arg.startswith((".", "/", "~")) and not Path(arg).exists():
        return arg
    return None


def _conventions(cfg: dict[str, Any]) -> dict[str, Any]:
    from pcpo_eval.train.config import config_from_dict, convention_keys

    try:
        keys = convention_keys(config_from_dict(cfg))
    except UserError:
        keys = ("credit_convention", "credit_fallback", "sde", "flow_t1", "kl_form", "adv_std")
    return {k: cfg[k] for k in keys if k in cfg}


def _front_matter(model: str, cfg: dict[str, Any], lora: bool) -> list[str]:
    tags = ["pcpo-eval", "text-to-image", "reinforcement-learning", str(cfg.get("objective", "ppo_clip"))]
    tags += ["lora"] if lora else []
    lines = ["---", "library_name: diffusers", "tags:", *[f"- {t}" for t in tags]]
    hub = _hub_id(model)
    return [*lines, *([f"base_model: {hub}"] if hub else []), "---", ""]


def _usage(model: str, files: list[str]) -> list[str]:
    hub = _hub_id(model) or "PATH_TO_BASE_MODEL"
    lines = ["## Use", "", "```python"]
    if LORA_FILE in files:
        lines += ["from diffusers import DiffusionPipeline", "",
                  f'pipe = DiffusionPipeline.from_pretrained("{hub}")',
                  'pipe.load_lora_weights("THIS_FOLDER")  # pytorch_lora_weights.safetensors']
    sub = next((f.split("/")[0] for f in files if f.startswith(("unet/", "transformer/"))), None)
    if sub is not None:
        cls = "UNet2DConditionModel" if sub == "unet" else "SD3Transformer2DModel  # or FluxTransformer2DModel"
        lines += [f"from diffusers import {cls.split()[0]}", "",
                  f'{sub} = {cls.split()[0]}.from_pretrained("THIS_FOLDER", subfolder="{sub}")']
    lines += ["```", ""]
    if model.split(":", 1)[0] in ("toy", "toyflow"):
        lines += ["The embedded toy model: `unet/` is the trained denoiser; its text encoder and the latent <-> pixel "
                  "mapping ship with pcpo-eval (`pcpo_eval.toy`, docs/toy-world.md).", ""]
    return lines


def _training_rows(meta: dict[str, Any], cfg: dict[str, Any], model: str) -> list[tuple[str, Any]]:
    obj = str(cfg.get("objective", "ppo_clip"))
    adv = str(cfg.get("advantage", "per_prompt"))
    rows = [
        ("base model", f"`{model}`"),
        ("reward", f"`{reward_label(cfg.get('reward', '?'))}`" + (
            f" (options `{json.dumps(cfg['reward_options'], sort_keys=True)}`)" if cfg.get("reward_options") else "")),
        ("algorithm", f"{OBJECTIVE_NAMES.get(obj, obj)}; advantages: {adv}"
         + (f", {cfg.get('images_per_prompt')} images per prompt" if adv == "group" else "")),
        ("conventions", ", ".join(f"`{k}: {v}`" for k, v in _conventions(cfg).items()) or "–"),
        ("training seed", cfg.get("seed", "–")),
        ("exported epoch", f"{meta.get('epoch')} of {cfg.get('epochs', '?')}"),
        ("training reward at that epoch", _num(meta.get("reward_mean"))),
        ("sampler", f"{cfg.get('sample_steps', '?')} steps, eta {cfg.get('sample_eta', '?')}, CFG {cfg.get('cfg', '?')}"),
        ("fine-tuning", f"LoRA rank {cfg.get('lora_rank')}, alpha {cfg.get('lora_alpha')}" if cfg.get("lora_rank")
         else "full weights"),
        ("optimizer", f"AdamW, learning rate {cfg.get('learning_rate', '?')}, clip range {cfg.get('clip_range', '?')}"),
        ("prompts", f"`{cfg.get('prompts', '?')}`"),
    ]
    return rows


def _study_lines(results: dict[str, Any], run_name: str) -> list[str]:
    """The study's headline, its verdict rows (the run's cell) and the arm's metric values."""
    st = results.get("study") or {}
    me = next((r for r in results.get("runs") or [] if str(r.get("run")) == run_name), None)
    cell, arm = (str(me.get("cell")), str(me.get("arm"))) if me else (None, None)
    lines = ["## Study", "", f"Study `{st.get('name', '?')}`" + (f": this run is arm **{arm}**, cell `{cell}`, "
                                                               f"seed {me.get('seed')}." if me else ".")]
    if results.get("headline"):
        lines += ["", f"> {results['headline']}"]
    rows = [v for v in results.get("verdict") or [] if cell is None or str(v.get("cell")) == cell]
    if rows:
        lines += ["", "| comparison | quantity | estimate | 95% CI | p (adjusted) | verdict |", "|---|---|---|---|---|---|"]
        for v in rows:
            p = _num(v.get("p_adjusted")) if v.get("estimable") else f"not estimable: {v.get('reason')}"
            lines.append(f"| {v.get('treatment')} vs {v.get('baseline')} | {v.get('quantity')} | {_num(v.get('estimate'))} "
                         f"| [{_num(v.get('ci_low'))}, {_num(v.get('ci_high'))}] | {p} | {v.get('sentence', '')} |")
    raw = [r for r in (results.get("raw_scores") or {}).get("rows") or []
           if arm is not None and str(r.get("method")) == arm and str(r.get("cell")) == cell]
    labels = results.get("metric_labels") or {}
    for r in raw:
        vals = ", ".join(f"{labels.get(m, m)} {_num(x)}" for m, x in (r.get("values") or {}).items())
        lines += ["", f"Metrics of arm {arm} (mean over its {r.get('n_runs')} run(s) at the study's checkpoints): {vals}."]
    return [*lines, ""]


def model_card(ckpt: Path, meta: dict[str, Any], cfg: dict[str, Any], files: list[str],
               results: dict[str, Any] | None) -> str:
    """The card's Markdown text."""
    model = str(meta.get("model") or cfg.get("model") or "toy")
    run_name = run_dir_of(ckpt).name
    out = _front_matter(model, cfg, LORA_FILE in files)
    out += [f"# {run_name} (epoch {meta.get('epoch')})", "",
            f"A text-to-image model fine-tuned with reinforcement learning by pcpo-eval from `{model}` on the reward `{reward_label(cfg.get('reward', '?'))}`. "
            "Folder written by `pcpo-eval export`; upload it with `hf upload USER/NAME THIS_FOLDER`.", ""]
    out += _usage(model, files)
    out += ["## Training", "", "| setting | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in _training_rows(meta, cfg, model)], ""]
    if results is not None:
        out += _study_lines(results, run_name)
    out += ["## Files", "", *[f"- `{f}`" for f in files], "- `pcpo_eval_export.json`: source checkpoint, sha256 of "
            "every file, the run's full training config", "",
            "## Limitations", "",
            "One training run (one seed) of the named reward: a higher reward is not a better image by itself (reward "
            "models can be exploited). Differences between algorithms are claims about runs; see the study's verdict "
            "(runs as replicates), not this single checkpoint.", ""]
    return "\n".join(out)
