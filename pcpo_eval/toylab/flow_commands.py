"""``pcpo-eval toy-flow pretrain`` and ``pcpo-eval toy-flow check`` (thin shells over ``toy/flow.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``toy-flow`` sub-app to the main CLI."""
    tf = typer.Typer(help="The toy flow-matching model: pretrain and check it.", no_args_is_help=True)

    @tf.command("pretrain")
    def pretrain_cmd(
        out: Path = typer.Option(None, "--out", help="weights directory (default: the shipped pcpo_eval/toy/weights/flow)"),
        seed: int = typer.Option(0, help="seed (data order, noise, times, init)"),
        train_steps: int = typer.Option(4000, "--train-steps", help="optimiser steps (the shipped weights: see weights/flow/meta.json)"),
        threads: int = typer.Option(1, help="torch threads"),
    ) -> None:
        """Train the toy flow model (toy UNet + text encoder, velocity loss) from scratch."""
        from dataclasses import replace

        import torch

        from pcpo_eval.errors import require
        from pcpo_eval.io import check_out_path
        from pcpo_eval.toylab.flow import pretrain_flow
        from pcpo_eval.toylab.pretrain import DiffusionTrainConfig

        for flag, value in (("--train-steps", train_steps), ("--threads", threads)):
            require(value >= 1, f"{flag} must be >= 1 (got {value}); pass a positive count")
        from pcpo_eval.seeding import seed_problem

        require((bad_seed := seed_problem("--seed", seed)) is None, str(bad_seed))
        if out is not None:
            check_out_path(out, "--out")
        torch.set_num_threads(threads)
        stats = pretrain_flow(out, replace(DiffusionTrainConfig(), seed=seed, steps=train_steps),
                              log=lambda m: typer.echo(m, err=True))
        typer.echo(json.dumps({k: v for k, v in stats.items() if not isinstance(v, dict)}, indent=2))

    @tf.command("check")
    def check_cmd(
        weights: Path = typer.Option(None, "--weights", help="toy flow weights directory (default: shipped)"),
        seeds: int = typer.Option(4, help="seeds per prompt (45 prompts each)"),
        steps: int = typer.Option(10, help="sampling steps"),
        eta: float = typer.Option(0.0, help="0 = ODE; > 0 = DanceGRPO SDE with this eta"),
        cfg: float = typer.Option(3.0, help="CFG weight"),
        threads: int = typer.Option(2, help="torch threads"),
    ) -> None:
        """Sample every toy prompt and report the toy classifier's accuracy and the sampling time."""
        import math

        import torch

        from pcpo_eval.errors import require
        from pcpo_eval.toylab.flow import check_flow

        for flag, value in (("--seeds", seeds), ("--steps", steps), ("--threads", threads)):
            require(value >= 1, f"{flag} must be >= 1 (got {value}); pass a positive count")
        require(math.isfinite(eta) and eta >= 0, f"--eta must be a finite number >= 0 (got {eta}); 0 = ODE")
        require(math.isfinite(cfg), f"--cfg must be finite (got {cfg}); pass a number such as 3")
        torch.set_num_threads(threads)
        res = check_flow(weights, n_seeds=seeds, steps=steps, eta=eta, cfg=cfg)
        typer.echo(json.dumps(res, indent=2))

    app.add_typer(tf, name="toy-flow")
