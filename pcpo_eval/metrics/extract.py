"""Stage 2 of the metric workers: per-image network outputs through the hash-keyed feature cache.

Batches of images not yet cached are dealt round-robin to the ranks of a ``torch.distributed``
group (:mod:`pcpo_eval.dist`); each rank writes its chunks, and after a barrier every rank reads
the complete cache. So the arrays :func:`extract_set` and :func:`score_set` return are the same
on every rank: the shared cache is their cross-process reduction.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from pcpo_eval import dist
from pcpo_eval.errors import UserError
from pcpo_eval.features import FeatureExtractor
from pcpo_eval.imageset import ImageSet
from pcpo_eval.metrics.base import IS_DEFAULT_SEED, IS_DEFAULT_SPLITS
from pcpo_eval.metrics.cache import FeatureCache
from pcpo_eval.precision import numerics_key
from pcpo_eval.progress import progress_bar


@dataclass
class MetricsOptions:
    """Knobs of a metrics run (all recorded in the settings)."""

    batch_size: int = 32
    device: str = "cpu"
    is_splits: int = IS_DEFAULT_SPLITS
    is_seed: int = IS_DEFAULT_SEED
    #: feature cache root; default ``<image set>/.pcpo_cache``
    cache_dir: str | Path | None = None
    #: extractor name -> factory options (``weights_path``, or a ``classifier`` stand-in for toy)
    extractor_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: reward name -> ``make_reward`` options
    reward_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: LPIPS AlexNet trunk: local weights path, None (locate) or "random" (tests only)
    lpips_trunk: str | None = None
    lpips_batch: int = 16
    #: ``fp32`` (TF32 off) or ``tf32`` for the networks' float32 products on CUDA
    #: (:func:`pcpo_eval.precision.resolve_eval_precision`); part of the caches' keys
    precision: str = "fp32"
    #: progress bar of the decode pass (:func:`pcpo_eval.progress.progress_enabled`; None: when stderr is a TTY)
    progress: bool | None = None


@dataclass
class ExtractionReport:
    """How many unique images this rank computed (the rest came from the cache), and where its seconds went.

    ``seconds``: wall seconds per phase of this rank, summed over the call's passes: ``verify`` (hash
    checks before any cache is trusted), ``read`` (waiting for the next decoded batch and its host-side
    resizes (:meth:`FeatureExtractor.prepare`, e.g. DINOv2's PIL resize): what the background thread did
    not hide), ``extract:<name>`` (the rest of each extractor: device resize if any, network, copy to
    the host), ``cache`` (feature chunks written), ``consume:<metric>`` (LPIPS embedding of the pass's
    images; device work it queues may be counted by the next phase that waits for the device) and
    ``metric:<name>`` (each metric's own update and compute: statistics, Frechet distances, pairs).
    """

    computed: int = 0
    cached: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the wall seconds of the block to ``seconds[phase]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


def cache_root(image_set: ImageSet, options: MetricsOptions) -> Path:
    return Path(options.cache_dir) if options.cache_dir is not None else image_set.root / ".pcpo_cache"


#: the folder under a cache root that holds the feature caches (one per extractor)
FEATURES_DIR = "features"


def _compute_into_cache(
    cache: FeatureCache,
    image_set: ImageSet,
    keys: list[str],
    batch_size: int,
    compute: Callable[[list[int]], dict[str, np.ndarray]],
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
    # the keys derive from the files' recorded hashes: check the files whose values come from the cache
    # (the rows computed now are checked as they are read)
    _verify_cached_rows(image_set, {first_row[k] for k in missing})
    report.cached += len(first_row) - len(missing)
    batches = [missing[i : i + batch_size] for i in range(0, len(missing), batch_size)]
    for batch in batches[dist.rank() :: dist.world_size()]:
        rows = [first_row[k] for k in batch]
        arrays = compute(rows)
        cache.write_chunk(batch, {k: np.asarray(v) for k, v in arrays.items()})
        report.computed += len(batch)
    dist.barrier()
    cache.refresh()


def _verify_cached_rows(image_set: ImageSet, decoded: set[int]) -> None:
    """Check the files of every row not in ``decoded`` against their recorded hashes (the values of
    those rows come from a cache keyed by the hash; :meth:`ImageSet.read_image` checks the decoded ones,
    on whichever rank reads them). A cold cache so reads each file once, a warm one hashes every file."""
    image_set.verify([r for r in range(len(image_set)) if r not in decoded])


def _prefetched(image_set: ImageSet, batches: list[list[int]], report: ExtractionReport,
                prepare: Callable[[list[int], torch.Tensor], Any] | None = None,
                ) -> Iterator[tuple[list[int], torch.Tensor, Any]]:
    """``(rows, images, prepare(rows, images))`` per batch, the next batch read, decoded and prepared
    (the extractors' host-side resizes) on a background thread while the caller runs the networks on
    this one (host work overlaps device compute; same images, same order). The time spent waiting for
    a batch goes to the report's ``read`` phase."""
    from concurrent.futures import ThreadPoolExecutor

    if not batches:
        return

    def load(rows: list[int]) -> tuple[torch.Tensor, Any]:
        images = image_set.read_batch(rows)
        return images, (prepare(rows, images) if prepare is not None else None)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pcpo-prefetch") as pool:
        pending = pool.submit(load, batches[0])
        for i, rows in enumerate(batches):
            with report.timed("read"):
                images, prepared = pending.result()
            if i + 1 < len(batches):
                pending = pool.submit(load, batches[i + 1])
            yield rows, images, prepared


class ImageConsumer(Protocol):
    """Something besides the extractors that needs decoded images of a pass (LPIPS per prompt)."""

    name: str  #: the metric it feeds (the report's ``consume:<name>`` phase)
    rows: set[int]

    def consume(self, rows: list[int], images: torch.Tensor) -> None:
        """Images (uint8 (B, 3, H, W)) of ``rows`` (manifest rows, increasing), each row exactly once."""


def feature_cache_settings(extractor: FeatureExtractor, options: MetricsOptions) -> dict[str, Any]:
    """The feature cache's key: the extractor's settings (weights, resize, ...), its cached outputs and
    the :func:`~pcpo_eval.precision.numerics_key` (device type and precision) the features came from."""
    outputs = ["features", "logits"] if extractor.has_logits else ["features"]
    return {**extractor.settings(), "outputs": outputs, "numerics": numerics_key(options.device, options.precision)}


def _feature_cache(image_set: ImageSet, extractor: FeatureExtractor, options: MetricsOptions) -> FeatureCache:
    settings = feature_cache_settings(extractor, options)
    return FeatureCache(cache_root(image_set, options) / FEATURES_DIR, extractor.name, settings)


def extract_sets(
    image_set: ImageSet,
    extractors: dict[str, FeatureExtractor],
    options: MetricsOptions,
    report: ExtractionReport | None = None,
    consumers: Sequence[ImageConsumer] = (),
) -> dict[str, dict[str, np.ndarray]]:
    """Every extractor's outputs in manifest order, each image read, verified and decoded once.

    One pass over the rows some extractor's cache lacks (batches of ``options.batch_size`` dealt
    round-robin to the ranks, as before), then over the rows ``consumers`` ask for on this rank that
    no batch of this rank held: each decoded batch goes to every extractor missing those rows and to
    every consumer wanting them. So
    ``fid,fd_dinov2,is,lpips`` decodes a set once per process instead of three times.
    """
    report = report if report is not None else ExtractionReport()
    keys = image_set.shas
    first_row: dict[str, int] = {}
    for row, k in enumerate(keys):
        first_row.setdefault(k, row)
    caches = {name: _feature_cache(image_set, ext, options) for name, ext in extractors.items()}
    dist.barrier()  # every rank must see the same missing lists: scan between two barriers
    missing = {}
    for name, cache in caches.items():
        cache.refresh()
        missing[name] = {first_row[k] for k in cache.missing(keys)}
        report.cached += len(first_row) - len(missing[name])
    dist.barrier()
    union = sorted(set().union(*missing.values())) if missing else []
    with report.timed("verify"):
        _verify_cached_rows(image_set, set(union))  # the rows decoded below are checked as they are read
    b = options.batch_size
    dealt = [union[i:i + b] for i in range(0, len(union), b)][dist.rank()::dist.world_size()]
    mine = {r for chunk in dealt for r in chunk}
    extra = sorted(set().union(*(c.rows for c in consumers)) - mine)  # consumer rows no batch of mine holds
    batches = dealt + [extra[i:i + b] for i in range(0, len(extra), b)]
    bar = progress_bar(sum(map(len, batches)), f"metrics {image_set.root.name}",
                       options.progress if dist.rank() == 0 else False, unit="img")

    def wanted(name: str, rows: list[int]) -> list[int]:
        return [j for j, r in enumerate(rows) if r in mine and r in missing[name]]

    def prepare(rows: list[int], images: torch.Tensor) -> dict[str, Any]:
        """The extractors' host-side preprocessing, run ahead on the prefetch thread (FeatureExtractor.prepare)."""
        out = {}
        for name, ext in extractors.items():
            if (prep := getattr(ext, "prepare", None)) is not None and (idx := wanted(name, rows)):
                out[name] = prep(images[idx])
        return out

    for rows, images, prepared in _prefetched(image_set, batches, report, prepare):
        bar.update(len(rows))
        for name, ext in extractors.items():
            idx = wanted(name, rows)
            if idx:
                with report.timed(f"extract:{name}"):
                    got = ext.extract(images[idx]) if prepared.get(name) is None else ext.extract_prepared(prepared[name])
                    out = {k: v.numpy().astype(np.float32) for k, v in got.items()}
                with report.timed("cache"):
                    caches[name].write_chunk([keys[rows[j]] for j in idx], out)
                report.computed += len(idx)
        for c in consumers:
            idx = [j for j, r in enumerate(rows) if r in c.rows]
            if idx:
                with report.timed(f"consume:{c.name}"):
                    c.consume([rows[j] for j in idx], images[idx])
    bar.close()
    dist.barrier()
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, cache in caches.items():
        cache.refresh()
        out[name] = cache.gather(keys, ["features", "logits"] if extractors[name].has_logits else ["features"])
    return out


def extract_set(
    image_set: ImageSet,
    extractor: FeatureExtractor,
    options: MetricsOptions,
    outputs: tuple[str, ...] = ("features",),
    report: ExtractionReport | None = None,
) -> dict[str, np.ndarray]:
    """Per-image outputs (``features``, ``logits``) of one extractor in manifest order, through the cache."""
    got = extract_sets(image_set, {extractor.name: extractor}, options, report)[extractor.name]
    return {k: got[k] for k in outputs}


def reward_keys(image_set: ImageSet) -> list[str]:
    """Reward cache keys: sha256(image sha256 + prompt) (a score depends on both)."""
    m = image_set.manifest
    return [
        hashlib.sha256(f"{s}\n{p}".encode()).hexdigest()
        for s, p in zip(m["image_sha256"].astype(str), m["prompt"].astype(str), strict=True)
    ]


def load_reward(name: str, options: dict[str, Any], device: str | None = None) -> Any:
    """``pcpo_eval.rewards.make_reward`` with a one-line error if the backend is not installed; with
    ``device``, built there unless ``options`` name one (:func:`pcpo_eval.rewards.options_on_device`)."""
    from pcpo_eval.rewards import make_reward, options_on_device

    try:
        if device is not None:  # resolving the factory imports its module: inside the try
            options = options_on_device(name, options, str(device))
        return make_reward(name, **options)
    except ModuleNotFoundError as exc:
        raise UserError(f"reward {name!r} is unavailable: module {exc.name!r} is not installed") from exc


def reward_settings(name: str, fn: Any, options: dict[str, Any]) -> dict[str, Any]:
    """What determines a reward's scores: its name, its ``info``/``settings`` dict and the options."""
    info = getattr(fn, "info", None) or getattr(fn, "settings", None) or {}
    return {"reward": name, **(info if isinstance(info, dict) else {}), **options}


def path_identity(value: Any) -> list[Any] | None:
    """``[size, mtime_ns]`` of the file a settings value names, or ``[[relative name, size, mtime_ns], ...]``
    of the files under the folder it names; None when it names no existing path.

    A reward records its weights by path (``settings["weights"]``): this stat identity (the one
    :mod:`pcpo_eval.imageset` trusts for checked images) tells new weights written over the old ones
    at that path, without hashing gigabytes per run."""
    if not isinstance(value, str | os.PathLike) or not str(value):
        return None
    try:
        path = Path(value)
        if path.is_file():
            st = path.stat()
            return [st.st_size, st.st_mtime_ns]
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
            return [[str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    except (OSError, ValueError):  # a name too long, or not a path at all
        return None
    return None


def reward_cache_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The reward cache's key: ``settings`` (:func:`reward_settings`) as text, plus the
    :func:`path_identity` of every value that names a file or folder (``files``)."""
    files = {str(v): ident for v in settings.values() if (ident := path_identity(v)) is not None}
    return {**{k: str(v) for k, v in settings.items()}, "files": files}


def score_set(
    image_set: ImageSet,
    fn: Any,
    settings: dict[str, Any],
    options: MetricsOptions,
    report: ExtractionReport | None = None,
) -> np.ndarray:
    """Per-image scores of reward ``fn`` (float32, manifest order) through a cache keyed by image + prompt.

    ``settings`` (:func:`reward_settings`) key the cache with the identity of the files they name
    (:func:`reward_cache_settings`): other weights, or new weights at the same path, other directory.
    """
    report = report if report is not None else ExtractionReport()
    key = {**reward_cache_settings(settings), "numerics": numerics_key(options.device, options.precision)}
    cache = FeatureCache(cache_root(image_set, options) / "rewards", str(settings["reward"]), key)
    prompts = image_set.manifest["prompt"].astype(str).tolist()

    def compute(rows: list[int]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            scores = fn(image_set.read_batch(rows), [prompts[r] for r in rows])
        return {"score": torch.as_tensor(scores).detach().float().cpu().numpy().reshape(len(rows))}

    keys = reward_keys(image_set)
    _compute_into_cache(cache, image_set, keys, options.batch_size, compute, report)
    return cache.gather(keys, ["score"])["score"]
