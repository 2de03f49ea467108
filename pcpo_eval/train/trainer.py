"""A compact policy-gradient trainer for diffusion models: DDPO, DanceGRPO-SD and PCPO.

Read :meth:`Trainer.run` top to bottom; each stage lives in its own module and is a method tests can call:

1. ``sample_epoch``   (``rollout.py``) sample trajectories with per-step log-probs with the run's sampler
                      (``training_sampler``: the :class:`~pcpo_eval.samplers.base.Sampler` contract's
                      ``for_training``: DDIM, or PCPO's sigma~; for velocity models the DanceGRPO /
                      Flow-GRPO SDE), CFG as DDPO; rewards; advantages (DDPO per-prompt tracker or GRPO
                      groups).
2. ``train_epoch``    (``update.py``) per-sample shuffled timesteps (``timestep_fraction``), the selected
                      objective (``objectives.py``), gradient accumulation over samples x timesteps so each
                      of ``gradient_updates`` optimizer steps covers its share; ``step_loss`` asks the
                      sampler (``samplers/base.py``) for log-probs, weights, PCPO's scale and the KL; the
                      optimizer step (``policy.py``: gradient all-reduce across processes, max-grad-norm,
                      AdamW, the fp16 loss scaler).
3. ``save_checkpoint`` LoRA (diffusers format) or full weights + optimizer/tracker state; ``checkpoint.json``
                      records the seed and the run's full config.
4. ``log_epoch``      one row per epoch in ``log.parquet`` and TensorBoard, with PPO health
                      (clipfrac, approx_kl and the log-ratio range per update and per timestep;
                      ``diagnostics.py``).

Paired control (``paired_control: true``): each epoch the UNTRAINED model (LoRA disabled, or the
frozen copy of a full fine-tune) also samples the same prompts with the same keyed generators,
sampler and schedule; its reward is ``control_reward_mean``. At epoch 1 policy and base are equal,
so the two rewards are equal there; afterwards ``reward_mean - control_reward_mean`` is the
learning signal with the prompt draw and the noise cancelled (and a sampler offset shows up as a
difference between arms' controls, not as learning).

Diagnostics and evaluation (docs/training.md): ``diagnostics`` adds the Taylor error of log rho ~
rho - 1 and the Eq. Delta terms per update (``diagnostics.py``; like the other ratio statistics,
from this process's samples); ``validation_every`` scores the policy after the epoch on held-out
prompts with fixed noise and a deterministic sampler (``validation_row``); ``wall_clock_s`` is the
cumulative sampling + training time and ``compute_s`` the run's own compute for it (process CPU
seconds on CPU, so other processes sharing the cores do not inflate it; wall seconds on a GPU); ``init_from`` starts a fresh run from a checkpoint's weights
(the reference policy stays the base model: :data:`INIT_REFERENCE`); ``step_weighting`` swaps the
hinge's per-step scale for the uniform high-noise one (``_credit_scale``).

Randomness: every draw comes from a generator keyed by (seed, epoch, rank, purpose, index), so a
resumed run repeats an uninterrupted one exactly. Multi-process (torchrun / accelerate launch):
``torch.distributed`` with gloo on CPU, nccl on GPU; each process samples its own share, rewards
are gathered for the advantage statistics, gradients are averaged.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml

from pcpo_eval import dist
from pcpo_eval.errors import UserError
from pcpo_eval.io import (
    atomic_write_json,
    atomic_write_parquet,
    atomic_write_text,
    check_own_folder,
    recover_replaced,
)
from pcpo_eval.models.base import ModelAdapter
from pcpo_eval.precision import deterministic_cuda, matmul_precision
from pcpo_eval.progress import echo, progress_bar
from pcpo_eval.rundir import (  # noqa: F401  (INIT_FILE re-exported: its old home)
    CHECKPOINTS_DIR,
    INIT_FILE,
    LOG_FILE,
    RUN_ENTRIES,
    RUN_LOCK,
    checkpoint_dir,
    config_path,
    init_path,
    inputs_path,
    load_log,
)
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.advantages import PerPromptStatTracker
from pcpo_eval.train.checkpoints import lock_run
from pcpo_eval.train.config import RESUME_MAY_CHANGE, TrainConfig
from pcpo_eval.train.diagnostics import (  # noqa: F401  (re-exported: the trainer's public names)
    HEALTHY_APPROX_KL,
    HEALTHY_CLIPFRAC,
    ppo_health_stats,
    ppo_health_warning,
)
from pcpo_eval.train.inputs import changed_inputs, input_record, read_inputs, write_inputs
from pcpo_eval.train.objectives import get_objective
from pcpo_eval.train.policy import INIT_REFERENCE, PolicyMixin, guided_detached_uncond  # noqa: F401
from pcpo_eval.train.rollout import (  # noqa: F401
    VALIDATION_STREAM,
    EpochSamples,
    RolloutMixin,
    keyed_generator,
    training_sampler,
)
from pcpo_eval.train.tracking import TRACKER_DIRS, RunTracking, open_tracking
from pcpo_eval.train.update import UpdateMixin


class Trainer(PolicyMixin, RolloutMixin, UpdateMixin):
    """One run: the policy (``policy.py``), rollout (``rollout.py``) and update (``update.py``) around :meth:`run`,
    plus the run directory (config, log, checkpoints, resume)."""

    def __init__(self, config: TrainConfig, out_dir: str | Path, resume: bool = False,
                 progress: bool | None = None) -> None:
        self.cfg = config.validate()
        self.progress = progress  #: epoch bar on stderr (rank 0); None: when stderr is a terminal
        self.out = Path(out_dir)
        self.rank, self.world = dist.init(config.device)
        if (msg := self.cfg.total_batch_problem(self.world)) is not None:  # launcher x per-process batch != paper's
            raise UserError(msg)
        created, had_lock = not self.out.exists(), (self.out / RUN_LOCK).exists()
        #: the run folder's lock (rank 0; released when :meth:`run` ends): one process trains a run at a time
        self._lock = lock_run(self.out) if self.is_main else None
        try:
            self._setup(config, resume)
        except BaseException:  # refused: the folder as it was (no lock file of ours; a folder we made, gone)
            self.release()
            if self.is_main and not had_lock:
                with contextlib.suppress(OSError):
                    (self.out / RUN_LOCK).unlink()
                    if created:
                        self.out.rmdir()
            raise

    def release(self) -> None:
        """Release the run folder's lock (:func:`pcpo_eval.train.checkpoints.lock_run`); :meth:`run` does when it ends."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _setup(self, config: TrainConfig, resume: bool) -> None:
        """Device, prompts, reward, model, policy, run folder and trackers (under the run folder's lock)."""
        self.device = dist.pick_device(config.device, self.rank)
        if self.device.type == "cuda" and config.deterministic:
            deterministic_cuda()  # bitwise resume on a GPU too (process-wide setting; docs/gpu.md)
        from pcpo_eval.models.registry import load_model
        from pcpo_eval.prompts import load_prompts
        from pcpo_eval.rewards import make_reward, options_on_device

        self.prompt_set = load_prompts(config.prompts)
        self.val_set = self._validation_prompts() if config.validation_every > 0 else None
        self._val_control: np.ndarray | None = None
        self._val_parts: dict[str, float] = {}  # weighted reward: val_reward_<name>_mean of the last validation
        self._val_control_parts: dict[str, float] = {}
        # on the training device unless reward_options names one (rewards.options_on_device)
        self.reward_fn = make_reward(config.reward, **options_on_device(config.reward, config.reward_options, str(self.device)))
        self.adapter: ModelAdapter = load_model(config.model, device=self.device)
        self.sampler, self.schedule = training_sampler(config, self.adapter.prediction)
        self._init_policy(resume)  # LoRA / full weights, reference copy, init_from, AdamW, loss scaler
        if config.compile:  # in place, after LoRA and the reference copy: parameters and state dict unchanged
            # static shapes, one graph each (4 for setup 2); drop_zero_advantage's micro-batches vary in size
            # every epoch, which would pass dynamo's recompile limit (8) and fall back to eager
            for module in filter(None, (self.adapter.denoiser, self.ref_denoiser)):
                module.compile(dynamic=None if config.drop_zero_advantage else False)
        self.tracker = PerPromptStatTracker(config.stat_buffer_size, config.stat_min_count)
        self.objective = get_objective(config.objective)
        with torch.no_grad():
            self.null = self.adapter.encode_prompts([""])
        self.log_rows: list[dict[str, Any]] = []
        self.start_epoch = 1
        if resume:
            self._resume()
        elif self.is_main and ck.latest_checkpoint(self.out) is not None:
            # (a log without a checkpoint: a run stopped before its first checkpoint, which starts again; a checkpoint
            # without a log, e.g. a deleted log, was overwritten by the new run)
            raise UserError(f"{self.out} already holds a run; pass --resume to continue it or choose another --out")
        elif self.is_main:  # a new run: never among an image set's or a user's files (it replaced their config.yaml)
            check_own_folder(self.out, (*RUN_ENTRIES, *TRACKER_DIRS), "a run's")
        #: a resume with no epoch left to train writes nothing (config.yaml, inputs, tracker files stay as they are)
        self.finished = resume and self.start_epoch > config.epochs
        if self.is_main and not self.finished:
            self.out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(config_path(self.out), yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
            if not resume:  # what the files held when the run started (a resumed run keeps its record)
                init_sha = {"init_from": self.init_record["weights_sha256"]} if self.init_record is not None else None
                write_inputs(self.out, input_record(self.cfg.to_dict(), init_sha))
            if self.init_record is not None:
                atomic_write_json(init_path(self.out), self.init_record)
        self.tracking: RunTracking = open_tracking(self.out, self.cfg.to_dict(), self.cfg.log_to, self.cfg.log_project,
                                      self.cfg.wandb_mode, self.cfg.log_images_every,
                                      self.is_main and not self.finished, resume)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def save_checkpoint(self, epoch: int, row: dict[str, Any]) -> Path | None:
        """Write ``checkpoints/epoch_NNNN`` (rank 0): the weights, ``checkpoint.json`` (epoch, reward, model,
        objective, LoRA rank, the seed and the run's full config) and the optimizer / tracker state. With
        ``ema_decay`` the weights file holds the moving average (what Flow-GRPO saves; ``checkpoint.json``
        ``ema``) and the training state the raw weights and the average, for resume."""
        if not self.is_main:
            return None
        meta = {"epoch": epoch, "reward_mean": row["reward_mean"], "model": self.cfg.model,
                "objective": self.cfg.objective, "lora_rank": self.cfg.lora_rank, "seed": self.cfg.seed,
                "config": self.cfg.to_dict()}
        if self.cfg.init_from:
            meta["init_from"] = self.cfg.init_from
        state = {"epoch": epoch, "optimizer": self.optimizer.state_dict(), "tracker": self.tracker.state_dict(),
                 "optimizer_steps": self.optimizer_steps}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if self.ema is not None:  # the weights file holds the average (Flow-GRPO's save_ckpt); resume needs both
            meta["ema"] = {"decay": self.ema.decay, "every": self.ema.every, "repeats": self.cfg.ema_repeats,
                           "updates": self.ema.updates}
            state["ema"] = self.ema.state_dict()
            state["raw_params"] = [p.detach().cpu().clone() for p in self.params]
        with self._ema_weights():
            path = ck.save_checkpoint(checkpoint_dir(self.out, epoch), self.adapter.denoiser, meta, state)
        ck.apply_retention(self.out, self.cfg.keep_checkpoints)  # state in the newest only; keep_checkpoints
        return path

    def log_epoch(self, row: dict[str, Any]) -> None:
        if not self.is_main:
            return
        self.log_rows.append(row)
        atomic_write_parquet(self.out / LOG_FILE, log_frame(self.log_rows))

    def _resume(self) -> None:
        if self.is_main:  # a checkpoint a kill left moved aside (io.atomic_dir) is the newest one
            recover_replaced(self.out / CHECKPOINTS_DIR)
        dist.barrier()  # every rank then sees the same newest checkpoint
        latest = ck.latest_checkpoint(self.out)
        if latest is None:
            raise UserError(f"--resume: no complete checkpoint in {self.out}/checkpoints; start without --resume")
        saved = ck.load_run_config(self.out)
        if not saved:  # an empty config.yaml read as "every key at its default": ten keys "differed"
            raise UserError(f"--resume: {config_path(self.out)} is empty, so the run's settings are unknown; restore "
                            "it from a copy (every checkpoint's checkpoint.json holds the full config), or start a "
                            "new run")
        defaults = TrainConfig().to_dict()  # a key the run's config.yaml predates had its default value
        # without a moving average (ema_decay 0 then and now) its cadence keys do nothing: a run written with
        # ema_every 4 resumed under ema_every 8 was refused for a difference that changes no weight (a review)
        inert = ("ema_every", "ema_repeats") if not self.cfg.ema_decay and not saved.get("ema_decay", 0.0) else ()
        mismatch = [k for k, v in self.cfg.to_dict().items()
                    if k not in RESUME_MAY_CHANGE and k not in inert and saved.get(k, defaults[k]) != v]
        if mismatch:
            raise UserError(f"--resume: config differs from the run's config.yaml in {', '.join(mismatch)}; "
                            f"resume with the same settings (only {', '.join(RESUME_MAY_CHANGE)} may change)")
        if inputs_path(self.out).is_file() and (changed := changed_inputs(read_inputs(self.out), self.cfg.to_dict())):
            raise UserError(f"--resume: {'; '.join(changed)}: the resumed epochs would train on other inputs than "
                            f"the first ones; restore the file(s) the run started with, or start a new run")
        log = None
        if (self.out / LOG_FILE).exists():  # read first: a bad log fails before any weights load
            try:  # one error line for an unreadable log, not a pyarrow traceback
                log = load_log(self.out / LOG_FILE)
            except UserError as exc:
                raise UserError(f"{exc}; restore {LOG_FILE} from a copy, or move it away to resume without the "
                                "earlier epochs' log rows") from None
        ck.check_resumable_weights(latest)
        state = ck.load_training_state(latest)
        try:
            if "peft_state" in state:
                from peft.utils import set_peft_model_state_dict

                set_peft_model_state_dict(self.adapter.denoiser, state["peft_state"])
            else:
                ck.load_weights_into(self.adapter, latest)
            self.optimizer.load_state_dict(state["optimizer"])
            self.tracker.load_state_dict(state["tracker"])
            if self.scaler is not None and "scaler" in state:
                self.scaler.load_state_dict(state["scaler"])
            if self.ema is not None:  # the weights loaded above are the average: the raw ones go back in
                self.ema.load_state_dict(state["ema"])
                with torch.no_grad():
                    for p, raw in zip(self.params, state["raw_params"], strict=True):
                        p.copy_(raw)
            self.optimizer_steps = int(state.get("optimizer_steps", 0))
        except (KeyError, ValueError, TypeError, IndexError) as exc:  # a state saved by another run or version
            raise UserError(f"{latest / ck.STATE_FILE} does not fit this run ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:120] if str(exc) else ''}); {ck.damaged_fix(latest)}") from None
        self.start_epoch = int(state["epoch"]) + 1
        if log is not None:
            self.log_rows = log[log["epoch"] <= state["epoch"]].to_dict("records")

    def _wall_clock(self) -> float:
        """Cumulative seconds of sampling + training before this epoch (``wall_clock_s`` of the last row;
        a log from before that column: the sum of its ``wall_time_s``)."""
        if not self.log_rows:
            return 0.0
        last = self.log_rows[-1].get("wall_clock_s")
        if last is not None and math.isfinite(float(last)):
            return float(last)
        return float(np.nansum([float(r.get("wall_time_s", 0.0)) for r in self.log_rows]))

    def _compute(self) -> float:
        """Cumulative ``compute_s`` before this epoch (0 for a log from before that column)."""
        last = self.log_rows[-1].get("compute_s") if self.log_rows else None
        return float(last) if last is not None and math.isfinite(float(last)) else 0.0

    def _epoch_compute(self, row: dict[str, Any], samples: EpochSamples, cpu_s: float) -> float:
        """This epoch's own compute for sampling + training, without the paired control: process CPU seconds
        on CPU (unaffected by other processes sharing the cores), wall seconds on a GPU (the device is the
        compute; one process per GPU)."""
        if self.device.type == "cpu":
            return cpu_s - samples.control_cpu_s
        return row["wall_time_s"] - samples.control_time_s

    def run(self) -> pd.DataFrame:
        """Train epochs ``start_epoch..epochs``; returns the log."""
        try:
            return self._train()
        finally:
            self.release()

    def _train(self) -> pd.DataFrame:
        cfg = self.cfg
        if self.finished:
            if self.is_main:
                print(f"[pcpo-eval] {self.out} is trained to epoch {self.start_epoch - 1} (epochs={cfg.epochs}): "
                      f"nothing to train; pass epochs=N with N > {self.start_epoch - 1} to continue it", flush=True)
            return pd.DataFrame(self.log_rows)
        if self.is_main:
            n = cfg.samples_per_epoch * self.world
            print(f"[pcpo-eval] {cfg.objective} on {cfg.model}: {n} samples/epoch x {cfg.sample_steps} steps, "
                  f"{cfg.gradient_updates} updates/epoch, {sum(p.numel() for p in self.params):,} trainable params, "
                  f"{self.world} process(es), epochs {self.start_epoch}..{cfg.epochs}", flush=True)
        bar = progress_bar(cfg.epochs, "train", self.progress if self.is_main else False, unit="epoch",
                           initial=self.start_epoch - 1)
        # TF32 exactly as the config says on CUDA; a CPU has none, and its kernels stay untouched
        kernels = (matmul_precision("tf32" if cfg.allow_tf32 else "fp32") if self.device.type == "cuda"
                   else contextlib.nullcontext())
        try:
            with kernels:
                for epoch in range(self.start_epoch, cfg.epochs + 1):
                    self._run_epoch(epoch, bar)
        finally:
            bar.close()
        warning = ppo_health_warning(pd.DataFrame(self.log_rows)) if self.log_rows else None
        if self.is_main and warning:
            print(f"[pcpo-eval] warning: {warning}", flush=True)
        self.tracking.close()
        return pd.DataFrame(self.log_rows)

    def _run_epoch(self, epoch: int, bar: Any) -> None:
        """One epoch: sample, train, log, checkpoint (with retention), the console line; ``bar`` shows the phase."""
        cfg = self.cfg
        bar.set_postfix_str("sampling", refresh=True)
        t0, c0 = time.perf_counter(), time.process_time()
        samples = self.sample_epoch(epoch)
        t1 = time.perf_counter()
        bar.set_postfix_str("training", refresh=True)
        row = self.train_epoch(epoch, samples)
        row["sample_time_s"] = t1 - t0
        row["reward_time_s"] = samples.reward_time_s
        row["wall_time_s"] = time.perf_counter() - t0
        row["wall_clock_s"] = self._wall_clock() + row["wall_time_s"] - samples.control_time_s
        row["compute_s"] = self._compute() + self._epoch_compute(row, samples, time.process_time() - c0)
        if cfg.paired_control:
            row["control_time_s"] = samples.control_time_s
        if cfg.validation_every > 0 and (epoch % cfg.validation_every == 0 or epoch == cfg.epochs):
            with self._ema_weights():  # Flow-GRPO evaluates the moving average (ema_decay)
                row.update(self.validation_row())
        row["peak_rss_mb"] = _peak_rss_mb()
        row["processes"], row["images"] = self.world, self.world * cfg.samples_per_epoch  # rundir.LOGGED_IMAGES
        self.log_epoch(row)
        self.tracking.log_epoch(row, samples.all_rewards, samples.images.cpu().numpy(), samples.prompts)
        if epoch % cfg.checkpoint_every == 0 or epoch == cfg.epochs:
            self.save_checkpoint(epoch, row)
        dist.barrier()
        if self.is_main:
            ctrl = f"  control {row['control_reward_mean']:+.4f}" if cfg.paired_control else ""
            echo(bar, f"epoch {epoch:4d}  reward {row['reward_mean']:+.4f} +- {row['reward_std']:.4f}{ctrl}  "
                      f"clipfrac {row['clipfrac']:.3f}  kl {row['approx_kl']:.2e}  {row['wall_time_s']:.1f}s")
        bar.set_postfix_str(f"reward {row['reward_mean']:+.4f}", refresh=False)
        bar.update(1)


def log_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The log rows as written to ``log.parquet``: list columns (per update / per step) as float64 arrays.

    From Python lists pyarrow infers a column's type from its values, and pandas hands it NaN as null:
    a list column that is NaN throughout (``delta_ratio_per_update`` of a run with one on-policy update
    per epoch) became ``list<null>`` and read back as None. Float64 arrays keep it ``list<double>``; its
    NaNs are stored as null and read back as NaN."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        vals = df[col]
        if vals.dtype != object or not any(isinstance(v, (list, tuple, np.ndarray)) for v in vals):
            continue
        try:
            df[col] = pd.Series([np.asarray(v, dtype=np.float64) if isinstance(v, (list, tuple, np.ndarray)) else None
                                 for v in vals], index=df.index, dtype=object)
        except (TypeError, ValueError):  # not a numeric list column: pyarrow's own inference
            continue
    return df


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def train(config: TrainConfig, out_dir: str | Path, resume: bool = False, progress: bool | None = None) -> pd.DataFrame:
    """Library entry point: train a run into ``out_dir`` (see module docstring); ``progress``: an epoch bar
    with ETA on stderr (rank 0; None = when stderr is a terminal)."""
    return Trainer(config, out_dir, resume=resume, progress=progress).run()
