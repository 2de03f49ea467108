"""``pcpo-eval train CONFIG --out RUN_DIR [--resume] [KEY=VALUE ...]``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def train_cmd(
    config: Annotated[Path, typer.Argument(help="YAML config (see train/configs/).")],
    out: Annotated[Path, typer.Option("--out", help="Run directory to write.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="KEY=VALUE overrides of config keys, e.g. epochs=2 objective=pcpo")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue from the run's latest checkpoint.")] = False,
) -> None:
    """Train a DDPO / DanceGRPO / PCPO run (one process, or under torchrun / accelerate launch)."""
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import train

    cfg = load_config(config, overrides or [])
    log = train(cfg, out, resume=resume)
    if len(log):
        last = log.iloc[-1]
        typer.echo(f"done: {out} (epoch {int(last['epoch'])}, reward {last['reward_mean']:.4f})")


def register(app: typer.Typer) -> None:
    app.command("train")(train_cmd)
