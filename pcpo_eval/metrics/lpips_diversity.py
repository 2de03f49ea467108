"""LPIPS diversity: mean LPIPS over all unordered pairs of one prompt's images.

LPIPS v0.1 (Zhang et al., 2018; the ``lpips`` package) between images x and y is

    d(x, y) = sum_l 1/(H_l W_l) sum_{h,w} sum_c w_{l,c} (f^x_{l,chw} - f^y_{l,chw})^2,

with f_l the trunk activations normalized to unit length over channels (``lpips.normalize_tensor``,
eps 1e-10 added to the norm) and w_l >= 0 the linear-layer weights. Writing

    g(x) = concat_l  sqrt(w_l) * f^x_l / sqrt(H_l W_l)       (one vector per image)

gives d(x, y) = ||g(x) - g(y)||^2: each image goes through the trunk ONCE and every pairwise
distance follows from the Gram matrix G = g g^T, d_ij = G_ii + G_jj - 2 G_ij. Summing over
unordered pairs collapses the Gram matrix to two running sums,

    sum_{i<j} d_ij = n * sum_i ||g_i||^2 - ||sum_i g_i||^2,

so the per-prompt mean needs only running first and second moments of g (kept as n, mean and
centered M2 for stability, :class:`PairwiseAccumulator`): memory is O(D) whatever the number of
images (1112 per prompt in the paper), and accumulators of different batches or ranks merge exactly. :func:`pairwise_distances` keeps the explicit block-wise Gram path (for
distance matrices and tests).

The metric never builds g on the host: :func:`segment_moments` turns one batch's trunk activations
into each prompt's (n, mean, M2) layer by layer on the trunk's device (D = 2.66 M floats, 10.6 MB per
512-px image; copying g to the host and centering it there cost ~12 ms per image on an H200 host, far
more than the trunk). Only a prompt's final scalar (and, between batches, the D-vector mean of a prompt
whose images are still arriving) leaves the device.

``lpips`` uses AlexNet + the v0.1 linear layers shipped in the ``lpips`` wheel; the AlexNet trunk is
torchvision's ImageNet weights, read only from a local file (never downloaded). ``lpips_toy`` uses
the toy classifier's layers the same way with uniform weights (w = 1).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pcpo_eval.errors import UserError
from pcpo_eval.features import FeatureExtractor
from pcpo_eval.features.base import check_uint8_images
from pcpo_eval.io import atomic_write_json, sha256_file
from pcpo_eval.metrics.base import MetricInfo
from pcpo_eval.metrics.cache import settings_digest
from pcpo_eval.metrics.extract import MetricsOptions, cache_root
from pcpo_eval.metrics.metric import EvalData, Metric, MetricValues
from pcpo_eval.precision import numerics_key

EPS = 1e-10  # lpips.normalize_tensor


def normalize_channels(feat: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """Unit-normalize (N, C, H, W) activations over channels, exactly as ``lpips.normalize_tensor``."""
    return feat / (torch.sqrt(torch.sum(feat**2, dim=1, keepdim=True)) + eps)


def lin_weight_column(w: torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """A layer's (C,) linear weight as a float32 (1, C, 1, 1) column, checked non-negative."""
    w = w.detach().float().reshape(1, -1, 1, 1)
    if (w < 0).any():
        raise ValueError("LPIPS linear weights must be non-negative for the Gram identity")
    return w if device is None else w.to(device)


