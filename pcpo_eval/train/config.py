"""Training configuration: one typed dataclass, loaded from YAML, validated, saved with every run.

Keys are flat (``epochs=2 objective=pcpo`` on the command line). Unknown keys are rejected with
the list of valid ones (nanoGPT's "Unknown config key"). Defaults follow DDPO's ``config/base.py``
where the paper does not say otherwise; every field is commented.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pcpo_eval.credit.ddim import CONVENTIONS, DEFAULT_CONVENTION, DEFAULT_FALLBACK, FALLBACKS
from pcpo_eval.credit.flow import FLOW_SDES, KL_FORMS, STEP_WEIGHTINGS, T1_CONVENTIONS
from pcpo_eval.errors import UserError
from pcpo_eval.io import check_finite, parse_overrides, read_yaml_mapping, yaml_safe_load
from pcpo_eval.rewards import parse_reward, reward_parts
from pcpo_eval.seeding import seed_problem
from pcpo_eval.train.advantages import ADV_STDS
from pcpo_eval.train.objectives import OBJECTIVES
from pcpo_eval.train.tracking import WANDB_MODES, parse_log_to

ADVANTAGES = ("per_prompt", "group")
PRECISIONS = ("no", "fp16", "bf16")
FROZEN_WEIGHTS = ("fp32", "autocast")  #: where a LoRA run keeps its frozen denoiser weights (``frozen_weights``)
FLOW_GRIDS = ("auto", "shifted", "scheduler")  # samplers.flow.GRIDS (kept here: no torch import)


#: config keys ``--resume`` lets differ from the run's config.yaml (neither changes what is trained)
RESUME_MAY_CHANGE = ("epochs", "device", "keep_checkpoints", "deterministic", "compile", "allow_tf32",
                     "train_steps_per_forward")


@dataclass
class TrainConfig:
    # --- model and task -------------------------------------------------------------------
    model: str = "toy"  #: model spec for pcpo_eval.models.registry.load_model (toy, sd1:PATH, ...)
    prompts: str = "toy"  #: prompt set name or file (pcpo_eval.prompts)
    #: reward: a registry name, a plug-in, "module:function", or a weighted sum {name: weight, ...}
    #: (pcpo_eval.rewards.make_reward; docs/training.md#rewards)
    reward: str | dict[str, float] = "jpeg_compressibility"
    #: kwargs for the reward factory (a weighted sum: keyed by component name)
    reward_options: dict[str, Any] = field(default_factory=dict)
    objective: str = "ppo_clip"  #: ppo_clip | log_hinge | eps_matching | pcpo (ablation ladder)
    seed: int = 0  #: every random draw derives from (seed, epoch, rank, index)
    epochs: int = 10
    # --- sampling -------------------------------------------------------------------------
    sample_steps: int = 20  #: DDIM inference steps (SD setups: 50)
    sample_eta: float = 1.0  #: DDIM eta (> 0: log-probabilities need noise)
    cfg: float = 5.0  #: classifier-free guidance weight, in sampling and training (DDPO)
    sample_batch_size: int = 16  #: images per sampling batch, per process
    sample_batches_per_epoch: int = 2  #: sampling batches per epoch, per process
    #: score each sampling batch in a background thread while the next one samples (ddpo-pytorch's reward
    #: executor): a server reward's latency (``llava_bertscore``) or a host reward's CPU time hides behind
    #: sampling. The reward is then called per sampling batch instead of once per epoch: the same scores
    #: when an image's score does not depend on the other images of its call (per-image rewards; batched
    #: networks within float rounding)
    reward_overlap: bool = False
    credit_convention: str = DEFAULT_CONVENTION  #: weight convention of PCPO's sigma~: residual | unit (credit.ddim.CONVENTIONS)
    credit_fallback: str = DEFAULT_FALLBACK  #: steps sigma~ cannot bring to w*: cap | exclude | nearest | native
    # --- flow-matching models (prediction == "velocity"; samplers/flow.py) -----------------
    sde: str = "dance"  #: dance (DanceGRPO, sigma = eta) | flowgrpo (sigma_t = eta sqrt(t/(1-t)))
    flow_shift: float = 3.0  #: time shift of the ``shifted`` grid (DanceGRPO FLUX: 3)
    flow_grid: str = "auto"  #: auto (shifted for dance, the model's scheduler for flowgrpo) | shifted | scheduler
    flow_t1: str = "neighbor"  #: Flow-GRPO t=1 weight convention for PCPO's zeta (credit.T1_CONVENTIONS)
    #: feed velocity models DanceGRPO's int(1000 t)/1000 in sampling and training (train_grpo_flux.py);
    #: DDIM's model times are integer timesteps already (no effect on eps models)
    model_time_quantize: bool = False
    #: per-step weight inside the decomposed hinge: native (the objective's own: w(t_i), or PCPO's
    #: zeta*dt_i) | uniform_high_noise (the constant zeta/N at every step, paper Fig. naive-acceleration
    #: c-d, setup 10; velocity models, objective eps_matching or pcpo; credit.flow.STEP_WEIGHTINGS)
    step_weighting: str = "native"
    # --- advantages -----------------------------------------------------------------------
    advantage: str = "per_prompt"  #: per_prompt (DDPO stat tracker) | group (GRPO)
    images_per_prompt: int = 4  #: group size for advantage=group (prompts per epoch = images/this)
    #: advantage=group: group = (r - mean_G) / (std_G + 1e-8), unbiased std per group (DanceGRPO);
    #: batch = (r - mean of the prompt's rewards) / (population std of ALL gathered rewards + 1e-4),
    #: groups by prompt string (Flow-GRPO's PerPromptStatTracker with global_std)
    adv_std: str = "group"
    drop_zero_advantage: bool = False  #: train only samples with advantage != 0 (Flow-GRPO; docs/credit.md)
    same_noise_per_group: bool = False  #: DanceGRPO-SD: one initial latent per prompt group
    stat_buffer_size: int = 32  #: DDPO per-prompt tracker buffer
    stat_min_count: int = 16  #: DDPO per-prompt tracker minimum count
    adv_clip_max: float = 5.0  #: clamp advantages to +-this
    # --- training -------------------------------------------------------------------------
    train_batch_size: int = 8  #: samples per backward micro-batch, per process
    #: speed only: each update forward evaluates this many of every micro-batch sample's selected steps
    #: at once (train_batch_size x this rows, x2 with CFG), step-major; the same per-step losses and the
    #: same accumulated gradient as one forward per step (ddpo-pytorch, DanceGRPO, Flow-GRPO), values
    #: within float rounding. Fewer, larger calls: less host work per trained step where the update is
    #: bound by op dispatch (a GPU); activation memory grows with it (docs/gpu.md)
    train_steps_per_forward: int = 1
    gradient_updates: int = 2  #: optimizer steps per epoch (paper table "Gradient updates")
    num_inner_epochs: int = 1  #: passes over each epoch's samples
    timestep_fraction: float = 1.0  #: fraction of sampled steps trained (per-sample shuffled)
    train_last_step: bool = True  #: DanceGRPO never trains the last step (False)
    #: steps whose transition std (DDIM: sigma_t; flow SDE: sigma_t sqrt(dt)) is below this are not
    #: trained (0 = all, DDPO). Measured on the toy model (benchmarks/bench_toy_regime.py): the 8-step
    #: schedule's last steps (sigma ~0.01) make log-ratios hypersensitive (ratios down to 1e-31 per
    #: update) while their noise cannot move the reward
    train_min_sigma: float = 0.0
    clip_range: float = 1e-4  #: xi
    learning_rate: float = 1e-4
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_weight_decay: float = 1e-4
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    beta_kl: float = 0.0  #: KL penalty on the step means against the base model (0 = off)
    #: KL form in the loss: paper (||mu - mu_ref||^2 / (2 std^2), std = sigma_t sqrt(dt)) | flowgrpo_code
    #: (/ (2 sigma_t^2), Flow-GRPO's train_sd3.py); both are logged (kl_ref_<form>) when beta_kl > 0
    kl_form: str = "paper"
    cfg_detach_uncond: bool = False  #: no gradient through the unconditional CFG branch in training (Flow-GRPO)
    lora_rank: int = 4  #: 0 = full fine-tune
    lora_alpha: float = 4.0
    #: no | fp16 | bf16 autocast (CUDA; bf16 also on CPU, fp16 ignored there); fp16 adds dynamic loss scaling
    #: (torch.amp.GradScaler), as accelerate's fp16 mixed precision in ddpo-pytorch
    mixed_precision: str = "no"
    #: fp32 (default): the frozen denoiser weights of a LoRA run stay float32 and autocast casts them at
    #: every call. autocast: they are stored in the autocast dtype (fp16 / bf16) once, as ddpo-pytorch,
    #: DanceGRPO and Flow-GRPO keep non-trainable weights in their ``inference_dtype``: no cast per call
    #: (fewer kernels, half the weight memory); the LoRA weights stay float32. Needs ``lora_rank > 0`` and
    #: ``mixed_precision`` fp16 / bf16; a no-op where autocast is (fp16 on a CPU)
    frozen_weights: str = "fp32"
    #: CUDA only. false (default): the fastest kernels, as ddpo-pytorch / DanceGRPO / Flow-GRPO run; a
    #: resumed run then drifts from an uninterrupted one by ~1e-4 in reward after an update. true:
    #: deterministic kernels (cuDNN deterministic algorithms, no autotuning, PyTorch's deterministic ops, a
    #: fixed cuBLAS workspace), so a resumed run equals an uninterrupted one bit for bit, at 1.43x the
    #: epoch time of setup 2 on an H200 (docs/gpu.md). Process-wide, set before the first CUDA call.
    deterministic: bool = False
    #: CUDA only: TF32 tensor cores for the float32 matrix products and convolutions of sampling and the
    #: update (``precision.matmul_precision("tf32")``), as ddpo-pytorch's ``config.allow_tf32 = True``;
    #: false: true fp32 (TF32 off for cuDNN too, which PyTorch's default would allow). No effect on a CPU
    allow_tf32: bool = True
    #: torch.compile the denoiser in place (``nn.Module.compile``: same module, state dict and LoRA
    #: switches) for sampling and the update; speed only (other kernels: values agree within tolerance,
    #: not bitwise); the first epoch pays the compilation. CUDA is where it pays (docs/gpu.md)
    compile: bool = False
    checkpoint_every: int = 1  #: save every N epochs (and at the last epoch)
    #: after each save keep only the newest N checkpoints (0 = keep all). Whatever N, only the newest
    #: checkpoint keeps the optimizer / training state (resume); older ones hold weights + metadata
    keep_checkpoints: int = 0
    #: the paper's images per iteration over ALL processes (Table master-hyperparams "Images per
    #: iteration"); the trainer refuses a launch whose processes x sample_batch_size x
    #: sample_batches_per_epoch differs (:meth:`total_batch_problem`). 0: no stated total.
    paper_total_batch: int = 0
    #: also sample the UNTRAINED model each epoch on the same prompts and noises (same keyed
    #: generators, same sampler and schedule) and log its reward as ``control_reward_mean``: the
    #: paired control that separates learning from the sampler and from which prompts were drawn
    paired_control: bool = False
    # --- diagnostics, validation, initialisation (docs/training.md#diagnostics) -----------------------
    #: log the Taylor error of log rho ~ rho - 1 and the dot-product / squared-norm terms of Eq. Delta
    #: (their ratio at the first off-policy update: Fig. on-policy-justification) per update
    diagnostics: bool = False
    validation_every: int = 0  #: held-out reward every N epochs and at the last (0 = off; Flow-GRPO: 50)
    validation_prompts: str = ""  #: prompt set name or file (as ``prompts``), disjoint from the training prompts
    validation_images: int = 0  #: images per validation (image i: prompt i mod P); 0 = one per prompt
    #: sampler steps of a validation (0 = ``sample_steps``; Flow-GRPO evaluates with ``eval_num_steps`` 40 where it
    #: samples with 10: config/grpo.py)
    validation_steps: int = 0
    #: a moving average of the trainable weights, what validation scores and checkpoints hold (sampling for
    #: training keeps the raw weights): 0 = none; Flow-GRPO: 0.9 (``train.ema``; pcpo_eval/train/ema.py)
    ema_decay: float = 0.0
    ema_every: int = 8  #: average every N optimizer steps (Flow-GRPO's update_step_interval 8)
    #: updates at each averaging step: 0 = once per micro-batch of the next accumulation window, as Flow-GRPO's
    #: script calls it (so as many as this process's micro-batches per optimizer step, which the launch
    #: changes); N = N updates right after the step, whatever the launch (train/ema.py)
    ema_repeats: int = 0
    #: start from these weights (a checkpoint / run directory of pcpo-eval, or a diffusers / LoRA
    #: .safetensors file) at epoch 1 with a fresh optimizer; "" = the base model
    init_from: str = ""
    # --- experiment tracking (pcpo_eval/train/tracking.py; docs/training.md#experiment-tracking) ---
    log_to: str = "tensorboard"  #: comma-separated: tensorboard, wandb, trackio ("" / none: log.parquet only)
    log_project: str = "pcpo-eval"  #: W&B / trackio project name (the run name is the run directory's name)
    log_images_every: int = 1  #: sample-image grid every N epochs (0 = never)
    wandb_mode: str = "offline"  #: offline (default: nothing leaves the machine) | online | disabled
    device: str = "auto"  #: auto | cpu | cuda | cuda:N

    # ---------------------------------------------------------------------------------------
    def validate(self) -> TrainConfig:
        """Check ranges and consistency; raise UserError naming every problem found."""
        problems: list[str] = []

        def need(cond: bool, msg: str) -> None:
            if not cond:
                problems.append(msg)

        bad = [f"{k}={v}" for k, v in self.to_dict().items()
               if isinstance(v, float) and not math.isfinite(v)]
        need(not bad, f"non-finite values {', '.join(bad)}; every number must be finite")
        need(self.objective in OBJECTIVES, f"objective={self.objective!r} (choose {', '.join(OBJECTIVES)})")
        try:
            parse_log_to(self.log_to)
        except UserError as exc:
            problems.append(str(exc))
        try:
            reward_parts(parse_reward(self.reward), self.reward_options)
        except UserError as exc:
            problems.append(str(exc))
        need(self.wandb_mode in WANDB_MODES, f"wandb_mode={self.wandb_mode!r} (choose {', '.join(WANDB_MODES)})")
        need(self.log_images_every >= 0, f"log_images_every={self.log_images_every} must be >= 0 (0 = never)")
        need(self.advantage in ADVANTAGES, f"advantage={self.advantage!r} (choose {', '.join(ADVANTAGES)})")
        need(self.mixed_precision in PRECISIONS, f"mixed_precision={self.mixed_precision!r} (choose {', '.join(PRECISIONS)})")
        need(self.frozen_weights in FROZEN_WEIGHTS,
             f"frozen_weights={self.frozen_weights!r} (choose {', '.join(FROZEN_WEIGHTS)})")
        need(self.frozen_weights == "fp32" or (self.lora_rank > 0 and self.mixed_precision != "no"),
             "frozen_weights=autocast needs a LoRA run (lora_rank > 0) with mixed_precision fp16 or bf16; "
             "set frozen_weights=fp32")
        for key, choices in (("credit_convention", CONVENTIONS), ("credit_fallback", FALLBACKS),
                             ("kl_form", KL_FORMS), ("adv_std", ADV_STDS)):
            need(getattr(self, key) in choices, f"{key}={getattr(self, key)!r} (choose {', '.join(choices)})")
        need(self.sde in FLOW_SDES, f"sde={self.sde!r} (choose {', '.join(FLOW_SDES)})")
        need(self.flow_grid in FLOW_GRIDS, f"flow_grid={self.flow_grid!r} (choose {', '.join(FLOW_GRIDS)})")
        need(self.flow_t1 in T1_CONVENTIONS, f"flow_t1={self.flow_t1!r} (choose {', '.join(T1_CONVENTIONS)})")
        need(self.flow_shift > 0, f"flow_shift must be > 0 (got {self.flow_shift})")
        for name in ("epochs", "sample_steps", "sample_batch_size", "sample_batches_per_epoch", "train_batch_size",
                     "train_steps_per_forward", "gradient_updates", "num_inner_epochs", "checkpoint_every"):
            need(int(getattr(self, name)) >= 1, f"{name} must be >= 1 (got {getattr(self, name)})")
        need(self.sample_eta > 0, f"sample_eta must be > 0 for log-probabilities (got {self.sample_eta})")
        need(0 < self.timestep_fraction <= 1, f"timestep_fraction must be in (0, 1] (got {self.timestep_fraction})")
        need(self.clip_range > 0, f"clip_range must be > 0 (got {self.clip_range})")
        need(self.learning_rate > 0, f"learning_rate must be > 0 (got {self.learning_rate})")
        need(self.lora_rank >= 0, f"lora_rank must be >= 0 (got {self.lora_rank})")
        need(self.beta_kl >= 0, f"beta_kl must be >= 0 (got {self.beta_kl})")
        need(int(self.keep_checkpoints) >= 0,
             f"keep_checkpoints must be >= 0 (0 = keep every checkpoint; got {self.keep_checkpoints})")
        need(int(self.paper_total_batch) >= 0, f"paper_total_batch must be >= 0 (0: none stated; got {self.paper_total_batch})")
        need(self.train_min_sigma >= 0, f"train_min_sigma must be >= 0 (got {self.train_min_sigma})")
        need(0 <= self.ema_decay < 1, f"ema_decay must be in [0, 1) (0 = no moving average; got {self.ema_decay})")
        need(int(self.ema_every) >= 1, f"ema_every must be >= 1 (got {self.ema_every})")
        need(int(self.ema_repeats) >= 0, f"ema_repeats must be >= 0 (0 = once per training batch, as Flow-GRPO; "
                                         f"got {self.ema_repeats})")
        problems += self._optimizer_problems()
        problems += self._extension_problems()
        n = self.samples_per_epoch
        if self.sample_batch_size >= 1 and self.train_batch_size >= 1:
            need(n % self.train_batch_size == 0,
                 f"train_batch_size={self.train_batch_size} must divide the {n} samples per epoch "
                 f"(sample_batch_size x sample_batches_per_epoch)")
            if self.train_batch_size >= 1 and n % self.train_batch_size == 0 and self.gradient_updates >= 1:
                need((n // self.train_batch_size) % self.gradient_updates == 0,
                     f"gradient_updates={self.gradient_updates} must divide the {n // self.train_batch_size} "
                     f"micro-batches per epoch")
        if self.advantage == "group":
            need(self.images_per_prompt >= 2, "images_per_prompt must be >= 2 for advantage=group")
            need(n % max(self.images_per_prompt, 1) == 0,
                 f"images_per_prompt={self.images_per_prompt} must divide the {n} samples per epoch")
        if self.same_noise_per_group:
            need(self.advantage == "group", "same_noise_per_group needs advantage=group")
        if self.adv_std != "group":
            need(self.advantage == "group", f"adv_std={self.adv_std} needs advantage=group")
        if problems:
            raise UserError("invalid training config: " + "; ".join(problems))
        return self

    def _optimizer_problems(self) -> list[str]:
        """Problems of the seed, device, optimiser, clipping, LoRA and stat-tracker keys (each used to pass
        validation and then end in a traceback, or train with a flipped or zeroed update)."""
        out: list[str] = []

        def need(cond: bool, msg: str) -> None:
            if not cond:
                out.append(msg)

        need((bad_seed := seed_problem("seed", int(self.seed))) is None, str(bad_seed))
        need(re.fullmatch(r"auto|(cpu|cuda)(:\d+)?", str(self.device)) is not None,
             f"device={self.device!r} (choose auto, cpu, cuda or cuda:N)")
        for name in ("adam_beta1", "adam_beta2"):
            need(0 <= getattr(self, name) < 1, f"{name} must be in [0, 1) (got {getattr(self, name)})")
        need(self.adam_epsilon >= 0, f"adam_epsilon must be >= 0 (got {self.adam_epsilon})")
        need(self.adam_weight_decay >= 0, f"adam_weight_decay must be >= 0 (got {self.adam_weight_decay})")
        need(self.max_grad_norm > 0, f"max_grad_norm must be > 0 (got {self.max_grad_norm}; a huge value such as 1e9 "
             "turns clipping off)")
        need(self.adv_clip_max > 0, f"adv_clip_max must be > 0 (got {self.adv_clip_max}; advantages are clamped to "
             "+-adv_clip_max)")
        need(int(self.stat_buffer_size) >= 1, f"stat_buffer_size must be >= 1 (got {self.stat_buffer_size})")
        need(int(self.stat_min_count) >= 0, f"stat_min_count must be >= 0 (got {self.stat_min_count})")
        if int(self.lora_rank) > 0:
            need(self.lora_alpha > 0, f"lora_alpha must be > 0 with lora_rank={self.lora_rank} (got {self.lora_alpha}; "
                 "the adapter's scale is lora_alpha / lora_rank)")
        return out

    def _extension_problems(self) -> list[str]:
        """Problems of the step-weighting, validation and init_from keys."""
        out: list[str] = []
        if self.step_weighting not in STEP_WEIGHTINGS:
            out.append(f"step_weighting={self.step_weighting!r} (choose {', '.join(STEP_WEIGHTINGS)})")
        elif self.step_weighting != "native":
            if self.objective not in ("eps_matching", "pcpo"):
                out.append(f"step_weighting={self.step_weighting} reweights the decomposed hinge (Eq. logrho-flow); "
                           f"use objective=pcpo or eps_matching (got {self.objective})")
            if _prediction(self.model) == "eps":
                out.append(f"step_weighting={self.step_weighting} is defined for flow SDEs (velocity models); for "
                           "DDIM the uniform weight is PCPO itself (objective=pcpo)")
        if int(self.validation_every) < 0:
            out.append(f"validation_every must be >= 0 (got {self.validation_every})")
        if int(self.validation_images) < 0:
            out.append(f"validation_images must be >= 0 (got {self.validation_images})")
        if int(self.validation_steps) < 0:
            out.append(f"validation_steps must be >= 0 (got {self.validation_steps}); 0 = sample_steps")
        if int(self.validation_every) > 0 and not str(self.validation_prompts).strip():
            out.append("validation_every > 0 needs validation_prompts (a prompt set disjoint from the training prompts)")
        return out

    def total_batch_problem(self, world: int) -> str | None:
        """Why ``world`` processes would not train on ``paper_total_batch`` images per iteration (with the
        fix), or None. Batch sizes are per process, so a launcher multiplies them."""
        want, per = int(self.paper_total_batch), int(self.sample_batch_size)
        got = int(world) * self.samples_per_epoch
        if want <= 0 or got == want:
            return None
        if want % (int(world) * per) == 0:
            fix = f"add the override sample_batches_per_epoch={want // (int(world) * per)}"
        else:
            fix = (f"{want} is not a multiple of {world} processes x sample_batch_size {per}: launch a process count "
                   f"that divides {want // per if want % per == 0 else want}, or change sample_batch_size")
        return (f"this launch trains on {world} process(es) x {per} x {self.sample_batches_per_epoch} = {got} images "
                f"per iteration, but the config states the paper's total paper_total_batch={want} (batch sizes are per "
                f"process); {fix}, or paper_total_batch=0 to train a different total on purpose")

    @property
    def samples_per_epoch(self) -> int:
        """Images sampled per epoch per process."""
        return int(self.sample_batch_size) * int(self.sample_batches_per_epoch)

    def sigma_schedule(self) -> str:
        """PCPO samples with the re-solved sigma~ schedule; every other objective with DDIM's."""
        return "pcpo" if self.objective == "pcpo" else "ddim"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def convention_keys(cfg: TrainConfig) -> tuple[str, ...]:
    """Keys whose value picks between the paper's and a reference codebase's convention, so a shipped
    config must state them explicitly (docs/credit.md; tests/credit/test_conventions.py).

    eps (DDIM) models: ``credit_convention``, ``credit_fallback`` (PCPO's sigma~, also for configs whose
    PCPO arm is ``objective=pcpo``). Velocity models: ``sde``, ``kl_form``, ``cfg_detach_uncond``,
    ``drop_zero_advantage``, ``model_time_quantize``, and ``flow_t1`` and ``ema_decay`` (Flow-GRPO's
    moving average of the weights, which the paper does not state) for the Flow-GRPO SDE. GRPO group
    advantages: ``adv_std``.
    """
    from pcpo_eval.models.registry import prediction_of

    if prediction_of(cfg.model) == "eps":
        keys = ["credit_convention", "credit_fallback"]
    else:
        keys = ["sde", "kl_form", "cfg_detach_uncond", "drop_zero_advantage", "model_time_quantize"]
        keys += ["flow_t1", "ema_decay"] if cfg.sde == "flowgrpo" else []
    keys += ["adv_std"] if cfg.advantage == "group" else []
    return tuple(keys)


