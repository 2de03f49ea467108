"""Metric workers: per-prompt and overall tables for FID, FD-DINOv2, IS, LPIPS and preference scores.

Stages (each callable on its own, so tests can hit them):

1. :func:`validate_request` - metric names, reference, prompt match, >= 2 images per prompt; all
   user errors surface here, before any model is loaded or any file is written;
2. :func:`pcpo_eval.metrics.extract.extract_sets` - features/logits per image, one decode pass per set, through the
   hash-keyed :class:`FeatureCache`; batches are dealt round-robin to the ranks of a
   ``torch.distributed`` group, every rank then reads the complete cache;
3. :func:`compute_metrics` - one :class:`~pcpo_eval.metrics.metric.Metric` object per requested
   metric (its class chosen by the catalogue kind, :data:`METRIC_CLASSES`): ``update`` with this
   rank's share, ``sync`` the declared states over ranks, ``compute`` the values, ``settings``
   for the provenance;
4. :func:`write_outputs` - rank 0 writes ``per_prompt.parquet``, ``per_image.parquet`` and last
   ``metrics.json`` (``{"metrics": {...}, "settings": {...}}``), each atomically.

Metric names: the catalogue :data:`pcpo_eval.metrics.base.METRICS` (``fid``, ``fd_dinov2``,
``fd_toy``, ``is``, ``is_toy``, ``lpips``, ``lpips_toy`` and the rewards ``hps``, ``pickscore``,
``imagereward``, ``clipscore``, ``aesthetic``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from pcpo_eval import dist
from pcpo_eval.errors import UserError
from pcpo_eval.features import FeatureExtractor, make_extractor
from pcpo_eval.imageset import MANIFEST_FILE, ImageSet, check_min_images, check_same_prompts
from pcpo_eval.io import (
    atomic_write,
    atomic_write_files,
    check_not_an_input,
    exclusive,
    foreign_entries,
    json_text,
    remove_stale_temps,
    sha256_file,
)
from pcpo_eval.metrics.base import METRICS
from pcpo_eval.metrics.extract import (
    FEATURES_DIR,
    ExtractionReport,
    MetricsOptions,
    cache_root,
    extract_set,
    extract_sets,
)
from pcpo_eval.metrics.frechet import FrechetDistanceMetric
from pcpo_eval.metrics.inception_score import InceptionScoreMetric
from pcpo_eval.metrics.lpips_diversity import LpipsDiversityMetric
from pcpo_eval.metrics.metric import EvalData, Metric, MetricValues
from pcpo_eval.metrics.reward_score import RewardScoreMetric
from pcpo_eval.metricsdir import (
    LOCK_FILE,
    METRICS_FILE,
    PER_IMAGE_FILE,
    PER_PROMPT_FILE,
    lock_path,
    metrics_path,
    per_image_path,
    per_prompt_path,
)
from pcpo_eval.precision import matmul_precision, resolve_eval_precision

#: catalogue kind -> Metric class (add a kind: one file with its class, one entry here)
METRIC_CLASSES: dict[str, type[Metric]] = {
    "fd": FrechetDistanceMetric,
    "is": InceptionScoreMetric,
    "lpips": LpipsDiversityMetric,
    "reward": RewardScoreMetric,
}
#: order of the kinds' settings blocks in metrics.json (the order the file has always had)
_SETTINGS_ORDER = ("lpips", "fd", "is", "reward")


# ----------------------------------------------------------------------------- validation


def parse_metrics(metrics: str | list[str]) -> list[str]:
    """Comma-separated or list of names -> validated, de-duplicated list."""
    names = [m.strip() for m in (metrics.split(",") if isinstance(metrics, str) else metrics) if m.strip()]
    unknown = [m for m in names if m not in METRICS]
    if not names:
        raise UserError(f"no metric named; give --metrics as a comma-separated list from: {', '.join(METRICS)}")
    if unknown:
        raise UserError(f"unknown metric(s) {', '.join(unknown)}; choose from: {', '.join(METRICS)}")
    return list(dict.fromkeys(names))


def validate_request(
    names: list[str], image_set: ImageSet, reference: ImageSet | None, options: MetricsOptions
) -> None:
    """Every user error that can be found without running a network."""
    infos = [METRICS[m] for m in names]
    with_reference = [i.name for i in infos if i.needs_reference]
    if with_reference:
        if reference is None:
            raise UserError(
                f"{', '.join(with_reference)} {'needs' if len(with_reference) == 1 else 'need'} a reference image "
                "set: pass --reference REF_SET"
            )
        check_same_prompts(image_set, reference)
        check_min_images(image_set, 2, with_reference[0])
        check_min_images(reference, 2, f"{with_reference[0]} (reference)")
    if any(i.kind == "lpips" for i in infos):
        check_min_images(image_set, 2, "LPIPS diversity")
    if any(i.kind == "is" for i in infos) and len(image_set) < options.is_splits:
        raise UserError(
            f"IS with {options.is_splits} splits needs at least {options.is_splits} images, have {len(image_set)}; "
            "lower --is-splits or render more seeds"
        )
    if options.batch_size < 1 or options.lpips_batch < 1:
        raise UserError("batch sizes must be >= 1")
    resolve_eval_precision(options.precision)


# ----------------------------------------------------------------------------- stage 3: metrics


@dataclass
class MetricsResult:
    """Everything :func:`write_outputs` needs."""

    metrics: dict[str, float]
    settings: dict[str, Any]
    per_prompt: pd.DataFrame
    per_image: pd.DataFrame

    def as_json(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "settings": self.settings}


def extractor_outputs(names: list[str]) -> dict[str, tuple[str, ...]]:
    """Extractors the metrics need (sorted by name) -> outputs to extract for the image set."""
    wanted: dict[str, set[str]] = {}
    for m in names:
        for source, outputs in METRIC_CLASSES[METRICS[m].kind].extractor_outputs(METRICS[m]).items():
            wanted.setdefault(source, set()).update(outputs)
    order = ("features", "logits")
    return {src: tuple(o for o in order if o in wanted[src]) for src in sorted(wanted)}


def build_metrics(
    names: list[str], options: MetricsOptions
) -> tuple[list[Metric], dict[str, FeatureExtractor], dict[str, tuple[str, ...]]]:
    """Every network (extractors, LPIPS trunks, reward models) and one Metric per name.

    Built before any long computation, so absent weights fail first.
    """
    wanted = extractor_outputs(names)
    extractors = {
        src: make_extractor(src, device=options.device, **options.extractor_options.get(src, {}))
        for src in wanted
    }
    metrics = [METRIC_CLASSES[METRICS[m].kind](METRICS[m], extractors, options) for m in names]
    return metrics, extractors, wanted


def _tables(s: ImageSet, ref: ImageSet | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Empty per-prompt (prompt, image counts) and per-image (manifest keys) tables."""
    rows_s = s.rows_by_prompt()
    prompts = s.prompts()
    per_prompt = pd.DataFrame(
        {
            "prompt_id": list(rows_s),
            "prompt": [prompts[p] for p in rows_s],
            "n_images": [len(r) for r in rows_s.values()],
        }
    )
    if ref is not None:
        rows_r = ref.rows_by_prompt()
        per_prompt["n_reference"] = [len(rows_r.get(p, [])) for p in rows_s]
    per_image = s.manifest[["prompt_id", "prompt", "seed", "path", "image_sha256"]].copy()
    return per_prompt, per_image