def embed_layer(feat: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """One layer's part of g, (N, C, H, W): sqrt(w) * normalize(f) / sqrt(H W) (``w``: a
    :func:`lin_weight_column` or ``None`` for uniform 1). A fresh float32 tensor (``feat`` untouched)."""
    f = normalize_channels(feat.float())
    scale = 1.0 / math.sqrt(feat.shape[2] * feat.shape[3])
    return f.mul_(torch.sqrt(w) * scale) if w is not None else f.mul_(scale)


def embed_layers(layers: Sequence[torch.Tensor], weights: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """g = concat_l sqrt(w_l) * normalize(f_l) / sqrt(H_l W_l) as an (N, D) tensor.

    ``weights[l]`` is the (C_l,) non-negative linear weight of layer l (``None`` = uniform 1).
    Computed in the trunk's float32 like ``lpips`` itself; the pair sums are accumulated in float64
    by :class:`PairwiseAccumulator`.
    """
    parts = []
    for feat, w in zip(layers, weights, strict=True):
        col = None if w is None else lin_weight_column(w, feat.device)
        parts.append(embed_layer(feat, col).flatten(1))
    return torch.cat(parts, dim=1)


def segment_moments(
    layers: Sequence[torch.Tensor], weights: Sequence[torch.Tensor | None], segments: Sequence[tuple[int, int]]
) -> list[PairwiseAccumulator]:
    """One :class:`PairwiseAccumulator` per ``(start, stop)`` row range of the batch, without building g.

    The same arithmetic as ``PairwiseAccumulator().update(embed_layers(layers, w)[start:stop])`` up to
    float rounding (float32 means and centered squares per layer, float64 totals), done layer by layer
    on the layers' device: no (N, D) concatenation, no copy to the host, no synchronization (the mean
    and M2 stay device tensors). ``weights``: :func:`lin_weight_column` columns or ``None``.
    """
    means: list[list[torch.Tensor]] = [[] for _ in segments]
    m2s: list[list[torch.Tensor]] = [[] for _ in segments]
    for feat, w in zip(layers, weights, strict=True):
        f = embed_layer(feat, w)
        for k, (a, b) in enumerate(segments):
            part = f[a:b]
            mb = part.mean(dim=0)
            part.sub_(mb)  # centered in place: f is ours
            m2s[k].append((part * part).sum())
            means[k].append(mb.flatten())
        del f
    return [
        PairwiseAccumulator(b - a, torch.stack(m2s[k]).double().sum(), torch.cat(means[k]).double())
        for k, (a, b) in enumerate(segments)
    ]


@dataclass
class PairwiseAccumulator:
    """Running (n, mean g, M2 = sum ||g_i - mean||^2) of one prompt's embeddings.

    sum_{i<j} ||g_i - g_j||^2 = n * M2, so the mean over unordered pairs is 2 M2 / (n - 1). Batches
    and ranks merge with Chan et al.'s parallel-variance update (no cancellation between large
    sums): M2 = M2_a + M2_b + ||mean_a - mean_b||^2 n_a n_b / (n_a + n_b). Within a batch the
    centered squares are summed in the trunk's float32 (all terms >= 0); merges are float64.
    ``mean`` and ``m2`` live on the device of the embeddings (``m2`` a 0-d tensor once updated), so
    updates and merges never wait for the device; :meth:`mean_distance` reads the one scalar.
    """

    n: int = 0
    m2: float | torch.Tensor = 0.0
    mean: torch.Tensor | None = field(default=None)

    def update(self, g: torch.Tensor) -> PairwiseAccumulator:
        mb = g.mean(dim=0)
        centered = g - mb
        return self.merge(PairwiseAccumulator(g.shape[0], (centered * centered).sum().double(), mb.double()))

    def to(self, device: torch.device | str) -> PairwiseAccumulator:
        """Move the running mean and M2 to ``device`` (in place; returns self)."""
        if self.mean is not None:
            self.mean = self.mean.to(device)
        if torch.is_tensor(self.m2):
            self.m2 = self.m2.to(device)
        return self

    def merge(self, other: PairwiseAccumulator) -> PairwiseAccumulator:
        if other.mean is None or other.n == 0:
            return self
        if self.mean is None or self.n == 0:
            self.n, self.m2, self.mean = other.n, other.m2, other.mean.clone()
            return self
        self.to(other.mean.device)
        n = self.n + other.n
        delta = other.mean - self.mean
        self.m2 = self.m2 + other.m2 + (delta @ delta) * (self.n * other.n / n)
        self.mean = self.mean + delta * (other.n / n)
        self.n = n
        return self

    @property
    def n_pairs(self) -> int:
        return self.n * (self.n - 1) // 2

    def mean_distance(self) -> float:
        """Mean LPIPS over the n(n-1)/2 unordered pairs (n >= 2)."""
        if self.n < 2:
            raise ValueError(f"LPIPS diversity needs at least 2 images, have {self.n}")
        return 2.0 * float(self.m2) / (self.n - 1)


def pairwise_distances(g: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Full (n, n) matrix d_ij = G_ii + G_jj - 2 G_ij, built block by block (float64, clamped >= 0)."""
    g = g.double()
    sq = (g * g).sum(dim=1)
    n = g.shape[0]
    out = torch.empty(n, n, dtype=torch.float64)
    for i in range(0, n, block):
        for j in range(0, n, block):
            gram = g[i : i + block] @ g[j : j + block].T
            out[i : i + block, j : j + block] = (
                sq[i : i + block, None] + sq[None, j : j + block] - 2 * gram
            ).clamp_min(0)
    out.fill_diagonal_(0)
    return out


class LpipsEmbedder(nn.Module):
    """Per-image LPIPS embedding g(x) from an ``lpips.LPIPS`` model (trunk run once per image).

    ``forward``: g on the host (tests, distance matrices); ``moments``: per-prompt accumulators on the
    trunk's device (the metric's path, :func:`segment_moments`).
    """

    name = "lpips"

    def __init__(self, model: nn.Module, info: dict[str, Any], device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False).to(device)
        self.device = torch.device(device)
        self.info = info
        #: the v0.1 linear weights as checked (1, C, 1, 1) columns on the device, once (not per batch)
        self.lin_columns = [lin_weight_column(lin.model[-1].weight, self.device) for lin in self.model.lins]

    def layers(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Trunk activations for uint8 images, scaled to [-1, 1] as ``lpips.im2tensor`` does."""
        check_uint8_images(images)
        x = images.to(self.device).float() / 127.5 - 1.0
        return list(self.model.net.forward(self.model.scaling_layer(x)))

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        weights = [lin.model[-1].weight.view(-1) for lin in self.model.lins]
        return embed_layers(self.layers(images), weights).cpu()

    @torch.no_grad()
    def moments(self, images: torch.Tensor, segments: Sequence[tuple[int, int]]) -> list[PairwiseAccumulator]:
        """:func:`segment_moments` of ``images`` (trunk once per image), left on the device."""
        return segment_moments(self.layers(images), self.lin_columns, segments)


class ToyLpipsEmbedder(nn.Module):
    """``lpips_toy``: the toy classifier's layers, channel-normalized, uniform weights."""

    name = "lpips_toy"

    def __init__(self, layers_fn: Callable[[torch.Tensor], list[torch.Tensor]], info: dict[str, Any]) -> None:
        super().__init__()
        self.layers_fn = layers_fn
        self.info = info

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        layers = self.layers_fn(images)
        return embed_layers(layers, [None] * len(layers)).cpu()

    @torch.no_grad()
    def moments(self, images: torch.Tensor, segments: Sequence[tuple[int, int]]) -> list[PairwiseAccumulator]:
        """:func:`segment_moments` of ``images`` with uniform weights, on the classifier's device."""
        layers = self.layers_fn(images)
        return segment_moments(layers, [None] * len(layers), segments)


def locate_alexnet(weights_path: str | os.PathLike | None = None) -> Path:
    """Local torchvision AlexNet weights via :func:`pcpo_eval.weights.locate` (backend ``lpips_alex``:
    explicit > ``$PCPO_ALEXNET_WEIGHTS`` > ``$PCPO_WEIGHTS_DIR`` > ``$TORCH_HOME/hub/checkpoints``)."""
    from pcpo_eval.weights.locate import locate

    return locate("lpips_alex", weights_path)


def lin_weights_path(net: str = "alex", version: str = "0.1") -> Path:
    """The linear-layer weights shipped inside the ``lpips`` wheel."""
    import lpips

    return Path(lpips.__file__).parent / "weights" / f"v{version}" / f"{net}.pth"


def build_lpips_model(
    trunk: str | os.PathLike | None = None, seed: int = 0
) -> tuple[nn.Module, dict[str, Any]]:
    """``lpips.LPIPS(net="alex", version="0.1")`` with the wheel's linear layers and a local trunk.

    ``trunk``: a path to torchvision AlexNet weights, ``None`` (locate them) or ``"random"`` (a
    randomly initialized trunk from ``torch.Generator(seed)``, for tests and benchmarks only).
    """
    import lpips

    model = lpips.LPIPS(net="alex", version="0.1", pretrained=True, pnet_rand=True, verbose=False)
    info: dict[str, Any] = {
        "net": "alex",
        "version": "0.1",
        "lin_weights": str(lin_weights_path()),
        "lin_weights_sha256": sha256_file(lin_weights_path()),
        "input": "uint8 / 127.5 - 1 at native resolution",
    }
    if trunk == "random":
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / math.sqrt(max(1, p[0].numel()))))
        info.update(trunk="random", trunk_seed=seed)
    else:
        path = locate_alexnet(trunk)
        try:  # a truncated, empty or foreign file: one line naming it, not torch's traceback
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            own = model.net.state_dict()
            mapped = {}
            for key in own:  # "slice2.3.weight" <- torchvision "features.3.weight"
                _, idx, kind = key.split(".")
                mapped[key] = state[f"features.{idx}.{kind}"]
            model.net.load_state_dict(mapped)
        except (OSError, EOFError, RuntimeError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as exc:
            from pcpo_eval.weights.backends import BACKENDS

            raise UserError(f"LPIPS trunk {path} is not torchvision's AlexNet weights file ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:100] if str(exc) else 'no detail'}); replace it with "
                            f"{BACKENDS['lpips_alex'].obtain}") from None
        info.update(trunk=str(path), trunk_sha256=sha256_file(path))
    return model.eval(), info


def make_lpips_embedder(
    trunk: str | os.PathLike | None = None, device: str | torch.device = "cpu", seed: int = 0
) -> LpipsEmbedder:
    """LPIPS AlexNet v0.1 embedder (see :func:`build_lpips_model`)."""
    model, info = build_lpips_model(trunk, seed)
    return LpipsEmbedder(model, info, device)


def lpips_diversity(
    embedder: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, batch: int = 32
) -> float:
    """Mean LPIPS over all unordered pairs of ``images`` (uint8 NCHW), trunk once per image.

    Through the embedder's ``moments`` (on its device) when it has one, else through g = embedder(x).
    """
    acc = PairwiseAccumulator()
    moments = getattr(embedder, "moments", None)
    for i in range(0, images.shape[0], batch):
        chunk = images[i : i + batch]
        if moments is not None:
            acc.merge(moments(chunk, [(0, chunk.shape[0])])[0])
        else:
            acc.update(embedder(chunk))
    return acc.mean_distance()


def naive_lpips_diversity(model: nn.Module, images: torch.Tensor, batch: int = 64) -> float:
    """Reference: ``lpips.LPIPS.forward`` on every unordered pair (tests and benchmark only)."""
    n = images.shape[0]
    x = images.float() / 127.5 - 1.0
    ii, jj = np.triu_indices(n, k=1)
    total = 0.0
    with torch.no_grad():
        for s in range(0, len(ii), batch):
            a, b = torch.from_numpy(ii[s : s + batch]), torch.from_numpy(jj[s : s + batch])
            total += float(model(x[a], x[b]).double().sum())
    return total / len(ii)


# ----------------------------------------------------------------------------- the metric (kind "lpips")


def make_embedder(
    info: MetricInfo, extractors: dict[str, FeatureExtractor], options: MetricsOptions
) -> tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, Any]]:
    """The embedder g of ``info`` and its settings: AlexNet v0.1 (``lpips``) or the toy classifier."""
    if info.source == "toy":
        toy = extractors["toy"]
        settings = {
            "layers": "toy classifier layers, unit-normalized channels, uniform weights",
            **toy.settings(),
        }
        return ToyLpipsEmbedder(toy.layers, settings), settings
    embedder = make_lpips_embedder(options.lpips_trunk, device=options.device)
    return embedder, embedder.info


