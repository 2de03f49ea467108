"""CLI commands ``metrics`` and ``features`` (thin shell over :mod:`pcpo_eval.metrics.workers`).

Both run single-process, or multi-process under ``torchrun --nproc_per_node K`` (gloo backend):
batches and prompts are dealt to the ranks, sufficient statistics are all-reduced, rank 0 writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from pcpo_eval.flags import DEVICE_HELP, EVAL_PRECISION_HELP
from pcpo_eval.io import check_out_path
from pcpo_eval.metrics.base import IS_DEFAULT_SPLITS, METRICS
from pcpo_eval.progress import PROGRESS_HELP

DEFAULT_METRICS = "fid,fd_dinov2,is,lpips"


def _options(
    batch_size: int,
    device: str,
    cache_dir: Path | None,
    inception_weights: Path | None,
    dinov2_path: Path | None,
    lpips_trunk: str | None,
    is_splits: int = IS_DEFAULT_SPLITS,
    progress: bool | None = None,
    fid_resize: str = "auto",
    precision: str = "auto",
) -> Any:
    from pcpo_eval.errors import require
    from pcpo_eval.metrics.workers import MetricsOptions
    from pcpo_eval.precision import resolve_eval_precision

    for flag, value in (("--batch-size", batch_size), ("--is-splits", is_splits)):
        require(value >= 1, f"{flag} must be >= 1 (got {value}); pass a positive count")
    from pcpo_eval.features.base import RESIZES

    require(fid_resize in RESIZES, f"--fid-resize {fid_resize!r}: choose one of {', '.join(RESIZES)}")
    ext: dict[str, dict[str, Any]] = {}
    if inception_weights is not None or fid_resize != "auto":
        ext["inception"] = {"resize": fid_resize}
        if inception_weights is not None:
            ext["inception"]["weights_path"] = inception_weights
    if dinov2_path is not None:
        ext["dinov2"] = {"weights_path": dinov2_path}
    return MetricsOptions(
        batch_size=batch_size,
        device=device,
        is_splits=is_splits,
        cache_dir=cache_dir,
        extractor_options=ext,
        lpips_trunk=lpips_trunk,
        progress=progress,
        precision=resolve_eval_precision(precision),
    )


#: the network each weights flag loads -> the metrics' ``source`` that uses it (metrics.base.METRICS)
_WEIGHTS_FLAG_SOURCE = {"--inception-weights": "inception", "--dinov2-path": "dinov2", "--lpips-trunk": "alex"}


def _check_unused_weights(metrics: str, given: dict[str, Any]) -> None:
    """A weights flag for a network no chosen metric runs would be silently ignored: refuse it."""
    from pcpo_eval.errors import UserError
    from pcpo_eval.metrics.workers import parse_metrics

    sources = {METRICS[m].source for m in parse_metrics(metrics)}
    for flag, value in given.items():
        if value is not None and _WEIGHTS_FLAG_SOURCE[flag] not in sources:
            users = [m for m, i in METRICS.items() if i.source == _WEIGHTS_FLAG_SOURCE[flag]]
            raise UserError(f"{flag} is given but no chosen metric uses it ({', '.join(users)} do); "
                            f"drop {flag} or add one of them to --metrics")


def metrics_cmd(
    image_set: Path = typer.Argument(..., help="image set directory (manifest.parquet + images/)"),
    reference: Path | None = typer.Option(
        None, "--reference", help="reference image set (base model) for FD"
    ),
    metrics: str = typer.Option(
        DEFAULT_METRICS,
        "--metrics",
        help=f"comma-separated, any of: {', '.join(METRICS)}",
    ),
    out: Path = typer.Option(
        ..., "--out", help="output directory (metrics.json, per_prompt.parquet, per_image.parquet)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print metrics.json to stdout instead of the text table"),
    batch_size: int = typer.Option(32, "--batch-size"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    is_splits: int = typer.Option(
        IS_DEFAULT_SPLITS, "--is-splits", help="Inception Score splits (torch-fidelity's default)"
    ),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="feature cache root [IMAGE_SET/.pcpo_cache]"
    ),
    inception_weights: Path | None = typer.Option(
        None, "--inception-weights", help="[$PCPO_INCEPTION_WEIGHTS]"
    ),
    dinov2_path: Path | None = typer.Option(None, "--dinov2-path", help="[$PCPO_DINOV2_PATH]"),
    lpips_trunk: str | None = typer.Option(
        None, "--lpips-trunk", help="AlexNet weights [$PCPO_ALEXNET_WEIGHTS]"
    ),
    progress: bool | None = typer.Option(None, "--progress/--no-progress", help=PROGRESS_HELP),
    fid_resize: str = typer.Option(
        "auto", "--fid-resize",
        help="clean-fid's resize for FID / IS: pil (clean-fid's own, CPU), torch (the same kernel on the "
             "device, within 1e-2 grey levels), auto (torch on CUDA)",
    ),
    precision: str = typer.Option("auto", "--precision", help=EVAL_PRECISION_HELP),
) -> None:
    """FID, FD-DINOv2, IS, LPIPS diversity and preference scores, overall and per prompt."""
    from pcpo_eval import dist
    from pcpo_eval.metrics.workers import run_metrics
    from pcpo_eval.metricsdir import METRICS_FILE, PER_IMAGE_FILE, PER_PROMPT_FILE

    check_out_path(out, "--out")
    _check_unused_weights(metrics, {"--inception-weights": inception_weights, "--dinov2-path": dinov2_path,
                                    "--lpips-trunk": lpips_trunk})
    device = dist.resolve_device(device)
    dist.init(device)
    opts = _options(batch_size, device, cache_dir, inception_weights, dinov2_path, lpips_trunk, is_splits,
                    progress, fid_resize, precision)
    try:
        result = run_metrics(image_set, metrics, out, reference, opts)
        is_main = dist.is_main()
    finally:
        dist.finalize()
    if is_main:
        if as_json:
            typer.echo(json.dumps(result, indent=2, default=str))
        else:
            for name, value in result["metrics"].items():
                typer.echo(f"{name:>14s}  {value:.6g}")
            typer.echo(f"wrote {out}/{METRICS_FILE}, {PER_PROMPT_FILE}, {PER_IMAGE_FILE}")


def features_cmd(
    image_set: Path = typer.Argument(..., help="image set directory"),
    extractor: str = typer.Option(..., "--extractor", help="inception | dinov2 | toy"),
    output: Path = typer.Option(..., "--output", "-o", help="output file .npy (N, d) float32, manifest order"),
    batch_size: int = typer.Option(32, "--batch-size"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="feature cache root [IMAGE_SET/.pcpo_cache]"
    ),
    weights: Path | None = typer.Option(None, "--weights", help="weights file/dir of the extractor"),
    precision: str = typer.Option("auto", "--precision", help=EVAL_PRECISION_HELP),
) -> None:
    """Export an image set's features in manifest order, for your own analyses."""
    from pcpo_eval import dist
    from pcpo_eval.metrics.workers import export_features

    check_out_path(output, "--output", folder=False)
    device = dist.resolve_device(device)
    dist.init(device)
    opts = _options(batch_size, device, cache_dir, None, None, None, precision=precision)
    if weights is not None:
        opts.extractor_options[extractor] = {"weights_path": weights}
    try:
        feats = export_features(image_set, extractor, output, opts)
        is_main = dist.is_main()
    finally:
        dist.finalize()
    if is_main:
        typer.echo(f"wrote {output}: {feats.shape[0]} x {feats.shape[1]} float32 ({extractor})")


def register(app: typer.Typer) -> None:
    """Add ``metrics`` and ``features`` to the ``pcpo-eval`` app."""
    app.command("metrics")(metrics_cmd)
    app.command("features")(features_cmd)
