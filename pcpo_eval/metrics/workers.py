"""Metric workers: per-prompt and overall tables for FID, FD-DINOv2, IS, LPIPS and preference scores.

Stages (each callable on its own, so tests can hit them):

1. :func:`validate_request` - metric names, reference, prompt match, >= 2 images per prompt; all
   user errors surface here, before any model is loaded or any file is written;
2. :func:`extract_set` - features/logits per image through the hash-keyed :class:`FeatureCache`;
   batches are dealt round-robin to the ranks of a ``torch.distributed`` group, every rank then
   reads the complete cache;
3. :func:`compute_metrics` - FD from :class:`GaussianStats` (all-reduced over ranks for the whole
   set; per prompt against the reference's images of the same prompt), IS (torch-fidelity
   conventions, rank-independent because it works on the gathered logits), LPIPS diversity per
   prompt (prompts dealt to ranks, results gathered), preference scores per image;
4. :func:`write_outputs` - rank 0 writes ``per_prompt.parquet``, ``per_image.parquet`` and last
   ``metrics.json`` (``{"metrics": {...}, "settings": {...}}``), each atomically.

Metric names: ``fid``, ``fd_dinov2``, ``fd_toy``, ``is``, ``is_toy``, ``lpips``, ``lpips_toy`` and
the rewards ``hps``, ``pickscore``, ``imagereward``, ``clipscore``, ``aesthetic``.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pcpo_eval import dist
from pcpo_eval.errors import UserError
from pcpo_eval.features import FeatureExtractor, make_extractor
from pcpo_eval.imageset import ImageSet, check_min_images, check_same_prompts
from pcpo_eval.io import atomic_write, atomic_write_json, atomic_write_parquet
from pcpo_eval.metrics.base import METRICS, MetricSpec
from pcpo_eval.metrics.cache import FeatureCache, settings_digest
from pcpo_eval.metrics.frechet import frechet_distance_details
from pcpo_eval.metrics.inception_score import DEFAULT_SEED, DEFAULT_SPLITS, inception_score
from pcpo_eval.metrics.lpips_diversity import PairwiseAccumulator, ToyLpipsEmbedder, make_lpips_embedder
from pcpo_eval.metrics.state import GaussianStats


@dataclass
class MetricsOptions:
    """Knobs of a metrics run (all recorded in the settings)."""

    batch_size: int = 32
    device: str = "cpu"
    is_splits: int = DEFAULT_SPLITS
    is_seed: int = DEFAULT_SEED
    #: feature cache root; default ``<image set>/.pcpo_cache``
    cache_dir: str | Path | None = None
    #: extractor name -> factory options (``weights_path``, or a ``classifier`` stand-in for toy)
    extractor_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: reward name -> ``make_reward`` options
    reward_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: LPIPS AlexNet trunk: local weights path, None (locate) or "random" (tests only)
    lpips_trunk: str | None = None
    lpips_batch: int = 16


# ----------------------------------------------------------------------------- distributed helpers


# ----------------------------------------------------------------------------- validation


def parse_metrics(metrics: str | list[str]) -> list[str]:
    """Comma-separated or list of names -> validated, de-duplicated list."""
    names = [m.strip() for m in (metrics.split(",") if isinstance(metrics, str) else metrics) if m.strip()]
    unknown = [m for m in names if m not in METRICS]
    if unknown or not names:
        raise UserError(f"unknown metric(s) {unknown or names}; choose from: {', '.join(METRICS)}")
    return list(dict.fromkeys(names))


def validate_request(
    names: list[str], image_set: ImageSet, reference: ImageSet | None, options: MetricsOptions
) -> None:
    """Every user error that can be found without running a network."""
    kinds = {METRICS[m].kind for m in names}
    if "fd" in kinds:
        fd_names = [m for m in names if METRICS[m].kind == "fd"]
        if reference is None:
            raise UserError(f"{', '.join(fd_names)} need a reference image set: pass --reference REF_SET")
        check_same_prompts(image_set, reference)
        check_min_images(image_set, 2, fd_names[0])
        check_min_images(reference, 2, f"{fd_names[0]} (reference)")
    if "lpips" in kinds:
        check_min_images(image_set, 2, "LPIPS diversity")
    if "is" in kinds and len(image_set) < options.is_splits:
        raise UserError(
            f"IS with {options.is_splits} splits needs at least {options.is_splits} images, have {len(image_set)}"
        )
    if options.batch_size < 1 or options.lpips_batch < 1:
        raise UserError("batch sizes must be >= 1")


# ----------------------------------------------------------------------------- stage 2: extraction


def cache_root(image_set: ImageSet, options: MetricsOptions) -> Path:
    return Path(options.cache_dir) if options.cache_dir is not None else image_set.root / ".pcpo_cache"


@dataclass
class ExtractionReport:
    """How many unique images this rank computed (the rest came from the cache)."""

    computed: int = 0
    cached: int = 0


def _compute_into_cache(
    cache: FeatureCache,
    image_set: ImageSet,
    keys: list[str],
    batch_size: int,
    compute: Any,
    report: ExtractionReport,
) -> None:
    """Fill ``cache`` for ``keys`` (row keys of ``image_set``): batches dealt round-robin to ranks."""
    first_row: dict[str, int] = {}
    for row, k in enumerate(keys):
        first_row.setdefault(k, row)
    # every rank must see the same list of missing keys: scan between two barriers, before anyone writes
    dist.barrier()
    cache.refresh()
    missing = cache.missing(keys)
    dist.barrier()
    report.cached += len(first_row) - len(missing)
    batches = [missing[i : i + batch_size] for i in range(0, len(missing), batch_size)]
    for batch in batches[dist.rank() :: dist.world_size()]:
        rows = [first_row[k] for k in batch]
        arrays = compute(rows)
        cache.write_chunk(batch, {k: np.asarray(v) for k, v in arrays.items()})
        report.computed += len(batch)
    dist.barrier()
    cache.refresh()


def extract_set(
    image_set: ImageSet,
    extractor: FeatureExtractor,
    options: MetricsOptions,
    outputs: tuple[str, ...] = ("features",),
    report: ExtractionReport | None = None,
) -> dict[str, np.ndarray]:
    """Per-image extractor outputs (``features``, ``logits``) in manifest order, through the cache."""
    report = report if report is not None else ExtractionReport()
    settings = {
        **extractor.settings(),
        "outputs": ["features", "logits"] if extractor.has_logits else ["features"],
    }
    cache = FeatureCache(cache_root(image_set, options) / "features", extractor.name, settings)

    def compute(rows: list[int]) -> dict[str, np.ndarray]:
        out = extractor.extract(image_set.read_batch(rows))
        return {k: v.numpy().astype(np.float32) for k, v in out.items()}

    _compute_into_cache(cache, image_set, image_set.shas, options.batch_size, compute, report)
    return cache.gather(image_set.shas, list(outputs))


def reward_keys(image_set: ImageSet) -> list[str]:
    """Reward cache keys: sha256(image sha256 + prompt) (a score depends on both)."""
    m = image_set.manifest
    return [
        hashlib.sha256(f"{s}\n{p}".encode()).hexdigest()
        for s, p in zip(m["image_sha256"].astype(str), m["prompt"].astype(str), strict=True)
    ]


def load_reward(name: str, options: dict[str, Any]) -> Any:
    """``pcpo_eval.rewards.make_reward`` with a one-line error if the backend is not installed."""
    from pcpo_eval.rewards import make_reward

    try:
        return make_reward(name, **options)
    except ModuleNotFoundError as exc:
        raise UserError(f"reward {name!r} is unavailable: module {exc.name!r} is not installed") from exc


def score_set(
    image_set: ImageSet, name: str, options: MetricsOptions, report: ExtractionReport | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """Per-image preference scores (float32, manifest order) through a cache keyed by image + prompt.

    Returns the scores and the reward's settings (its ``settings``/``info`` dict: model, weights).
    """
    report = report if report is not None else ExtractionReport()
    fn = load_reward(name, options.reward_options.get(name, {}))
    info = getattr(fn, "info", None) or getattr(fn, "settings", None) or {}
    settings = {
        "reward": name,
        **(info if isinstance(info, dict) else {}),
        **options.reward_options.get(name, {}),
    }
    cache = FeatureCache(
        cache_root(image_set, options) / "rewards", name, {k: str(v) for k, v in settings.items()}
    )
    prompts = image_set.manifest["prompt"].astype(str).tolist()

    def compute(rows: list[int]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            scores = fn(image_set.read_batch(rows), [prompts[r] for r in rows])
        return {"score": torch.as_tensor(scores).detach().float().cpu().numpy().reshape(len(rows))}

    _compute_into_cache(cache, image_set, reward_keys(image_set), options.batch_size, compute, report)
    plain = {k: v if isinstance(v, str | int | float | bool | None) else str(v) for k, v in settings.items()}
    return cache.gather(reward_keys(image_set), ["score"])["score"], plain


# ----------------------------------------------------------------------------- stage 3: metrics


def fd_overall(x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, float]]:
    """FD of two whole sets; sufficient statistics of each rank's row shard are all-reduced."""
    sx = GaussianStats(x.shape[1]).update(x[dist.rank() :: dist.world_size()]).all_reduce()
    sy = GaussianStats(y.shape[1]).update(y[dist.rank() :: dist.world_size()]).all_reduce()
    res = frechet_distance_details(sx.mean(), sx.cov(), sy.mean(), sy.cov())
    return res.value, {
        "clipped_negative_eigen_mass": res.clipped_negative_mass,
        "n_clipped": res.n_clipped,
        "method": res.method,
    }


