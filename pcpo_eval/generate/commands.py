"""``pcpo-eval generate``: render a prompt x seed image set.

Owns the command's options and its one-line summary; everything else is
:func:`pcpo_eval.generate.runner.generate_set` (a :class:`UserError` from it becomes exit code 2).
"""

from __future__ import annotations

from pathlib import Path

import typer

from pcpo_eval.train.commands import DEVICE_HELP, resolve_device


def generate(
    model: str = typer.Option(
        ..., "--model", help="base | toy | sd1:PATH | RUN/checkpoints/epoch_NNNN | irg:CKPT=L[,CKPT=L][@REF]"
    ),
    prompts: str = typer.Option(
        ..., "--prompts", help="simple_animals | nouns_activities | toy | a .txt/.csv/.parquet file"
    ),
    seeds: str = typer.Option(..., "--seeds", help="N (seeds 0..N-1) or A-B (inclusive)"),
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
        None, "--micro-batch", help="fixed rows per model call (default: by latent size, 16 for SD-1.x; 0 = off)"
    ),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    max_prompt_tokens: int | None = typer.Option(
        None, "--max-prompt-tokens", help="drop prompts longer than this many CLIP tokens (77: paper's MJHQ filter)"
    ),
    max_prompts: int | None = typer.Option(None, "--max-prompts", help="keep only the first N prompts"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar on rank 0"),
) -> None:
    """Render every (prompt, seed) image: bit-identical for any batch size or process count."""
    from pcpo_eval.generate.runner import generate_set
    from pcpo_eval.io import check_out_path

    check_out_path(out, "--out")
    device = resolve_device(device)
    summary = generate_set(
        model, prompts, seeds, out,
        batch_size=batch_size, steps=steps, cfg=cfg, eta=eta, sampler=sampler,
        schedule=schedule, micro_batch=micro_batch, device=device,
        max_prompt_tokens=max_prompt_tokens, max_prompts=max_prompts, progress=progress,
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
            f"({summary.images_per_second:.2f} img/s); manifest {summary.manifest_path}"
        )


def register(app: typer.Typer) -> None:
    """Add the ``generate`` command."""
    app.command("generate")(generate)