def _prediction(model: str) -> str | None:
    """The model spec's prediction type, or None when the spec is unknown (reported where it is loaded)."""
    from pcpo_eval.models.registry import prediction_of

    try:
        return prediction_of(model)
    except UserError:
        return None


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def _coerce(key: str, value: Any) -> Any:
    """Convert a YAML/CLI value to the field's type, or raise a UserError naming the key.

    A YAML 1.1 boolean (``yes``/``no``/``on``/``off``) is not a number (``lora_rank: no`` read as 0
    turned a LoRA run into a full fine-tune), a boolean is only ``true``/``false`` (or 1/0), and a
    list or mapping is not a string.
    """
    hint = _HINTS[key]
    if key == "reward":
        return parse_reward(value)
    name = getattr(hint, "__name__", str(hint))
    if isinstance(value, bool) and hint in (int, float):
        raise UserError(f"config key {key}: {str(value).lower()} (YAML reads yes/no/on/off as true/false) is not "
                        f"{'an' if hint is int else 'a'} {name}; {_WRITE[name]}")
    try:
        if hint is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes"):
                    return True
                if value.lower() in ("false", "0", "no"):
                    return False
                raise ValueError(value)
            if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
                return bool(value)
            raise ValueError(value)
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if hint is float:
            return float(value)
        if hint is str:
            if isinstance(value, bool):  # YAML 1.1 reads a bare no / off / yes as a boolean
                return {False: "no", True: "yes"}[value] if key == "mixed_precision" else str(value).lower()
            if isinstance(value, list | dict) or value is None:
                raise ValueError(value)
            return str(value)
        if isinstance(value, str):
            value = yaml_safe_load(value)
        if not isinstance(value, dict):
            raise ValueError(value)
        return value
    except (TypeError, ValueError, yaml.YAMLError):
        raise UserError(f"config key {key}: cannot read {value!r} as {name}; {_WRITE.get(name, 'write one value')}") from None