def fd_per_prompt(
    x: np.ndarray, y: np.ndarray, rows_x: dict[int, np.ndarray], rows_y: dict[int, np.ndarray]
) -> dict[int, float]:
    """FD per prompt against the reference's images of the same prompt (prompts dealt to ranks)."""
    mine = {}
    for pid in sorted(rows_x)[dist.rank() :: dist.world_size()]:
        sx = GaussianStats(x.shape[1]).update(x[rows_x[pid]])
        sy = GaussianStats(y.shape[1]).update(y[rows_y[pid]])
        mine[pid] = frechet_distance_details(sx.mean(), sx.cov(), sy.mean(), sy.cov()).value
    return {k: v for part in dist.gather_objects(mine) for k, v in part.items()}


def lpips_per_prompt(
    image_set: ImageSet, embedder: Any, embedder_settings: dict[str, Any], options: MetricsOptions
) -> dict[int, float]:
    """Mean pairwise LPIPS per prompt; each finished prompt is cached, so a re-run skips it."""
    root = (
        cache_root(image_set, options)
        / "lpips"
        / f"{embedder.name}-{settings_digest(embedder_settings)[:16]}"
    )
    shas = image_set.shas
    mine = {}
    for pid, rows in sorted(image_set.rows_by_prompt().items())[dist.rank() :: dist.world_size()]:
        key = hashlib.sha256("\n".join(shas[r] for r in rows).encode()).hexdigest()[:24]
        path = root / f"prompt-{key}.json"
        if path.exists():
            mine[pid] = json.loads(path.read_text())["lpips"]
            continue
        acc = PairwiseAccumulator()
        for i in range(0, len(rows), options.lpips_batch):
            acc.update(embedder(image_set.read_batch(rows[i : i + options.lpips_batch])))
        mine[pid] = acc.mean_distance()
        atomic_write_json(path, {"prompt_id": pid, "n": acc.n, "lpips": mine[pid]})
    return {k: v for part in dist.gather_objects(mine) for k, v in part.items()}


