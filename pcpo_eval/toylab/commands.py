"""``pcpo-eval toy pretrain`` and ``pcpo-eval toy check`` (thin shells over the library)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

toy_app = typer.Typer(help="The embedded toy world: pretrain and check the tiny text-to-image model.",
                      no_args_is_help=True)


@toy_app.command("pretrain")
def pretrain_cmd(
    out: Path = typer.Option(None, "--out", help="weights directory (default: the shipped pcpo_eval/toy/weights)"),
    seed: int = typer.Option(0, help="seed of both stages (the shipped weights use 0)"),
    train_steps: int = typer.Option(None, "--train-steps", help="diffusion optimiser steps (default: the shipped recipe)"),
    classifier_steps: int = typer.Option(None, "--classifier-steps", help="classifier optimiser steps (default: the shipped recipe)"),
    stage: str = typer.Option("all", help="all | classifier | diffusion"),
    threads: int = typer.Option(1, help="torch threads (the shipped weights were trained with 1)"),
) -> None:
    """Train the toy classifier and diffusion model from scratch (reproducible by seed)."""
    from dataclasses import replace

    import torch

    from pcpo_eval.errors import UserError, require
    from pcpo_eval.io import check_out_path
    from pcpo_eval.toylab.pretrain import ClassifierTrainConfig, DiffusionTrainConfig, pretrain

    stages = {"all": ("classifier", "diffusion"), "classifier": ("classifier",), "diffusion": ("diffusion",)}
    if stage not in stages:
        raise UserError(f"unknown --stage {stage!r}; choose one of: {', '.join(stages)}")
    from pcpo_eval.seeding import seed_problem

    require((bad_seed := seed_problem("--seed", seed)) is None, str(bad_seed))
    for flag, value in (("--train-steps", train_steps), ("--classifier-steps", classifier_steps), ("--threads", threads)):
        require(value is None or value >= 1, f"{flag} must be >= 1 (got {value}); pass a positive count")
    if out is not None:
        check_out_path(out, "--out")
    torch.set_num_threads(threads)
    dcfg = replace(DiffusionTrainConfig(), seed=seed, **({"steps": train_steps} if train_steps is not None else {}))
    ccfg = replace(ClassifierTrainConfig(), seed=seed, **({"steps": classifier_steps} if classifier_steps is not None else {}))
    meta = pretrain(out, dcfg, ccfg, log=lambda m: typer.echo(m, err=True), stages=stages[stage])
    typer.echo(json.dumps({k: v for k, v in meta.items() if not isinstance(v, dict)}, indent=2))

@toy_app.command("check")
def check_cmd(
    as_json: bool = typer.Option(False, "--json", help="print the full result as JSON"),
    weights: Path = typer.Option(None, "--weights", help="toy weights directory (default: shipped)"),
    seeds: int = typer.Option(8, help="seeds per prompt (45 prompts each)"),
    threads: int = typer.Option(2, help="torch threads"),
) -> None:
    """Sample every toy prompt; report class accuracy, fd_toy and sampling time."""
    import torch

    from pcpo_eval.errors import UserError
    from pcpo_eval.toylab.check import ACCURACY_BAR, run_check

    if seeds < 2:
        raise UserError(f"--seeds must be >= 2 (got {seeds}); fd_toy needs a covariance")
    if threads < 1:
        raise UserError(f"--threads must be >= 1 (got {threads}); pass a positive count")
    torch.set_num_threads(threads)
    res = run_check(weights_dir=weights, n_seeds=seeds)
    if as_json:
        typer.echo(json.dumps(res.to_dict(), indent=2))
    else:
        typer.echo(f"toy check ({res.n_images} images, DDIM {res.steps} steps, eta {res.eta}, cfg {res.cfg}): "
                   f"accuracy {res.accuracy:.3f} (bar {ACCURACY_BAR}, {'PASS' if res.passed else 'FAIL'}), "
                   f"color {res.color_accuracy:.3f}, shape {res.shape_accuracy:.3f}, "
                   f"fd_toy {res.fd_toy:.3f}, sampling {res.sampling_time_s:.1f}s")


def register(app: typer.Typer) -> None:
    """Add the ``toy`` command group to the ``pcpo-eval`` app."""
    app.add_typer(toy_app, name="toy")