def _add_values(
    values: MetricValues, out: dict[str, float], per_prompt: pd.DataFrame, per_image: pd.DataFrame
) -> None:
    out.update(values.overall)
    for col, by_prompt in values.per_prompt.items():
        per_prompt[col] = [by_prompt[int(p)] for p in per_prompt["prompt_id"]]
    for col, arr in values.per_image.items():
        per_image[col] = arr


def _merge_settings(into: dict[str, Any], block: dict[str, Any]) -> None:
    """Deep-merge ``block`` into ``into`` (two FD metrics share one ``frechet`` block)."""
    for key, value in block.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_settings(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _settings(
    s: ImageSet,
    ref: ImageSet | None,
    names: list[str],
    extractors: dict[str, FeatureExtractor],
    metrics: list[Metric],
    options: MetricsOptions,
) -> dict[str, Any]:
    """metrics.json ``settings``: the inputs, every metric's provenance, conversions, versions."""
    settings: dict[str, Any] = {
        "image_set": str(s.root),
        "reference": str(ref.root) if ref is not None else None,
        "n_images": len(s),
        "n_reference": len(ref) if ref is not None else None,
        "n_prompts": len(s.prompts()),
        "world_size": dist.world_size(),
        "metrics": names,
        "extractors": {k: e.settings() for k, e in extractors.items()},
    }
    for metric in sorted(metrics, key=lambda m: _SETTINGS_ORDER.index(m.kind)):
        _merge_settings(settings, metric.settings())
    conversions: dict[str, int] = {}
    for part in dist.gather_objects(s.read_stats.as_dict()):
        for k, v in part.items():
            conversions[k] = conversions.get(k, 0) + v
    settings["converted_to_rgb"] = conversions
    settings["options"] = {
        "batch_size": options.batch_size,
        "device": options.device,
        "precision": options.precision,
        "lpips_batch": options.lpips_batch,
    }
    settings["versions"] = {"torch": torch.__version__, "python": platform.python_version()}
    settings["request_fingerprint"] = request_fingerprint(s.root, names, ref.root if ref is not None else None, options)
    return settings


def request_fingerprint(
    image_set: str | Path, metrics: list[str], reference: str | Path | None, options: MetricsOptions
) -> str:
    """sha256 of what a run's values depend on besides the networks' files: the metric names, the bytes of
    the set's (and the reference's) manifest, and the options that change values (IS splits and shuffle
    seed, extractor, reward and LPIPS-trunk options). Recorded in metrics.json ``settings``, so a caller
    that keeps a metrics folder (``study``, ``irg-sweep``) can tell whether it is still this request's
    (:func:`outputs_current`): a set extended, shrunk or re-rendered since has another manifest."""
    def manifest(root: str | Path | None) -> str | None:
        path = None if root is None else Path(root) / MANIFEST_FILE
        return sha256_file(path) if path is not None and path.is_file() else None

    parts = {
        "metrics": list(metrics),
        "image_set": manifest(image_set),
        "reference": manifest(reference),
        "is": [options.is_splits, options.is_seed],
        "extractor_options": options.extractor_options,
        "reward_options": options.reward_options,
        "lpips_trunk": options.lpips_trunk,
        "precision": options.precision,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def outputs_current(
    out_dir: str | Path,
    image_set: str | Path,
    metrics: list[str],
    reference: str | Path | None = None,
    options: MetricsOptions | None = None,
) -> bool:
    """Whether ``out_dir`` holds a complete metrics folder (its ``metrics.json``) of exactly this request:
    its recorded :func:`request_fingerprint` equals the one of the files on disk now. A folder written
    before fingerprints were recorded, or unreadable, is not current (measured again, from the caches)."""
    try:
        recorded = json.loads(metrics_path(out_dir).read_text())["settings"]["request_fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    options = options or MetricsOptions()
    return recorded == request_fingerprint(image_set, parse_metrics(metrics), reference, options)


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
    for one in (s, ref):  # every file against its recorded sha256 before any cache keyed by it is used
        if one is not None:
            with report.timed("verify"):
                one.verify()
    if dist.is_main():
        remove_stale_temps(cache_root(s, options))  # left by a killed run; never ones a live process holds
    with matmul_precision(options.precision):  # every network of the call: TF32 exactly when asked
        out, per_prompt, per_image, objects, extractors = _measure(s, ref, names, options, report)
    return MetricsResult(out, _settings(s, ref, names, extractors, objects, options), per_prompt, per_image)


def _measure(
    s: ImageSet, ref: ImageSet | None, names: list[str], options: MetricsOptions, report: ExtractionReport
) -> tuple[dict[str, float], pd.DataFrame, pd.DataFrame, list[Metric], dict[str, FeatureExtractor]]:
    """Stages 2-3 of :func:`compute_metrics` on verified sets: one decode pass per set, then each metric."""
    objects, extractors, wanted = build_metrics(names, options)
    data = EvalData(s, ref, options, report, extractors)
    # one decode pass per set for every extractor and image consumer (LPIPS) of this call
    consumers = [c for m in objects if (c := m.image_consumer(data)) is not None]
    cached = {src: extractors[src] for src, outs in wanted.items() if outs}
    got = extract_sets(s, cached, options, report, consumers)
    data.outputs = {src: {k: got[src][k] for k in wanted[src]} for src in cached}
    fd_sources = {m.info.source for m in objects if m.kind == "fd"}
    if ref is not None and fd_sources:  # the FD metrics' reference features, in one pass too
        extract_sets(ref, {src: extractors[src] for src in sorted(fd_sources)}, options, report)
    out: dict[str, float] = {}
    per_prompt, per_image = _tables(s, ref)
    for metric in objects:
        with report.timed(f"metric:{metric.name}"):
            metric.update(data)
            metric.sync()
            values = metric.compute()
        _add_values(values, out, per_prompt, per_image)
    return out, per_prompt, per_image, objects, extractors


# ----------------------------------------------------------------------------- stage 4: outputs


def write_outputs(result: MetricsResult, out_dir: str | Path, check: Callable[[], None] | None = None) -> None:
    """Rank 0 writes the Parquet tables and ``metrics.json`` as one group (:func:`pcpo_eval.io.atomic_write_files`):
    all three are written to temporary names first, then a ``metrics.json`` already there is removed and
    the tables and, last, ``metrics.json`` are renamed into place. A folder with ``metrics.json`` is complete
    (:mod:`pcpo_eval.metricsdir`): an interrupted or failed rewrite (a full disk) leaves the old three, or
    new tables without a ``metrics.json``, never new tables beside old values. The writes hold the
    folder's lock (:func:`pcpo_eval.io.exclusive`): two runs into one ``--out`` take turns. ``check`` runs again
    under the lock (:func:`check_out_dir`): a run into the same folder that finished meanwhile may have written
    another image set's metrics there, which these would replace (both runs exited 0; the first set's lost)."""
    if not dist.is_main():
        return
    out = Path(out_dir)
    with exclusive(lock_path(out)):
        if check is not None:
            check()
        text = json_text(result.as_json()).encode()
        atomic_write_files([(per_prompt_path(out), lambda fh: result.per_prompt.to_parquet(fh, index=False)),
                            (per_image_path(out), lambda fh: result.per_image.to_parquet(fh, index=False)),
                            (metrics_path(out), lambda fh: fh.write(text))],
                           before_commit=lambda: metrics_path(out).unlink(missing_ok=True))


#: What a metrics folder may hold besides temporary files: its outputs and lock.
_METRICS_FOLDER_FILES = frozenset({METRICS_FILE, PER_PROMPT_FILE, PER_IMAGE_FILE, LOCK_FILE})


def check_out_dir(out_dir: str | Path, image_set: str | Path | None = None,
                  reference: str | Path | None = None, cache_dir: str | Path | None = None) -> None:
    """UserError if ``out_dir`` cannot hold the outputs (checked before any work): a file; a folder with
    other content than a metrics folder's (a user's folder, an image set's ``images/``); a metrics folder
    whose ``metrics.json`` belongs to another image set that still exists (its results would be replaced:
    pass another ``--out``); an existing folder inside the image set or the reference. Before, each of these
    was written into (or replaced) with exit 0. A ``cache_dir`` at or inside ``out_dir`` is the call's own
    (``--out D --cache-dir D`` run twice is a re-run)."""
    out = Path(out_dir)
    check_not_an_input(out, "--out", [p for p in (image_set, reference) if p is not None])
    for name, src in (("image set", image_set), ("reference", reference)):  # new folders inside it too
        if src is not None and Path(src).is_dir() and out.resolve().is_relative_to(Path(src).resolve()):
            raise UserError(f"--out {out} lies inside the {name} {src}; choose a folder outside it (the set's "
                            "folder holds its images and records only)")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory; choose a directory")
    if not out.is_dir():
        return
    other = foreign_entries(out, _METRICS_FOLDER_FILES | _cache_entry(out, cache_dir))
    if other:
        raise UserError(f"--out {out} holds other files ({', '.join(other[:3])}{', ...' if len(other) > 3 else ''}), "
                        "not a metrics folder; choose an empty or new folder")
    recorded = _recorded_image_set(out)  # a set moved or deleted since: nothing left to mix up
    if (image_set is not None and recorded is not None and Path(recorded).is_dir()
            and Path(recorded).resolve() != Path(image_set).resolve()):
        raise UserError(f"--out {out} holds the metrics of another image set ({recorded}); choose another --out "
                        "(or delete that folder to replace them)")


def _cache_entry(out: Path, cache_dir: str | Path | None) -> frozenset[str]:
    """The entry of ``out`` that holds the feature cache when ``cache_dir`` is ``out`` or inside it."""
    if cache_dir is None:
        return frozenset()
    features = (Path(cache_dir) / FEATURES_DIR).resolve()
    try:
        return frozenset({features.relative_to(out.resolve()).parts[0]})
    except ValueError:  # the cache lives elsewhere
        return frozenset()


def _recorded_image_set(out: Path) -> str | None:
    """The image set a metrics folder's ``metrics.json`` was computed on (None: none, or unreadable)."""
    try:
        return str(json.loads(metrics_path(out).read_text())["settings"]["image_set"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_metrics(
    image_set: str | Path,
    metrics: str | list[str],
    out_dir: str | Path | None,
    reference: str | Path | None = None,
    options: MetricsOptions | None = None,
) -> dict[str, Any]:
    """Compute ``metrics`` for ``image_set`` and (if ``out_dir``) write the three outputs."""
    def check() -> None:
        check_out_dir(out_dir, image_set, reference, (options or MetricsOptions()).cache_dir)

    if out_dir is not None:
        check()
        if dist.is_main():
            remove_stale_temps(out_dir, recursive=False)
    result = compute_metrics(image_set, metrics, reference, options)
    if out_dir is not None:
        write_outputs(result, out_dir, check)
    return result.as_json()


def export_features(
    image_set: str | Path, extractor: str, out_file: str | Path, options: MetricsOptions | None = None
) -> np.ndarray:
    """Write the (N, d) float32 features of ``image_set`` in manifest order to ``out_file`` (.npy)."""
    options = options or MetricsOptions()
    out = Path(out_file)
    if out.suffix != ".npy":
        raise UserError(f"--output {out} must end in .npy; give a file name such as features.npy")
    if out.is_dir():
        raise UserError(f"--output {out} is a directory; give a .npy file path")
    s = ImageSet.load(image_set)
    s.verify()
    if dist.is_main():
        remove_stale_temps(cache_root(s, options))
        remove_stale_temps(out.parent, recursive=False)
    ext = make_extractor(extractor, device=options.device, **options.extractor_options.get(extractor, {}))
    with matmul_precision(options.precision):
        feats = extract_set(s, ext, options)["features"]
    if dist.is_main():
        with atomic_write(out, "wb") as fh:
            np.save(fh, feats)
    return feats