@dataclass
class MetricsResult:
    """Everything :func:`write_outputs` needs."""

    metrics: dict[str, float]
    settings: dict[str, Any]
    per_prompt: pd.DataFrame
    per_image: pd.DataFrame

    def as_json(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "settings": self.settings}


def compute_metrics(
    image_set: str | Path | ImageSet,
    metrics: str | list[str],
    reference: str | Path | ImageSet | None = None,
    options: MetricsOptions | None = None,
    report: ExtractionReport | None = None,
) -> MetricsResult:
    """Run stages 1-3 and return the tables (no file outside the cache is written)."""
    options = options or MetricsOptions()
    report = report if report is not None else ExtractionReport()
    names = parse_metrics(metrics)
    s = image_set if isinstance(image_set, ImageSet) else ImageSet.load(image_set)
    ref = reference if reference is None or isinstance(reference, ImageSet) else ImageSet.load(reference)
    validate_request(names, s, ref, options)

    # build every network first: absent weights fail before any long computation
    sources = {METRICS[m].source for m in names if METRICS[m].kind in ("fd", "is")}
    if "lpips_toy" in names:
        sources.add("toy")
    extractors = {
        src: make_extractor(src, device=options.device, **options.extractor_options.get(src, {}))
        for src in sorted(sources)
    }
    lpips_embedder = (
        make_lpips_embedder(options.lpips_trunk, device=options.device) if "lpips" in names else None
    )

    rows_s = s.rows_by_prompt()
    prompts = s.prompts()
    per_prompt = pd.DataFrame(
        {
            "prompt_id": list(rows_s),
            "prompt": [prompts[p] for p in rows_s],
            "n_images": [len(r) for r in rows_s.values()],
        }
    )
    per_image = s.manifest[["prompt_id", "prompt", "seed", "path", "image_sha256"]].copy()
    out: dict[str, float] = {}
    settings: dict[str, Any] = {
        "image_set": str(s.root),
        "reference": str(ref.root) if ref is not None else None,
        "n_images": len(s),
        "n_reference": len(ref) if ref is not None else None,
        "n_prompts": len(rows_s),
        "world_size": dist.world_size(),
        "metrics": names,
        "extractors": {k: e.settings() for k, e in extractors.items()},
    }
    if ref is not None:
        rows_r = ref.rows_by_prompt()
        per_prompt["n_reference"] = [len(rows_r.get(p, [])) for p in rows_s]

    feats: dict[str, dict[str, np.ndarray]] = {}
    for src, ext in extractors.items():
        wanted = tuple(
            ["features"] + (["logits"] if any(METRICS[m] == MetricSpec("is", src) for m in names) else [])
        )
        feats[src] = extract_set(s, ext, options, wanted, report)

    fd_diag: dict[str, Any] = {}
    reward_settings: dict[str, Any] = {}
    for m in names:
        spec = METRICS[m]
        if spec.kind == "fd":
            assert ref is not None
            fr = extract_set(ref, extractors[spec.source], options, ("features",), report)["features"]
            fx = feats[spec.source]["features"]
            out[m], fd_diag[m] = fd_overall(fx, fr)
            pp = fd_per_prompt(fx, fr, rows_s, ref.rows_by_prompt())
            per_prompt[m] = [pp[p] for p in rows_s]
        elif spec.kind == "is":
            logits = feats[spec.source]["logits"]
            res = inception_score(logits, options.is_splits, True, options.is_seed)
            out[m], out[f"{m}_std"] = res.mean, res.std
            vals = [
                inception_score(logits[r], min(options.is_splits, len(r)), True, options.is_seed)
                for r in rows_s.values()
            ]
            per_prompt[m] = [v.mean for v in vals]
            per_prompt[f"{m}_std"] = [v.std for v in vals]
        elif spec.kind == "lpips":
            if m == "lpips":
                emb, emb_settings = lpips_embedder, lpips_embedder.info
            else:
                toy = extractors["toy"]
                emb_settings = {
                    "layers": "toy classifier layers, unit-normalized channels, uniform weights",
                    **toy.settings(),
                }
                emb = ToyLpipsEmbedder(toy.layers, emb_settings)
            pp = lpips_per_prompt(s, emb, emb_settings, options)
            per_prompt[m] = [pp[p] for p in rows_s]
            out[m] = float(np.mean(per_prompt[m]))
            settings[f"{m}_settings"] = {
                **emb_settings,
                "pairs": "all unordered pairs per prompt",
                "aggregate": "mean over prompts",
            }
        else:
            scores, reward_settings[m] = score_set(s, spec.source, options, report)
            per_image[m] = scores
            per_prompt[m] = [float(np.mean(scores[r])) for r in rows_s.values()]
            out[m] = float(np.mean(scores))
    if fd_diag:
        settings["frechet"] = {
            "dtype": "float64",
            "covariance_ddof": 1,
            "trace_sqrt": "sum sqrt(eigvalsh(R^T S2 R)), R = cholesky(S1) or eigh root if singular; negatives clipped and reported",
            "per_prompt": "FD of each prompt's images vs the reference's images of the same prompt",
            "diagnostics": fd_diag,
        }
    if any(METRICS[m].kind == "is" for m in names):
        settings["inception_score"] = {
            "convention": "torch-fidelity isc_features_to_metric",
            "splits": options.is_splits,
            "shuffle_seed": options.is_seed,
            "shuffle": "np.random.RandomState(seed).permutation(N)",
            "std": "population (ddof=0)",
            "per_prompt_splits": f"min({options.is_splits}, images of the prompt)",
            "n": len(s),
        }
    if any(METRICS[m].kind == "reward" for m in names):
        settings["rewards"] = reward_settings
        settings["reward_aggregate"] = "mean over images (per prompt: mean over the prompt's images)"
    conversions: dict[str, int] = {}
    for part in dist.gather_objects(s.read_stats.as_dict()):
        for k, v in part.items():
            conversions[k] = conversions.get(k, 0) + v
    settings["converted_to_rgb"] = conversions
    settings["options"] = {
        "batch_size": options.batch_size,
        "device": options.device,
        "lpips_batch": options.lpips_batch,
    }
    settings["versions"] = {"torch": torch.__version__, "python": platform.python_version()}
    return MetricsResult(out, settings, per_prompt, per_image)


