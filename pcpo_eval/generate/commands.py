"""``pcpo-eval generate``: render a prompt x seed image set; ``pcpo-eval prompts``: the prompt sets it can read.

Owns the commands' options and one-line summaries; everything else is
:func:`pcpo_eval.generate.runner.generate_set` and :mod:`pcpo_eval.prompts` (a :class:`UserError` from
them becomes exit code 2).
"""

from __future__ import annotations

from pathlib import Path

import typer

from pcpo_eval.flags import DEVICE_HELP


def generate_cmd(
    model: str = typer.Option(
        ..., "--model", help="toy | sd1:PATH | sd3:... | flux:... | RUN/checkpoints/epoch_NNNN | irg:CKPT=L[,CKPT=L]\\[@REF]"
    ),
    prompts: str = typer.Option(
        ..., "--prompts",
        help="simple_animals | nouns_activities | toy | a dataset (`pcpo-eval prompts`) | a .txt/.csv/.parquet file",
    ),
    seeds: str = typer.Option(..., "--seeds", help="N (seeds 0..N-1), A-B (inclusive) or a list A,B-C (those seeds)"),
    out: Path = typer.Option(..., "--out", help="set directory (resumed if it holds the same settings)"),
    batch_size: int = typer.Option(
        8, "--batch-size", help="images sampled together, rounded up to whole micro-batches (speed only)"
    ),
    steps: int = typer.Option(50, "--steps", help="sampler steps"),
    cfg: float = typer.Option(5.0, "--cfg", help="classifier-free guidance weight w"),
    eta: float = typer.Option(1.0, "--eta", help="DDIM eta (0 = deterministic ODE)"),
    sampler: str = typer.Option("auto", "--sampler", help="auto | ddim | flow"),
    schedule: str | None = typer.Option(
        None, "--schedule", help="DDIM: ddim (default) | pcpo; flow: ode (default) | dance | flowgrpo"
    ),
    micro_batch: int | None = typer.Option(
        None, "--micro-batch",
        help="fixed rows per model call (default: CPU by latent size, 16 for SD-1.x; CUDA from free memory; 0 = off)",
    ),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    precision: str = typer.Option(
        "auto", "--precision", help="auto (bf16 on CUDA, fp32 on CPU) | fp32 | tf32 | bf16 | fp16; recorded in set.json"
    ),
    attention: str = typer.Option(
        "auto", "--attention", help="auto (PyTorch's choice) | math | flash | efficient | cudnn: the SDPA backend; recorded in set.json"
    ),
    compile: bool = typer.Option(False, "--compile/--no-compile", help="torch.compile the denoiser (CUDA speed-up)"),
    channels_last: bool = typer.Option(
        False, "--channels-last/--no-channels-last", help="channels-last memory format for the denoiser"
    ),
    max_prompt_tokens: int | None = typer.Option(
        None, "--max-prompt-tokens", help="drop prompts longer than this many CLIP tokens (77: paper's MJHQ filter)"
    ),
    max_prompts: int | None = typer.Option(None, "--max-prompts", help="keep only the first N prompts"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar on rank 0"),
) -> None:
    """Render every (prompt, seed) image: bit-identical for any batch size or process count at a fixed
    --micro-batch (the CPU default; within a tolerance at the GPU default)."""
    from pcpo_eval.dist import resolve_device
    from pcpo_eval.generate.runner import generate_set
    from pcpo_eval.io import check_out_path

    check_out_path(out, "--out")
    device = resolve_device(device)
    summary = generate_set(
        model, prompts, seeds, out,
        batch_size=batch_size, steps=steps, cfg=cfg, eta=eta, sampler=sampler,
        schedule=schedule, micro_batch=micro_batch, device=device, precision=precision, attention=attention,
        compile=compile, channels_last=channels_last, max_prompt_tokens=max_prompt_tokens, max_prompts=max_prompts, progress=progress,
    )  # fmt: skip
    if summary.rank == 0:
        dropped = (
            f", {summary.n_prompts_dropped} prompts dropped (> {max_prompt_tokens} CLIP tokens)"
            if max_prompt_tokens is not None
            else ""
        )
        typer.echo(
            f"{summary.n_images} images ({summary.n_prompts} prompts x {summary.n_seeds} seeds{dropped}) in {out}: "
            f"rendered {summary.n_rendered}, skipped {summary.n_skipped} on rank 0 of {summary.world_size} "
            f"({summary.images_per_second:.2f} img/s end to end, model loading included; "
            f"{summary.settings.precision}, micro-batch "
            f"{summary.settings.micro_batch}); manifest {summary.manifest_path}"
        )


def prompts_cmd(
    names: list[str] = typer.Argument(None, help="prompt sets to check (default: all)"),
    count: bool = typer.Option(True, "--count/--no-count", help="read present sets to count their prompts"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of the table"),
) -> None:
    """List every known prompt set: present or not, where it looked, how to get it, prompt counts."""
    import json

    from pcpo_eval.errors import UserError
    from pcpo_eval.prompts import DATASETS, REGISTRY, format_prompt_sets, prompt_set_status

    known = list(REGISTRY) + list(DATASETS)
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise UserError(f"unknown prompt set {unknown[0]!r}; choose from: {', '.join(known)}")
    rows = [prompt_set_status(n, count=count) for n in names or known]
    typer.echo(json.dumps({"prompt_sets": rows}, indent=2) if as_json else format_prompt_sets(rows))


def register(app: typer.Typer) -> None:
    """Add the ``generate`` and ``prompts`` commands."""
    app.command("generate")(generate_cmd)
    app.command("prompts")(prompts_cmd)