class LpipsDiversityMetric(Metric):
    """Mean pairwise LPIPS per prompt (intra-prompt diversity); overall = mean over prompts.

    State ``per_prompt`` (``{prompt_id: mean LPIPS}`` of the prompts dealt to this rank; merged).
    Each finished prompt is cached under ``CACHE/lpips/<embedder>-<settings digest>/``, keyed by the
    sha256 of its images, so a re-run skips it.
    """

    kind = "lpips"

    def __init__(
        self, info: MetricInfo, extractors: dict[str, FeatureExtractor], options: MetricsOptions
    ) -> None:
        super().__init__(info)
        self.embedder, self.embedder_settings = make_embedder(info, extractors, options)
        self.add_state("per_prompt", {}, "merge")

    @staticmethod
    def extractor_outputs(info: MetricInfo) -> dict[str, tuple[str, ...]]:
        return {"toy": ()} if info.source == "toy" else {}  # the toy classifier's layers, no cached outputs

    def _cache_path(self, data: EvalData, pid: int) -> Path:
        """``CACHE/lpips/<embedder>-<digest>/prompt-<sha256 of its images' hashes>.json``."""
        shas = data.image_set.shas
        opts = data.options
        digest = settings_digest({**self.embedder_settings, "numerics": numerics_key(opts.device, opts.precision)})[:16]
        root = cache_root(data.image_set, data.options) / "lpips" / f"{self.embedder.name}-{digest}"
        key = hashlib.sha256("\n".join(shas[r] for r in data.rows[pid]).encode()).hexdigest()[:24]
        return root / f"prompt-{key}.json"

    def image_consumer(self, data: EvalData) -> _LpipsConsumer | None:
        """This rank's uncached prompts, fed by the call's one decode pass (:func:`extract_sets`)."""
        data.image_set.verify()  # the per-prompt cache is keyed by the recorded hashes: check the files first
        todo = {pid: self._cache_path(data, pid) for pid in data.my_prompts()}
        todo = {pid: path for pid, path in todo.items() if not path.exists()}
        return _LpipsConsumer(self, data, todo) if todo else None

    def update(self, data: EvalData) -> None:
        s, batch = data.image_set, data.options.lpips_batch
        s.verify()  # the per-prompt cache is keyed by the recorded hashes: check the files first
        for pid in data.my_prompts():
            if pid in self.per_prompt:  # computed in the decode pass
                continue
            path = self._cache_path(data, pid)
            if path.exists():
                self.per_prompt[pid] = json.loads(path.read_text())["lpips"]
                continue
            rows = data.rows[pid]
            acc = PairwiseAccumulator()
            for i in range(0, len(rows), batch):
                chunk = rows[i : i + batch]
                acc.merge(self.embedder.moments(s.read_batch(chunk), [(0, len(chunk))])[0])
            self._finish(pid, acc, path)

    def _finish(self, pid: int, acc: PairwiseAccumulator, path: Path) -> None:
        self.per_prompt[pid] = acc.mean_distance()
        atomic_write_json(path, {"prompt_id": pid, "n": acc.n, "lpips": self.per_prompt[pid]})

    def compute(self) -> MetricValues:
        per_prompt = dict(sorted(self.per_prompt.items()))
        return MetricValues({self.name: float(np.mean(list(per_prompt.values())))}, {self.name: per_prompt})

    def settings(self) -> dict[str, Any]:
        return {
            f"{self.name}_settings": {
                **self.embedder_settings,
                "pairs": "all unordered pairs per prompt",
                "aggregate": "mean over prompts",
            }
        }