# ----------------------------------------------------------------------------- stage 4: outputs


def write_outputs(result: MetricsResult, out_dir: str | Path) -> None:
    """Rank 0 writes the Parquet tables, then ``metrics.json`` (each atomically)."""
    if not dist.is_main():
        return
    out = Path(out_dir)
    atomic_write_parquet(out / "per_prompt.parquet", result.per_prompt)
    atomic_write_parquet(out / "per_image.parquet", result.per_image)
    atomic_write_json(out / "metrics.json", result.as_json())


def check_out_dir(out_dir: str | Path) -> None:
    """UserError if ``out_dir`` cannot hold the outputs (checked before any work)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory; choose a directory")


def run_metrics(
    image_set: str | Path,
    metrics: str | list[str],
    out_dir: str | Path | None,
    reference: str | Path | None = None,
    options: MetricsOptions | None = None,
) -> dict[str, Any]:
    """Compute ``metrics`` for ``image_set`` and (if ``out_dir``) write the three outputs."""
    if out_dir is not None:
        check_out_dir(out_dir)
    result = compute_metrics(image_set, metrics, reference, options)
    if out_dir is not None:
        write_outputs(result, out_dir)
    return result.as_json()


def export_features(
    image_set: str | Path, extractor: str, out_file: str | Path, options: MetricsOptions | None = None
) -> np.ndarray:
    """Write the (N, d) float32 features of ``image_set`` in manifest order to ``out_file`` (.npy)."""
    options = options or MetricsOptions()
    out = Path(out_file)
    if out.suffix != ".npy":
        raise UserError(f"--out {out} must end in .npy")
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give a .npy file path")
    s = ImageSet.load(image_set)
    ext = make_extractor(extractor, device=options.device, **options.extractor_options.get(extractor, {}))
    feats = extract_set(s, ext, options)["features"]
    if dist.is_main():
        with atomic_write(out, "wb") as fh:
            np.save(fh, feats)
    return feats
