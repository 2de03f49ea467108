"""``pcpo-eval train CONFIG --out RUN_DIR [--resume] [--device D] [KEY=VALUE ...]``, ``import`` and
``export RUN[@EPOCH] --out DIR`` (:mod:`pcpo_eval.train.export`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pcpo_eval.errors import ProblemList, UserError
from pcpo_eval.flags import DEVICE_HELP
from pcpo_eval.progress import PROGRESS_HELP

#: the smallest latent of any model (the toy models' 48 x 8 x 8): a lower bound of a sample's size
MIN_LATENT_VALUES = 48 * 8 * 8


def check_batch_fits(cfg) -> None:  # noqa: ANN001 - a TrainConfig
    """Refuse batch sizes whose epoch cannot fit in this machine's memory, before anything is written.

    An epoch keeps every sample's trajectory (``sample_steps + 1`` latents) for its updates; with the
    smallest latent of any model at 2 bytes per value this is a lower bound of what the epoch needs,
    so only batch sizes that cannot fit are refused (a huge value used to end in a MemoryError
    traceback or the kernel's OOM kill).
    """
    import os

    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no check
        return
    n = cfg.samples_per_epoch
    need = n * (int(cfg.sample_steps) + 1) * MIN_LATENT_VALUES * 2
    if need > have:
        raise UserError(
            f"sample_batch_size={cfg.sample_batch_size} x sample_batches_per_epoch={cfg.sample_batches_per_epoch} = "
            f"{n:,} samples per epoch cannot fit: their trajectories alone need over {need / 2**30:,.0f} GiB, this "
            f"machine has {have / 2**30:,.0f} GiB; use a smaller sample_batch_size (the paper's setups use 8-32)")


def train_cmd(
    config: Annotated[Path, typer.Argument(help="YAML config (see train/configs/).")],
    out: Annotated[Path, typer.Option("--out", help="Run directory to write.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="KEY=VALUE overrides of config keys, e.g. epochs=2 objective=pcpo")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the run's latest checkpoint.")] = False,
    device: Annotated[
        str | None, typer.Option("--device", help=f"{DEVICE_HELP}; default: the config's `device` (auto)")
    ] = None,
    log_to: Annotated[
        str | None, typer.Option("--log-to", help="trackers, comma-separated: tensorboard, wandb, trackio, or none; "
                                 "default: the config's `log_to` (tensorboard). W&B runs offline unless wandb_mode=online")
    ] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help=PROGRESS_HELP)] = None,
) -> None:
    """Train a DDPO / DanceGRPO / PCPO run (one process, or under torchrun / accelerate launch)."""
    from pcpo_eval.io import check_keys_once, check_out_path, remove_stale_temps
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.tracking import check_trackers
    from pcpo_eval.train.trainer import train

    check_out_path(out, "--out")
    from pcpo_eval.rundir import config_path

    if not resume and Path(config).resolve() == config_path(out).resolve():  # a resume may read the run's own
        raise UserError(f"the config {config} is the run's own config.yaml in --out {out}, which the run rewrites; "
                        "keep the config outside the run folder or choose another --out")
    extra = []
    if device is not None:
        from pcpo_eval.dist import resolve_device

        resolve_device(device)  # checked here; the trainer picks this rank's device itself
        extra = [f"device={device.strip().lower()}"]
    if log_to is not None:
        extra.append(f"log_to={log_to.strip() or 'none'}")
    check_keys_once(overrides or [])  # what the user typed; --device / --log-to come after and win
    cfg = load_config(config, [*(overrides or []), *extra])
    if device is None and cfg.device.startswith("cuda"):  # the config's device: CUDA must be here
        from pcpo_eval.dist import resolve_device

        try:
            resolve_device(cfg.device)
        except UserError:
            raise UserError(f"config device={cfg.device!r} but CUDA is not available here; use device=auto or cpu "
                            "(or --device cpu)") from None
    from pcpo_eval.train.preflight import missing_assets

    if missing := missing_assets(cfg):  # every absent weight / prompt set at once, before any process loads
        raise ProblemList(f"training config {config} needs {len(missing)} item(s) not found here; nothing was "
                          "started (`pcpo-eval weights` / `pcpo-eval prompts` show where each was looked for)", missing)
    check_trackers(cfg.log_to, cfg.wandb_mode)  # W&B online without an API key: one line, before any work
    check_batch_fits(cfg)
    remove_stale_temps(out)  # temp files of a killed run (not ones a live process holds)
    log = train(cfg, out, resume=resume, progress=progress)
    if len(log):
        last = log.iloc[-1]
        typer.echo(f"done: {out} (epoch {int(last['epoch'])}, reward {last['reward_mean']:.4f})")


def import_cmd(
    kind: Annotated[str, typer.Argument(help="dancegrpo | flowgrpo")],
    src: Annotated[Path, typer.Argument(help="the reference run's output folder (its checkpoints)")],
    out: Annotated[Path, typer.Option("--out", help="Run directory to write.")],
    model: Annotated[str, typer.Option("--model", help="base model spec the run fine-tuned, e.g. sd3:PATH_OR_HF_ID")],
    log: Annotated[Path | None, typer.Option("--log", help="history file: W&B export (.csv/.jsonl/.parquet) or "
                                             "run-*.wandb (Flow-GRPO); reward.txt (DanceGRPO)")] = None,
    reward_key: Annotated[str, typer.Option("--reward-key", help="Flow-GRPO reward column reward_KEY")] = "avg",
    objective: Annotated[str, typer.Option("--objective", help="how the run was trained (ppo_clip, pcpo)")] = "ppo_clip",
    reward: Annotated[str | None, typer.Option(
        "--reward", help="the reward the run was trained on, as a train config names it (hps, ocr, "
                         "'{pickscore: 0.5, clipscore: 0.5}'); recorded so a study compares it")] = None,
    last_run: Annotated[bool, typer.Option(
        "--last-run", help="DanceGRPO: import the rewards after the last text or blank line of reward.txt "
                           "(a marker between appended runs); refused when it has none")] = False,
    single_run: Annotated[bool, typer.Option(
        "--single-run", help="DanceGRPO: reward.txt is this run's alone, though it runs on past the last "
                             "checkpoint (its later checkpoints were left out)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
) -> None:
    """Import a DanceGRPO or Flow-GRPO run (checkpoints + training log) as a pcpo-eval run directory."""
    import json

    from pcpo_eval.io import check_out_path
    from pcpo_eval.train.importers import import_run

    check_out_path(out, "--out")
    summary = import_run(kind, src, out, model, log, reward_key, objective, reward, last_run, single_run)
    typer.echo(json.dumps(summary, indent=2) if as_json else
               f"imported {kind} run {src} -> {out}: {len(summary['checkpoints'])} checkpoints "
               f"(epochs {', '.join(map(str, summary['checkpoints']))}), log of {summary['epochs']} epochs")


def export_cmd(
    run: Annotated[str, typer.Argument(help="RUN\\[@EPOCH]: a run folder (latest checkpoint) or a saved epoch of it")],
    out: Annotated[Path, typer.Option("--out", help="folder to write (new or empty; never overwritten)")],
) -> None:
    """Write a run's checkpoint as a diffusers-loadable folder with a model card (README.md), ready for
    `hf upload` (nothing is uploaded)."""
    from pcpo_eval.train.export import export_run

    path = export_run(run, out)
    typer.echo(f"wrote {path} ({', '.join(sorted(p.name for p in path.iterdir()))}); "
               f"share it with: hf upload USER/NAME {path}")


def register(app: typer.Typer) -> None:
    """Add the ``train``, ``import`` and ``export`` commands."""
    app.command("train")(train_cmd)
    app.command("import")(import_cmd)
    app.command("export")(export_cmd)