class _LpipsConsumer:
    """Embeds the decode pass's images of the prompts it was given; a prompt's mean pairwise LPIPS is
    written to its cache as soon as its last image arrives.

    Each decoded batch is regrouped by prompt and cut into trunk batches of ``lpips_batch`` images that
    may span several prompts (:func:`segment_moments` splits each trunk batch into per-prompt
    accumulators on the device). A prompt whose images are still arriving keeps its D-vector mean on
    the host between batches, so device memory stays bounded by one trunk batch whatever the number of
    open prompts (ranks dealt interleaved batches hold many).
    """

    def __init__(self, metric: LpipsDiversityMetric, data: EvalData, todo: dict[int, Path]) -> None:
        self.metric, self.todo, self.batch = metric, todo, data.options.lpips_batch
        self.name = metric.name
        self.prompt_of = {int(r): pid for pid in todo for r in data.rows[pid]}
        self.rows = set(self.prompt_of)
        self.left = {pid: len(data.rows[pid]) for pid in todo}
        self.acc = {pid: PairwiseAccumulator() for pid in todo}

    def consume(self, rows: list[int], images: torch.Tensor) -> None:
        by_prompt: dict[int, list[int]] = {}
        for j, r in enumerate(rows):
            by_prompt.setdefault(self.prompt_of[r], []).append(j)
        flat = [(pid, j) for pid, idx in by_prompt.items() for j in idx]  # images grouped by prompt
        for s in range(0, len(flat), self.batch):
            chunk = flat[s : s + self.batch]
            segments, pids, start = [], [], 0
            for k in range(1, len(chunk) + 1):
                if k == len(chunk) or chunk[k][0] != chunk[start][0]:
                    segments.append((start, k))
                    pids.append(chunk[start][0])
                    start = k
            accs = self.metric.embedder.moments(images[[j for _, j in chunk]], segments)
            for pid, acc in zip(pids, accs, strict=True):
                self.acc[pid].merge(acc)
        for pid, idx in by_prompt.items():
            self.left[pid] -= len(idx)
            if self.left[pid] == 0:
                self.metric._finish(pid, self.acc.pop(pid), self.todo[pid])
            else:
                self.acc[pid].to("cpu")  # park the open prompt's mean on the host until its next images