#: how to write a value of each field type (the fix of a value that does not read as one)
_WRITE = {"bool": "write true or false", "int": "write a whole number", "float": "write a number",
          "str": "write one text value (quoted if it holds ': ' or ' #')", "dict": "write a mapping, e.g. {key: value}"}


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """Build and validate a TrainConfig; unknown keys raise a UserError listing valid ones."""
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        import difflib

        close = {k: m[0] for k in unknown if (m := difflib.get_close_matches(k, _FIELDS, n=1, cutoff=0.75))}
        hint = "; ".join(f"{k}: did you mean {m}?" for k, m in close.items())
        raise UserError(f"unknown config key(s) {', '.join(unknown)}{f' ({hint})' if hint else ''}; "
                        f"valid keys: {', '.join(_FIELDS)}")
    return TrainConfig(**{k: _coerce(k, v) for k, v in data.items()}).validate()


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw key -> value mapping of a YAML train config (validated by :func:`config_from_dict`); an empty
    file is refused (it trained 10 epochs of the library defaults with exit 0: surely not what was meant)."""
    data = read_yaml_mapping(path, "config file", "see train/configs/ for examples")
    if not data:
        raise UserError(f"config file {path} is empty; write the settings to train (e.g. copy "
                        "train/configs/toy_ddpo.yaml)")
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainConfig:
    """Load a YAML config (None = defaults), apply KEY=VALUE overrides, validate."""
    data = read_config_file(path) if path is not None else {}
    data.update(parse_overrides(overrides or []))
    check_finite(data, f"train config {path}" if path is not None else "train config overrides")
    return config_from_dict(data)
