"""THE metric catalogue: every metric's kind, source, weights backends, label and direction.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    """kind: fd | is | lpips | reward; source: extractor / embedder / reward name."""

    kind: str
    source: str


#: output name -> how it is computed
METRICS: dict[str, MetricSpec] = {
    "fid": MetricSpec("fd", "inception"),
    "fd_dinov2": MetricSpec("fd", "dinov2"),
    "fd_toy": MetricSpec("fd", "toy"),
    "is": MetricSpec("is", "inception"),
    "is_toy": MetricSpec("is", "toy"),
    "lpips": MetricSpec("lpips", "alex"),
    "lpips_toy": MetricSpec("lpips", "toy"),
    **{
        name: MetricSpec("reward", name)
        for name in ("hps", "pickscore", "imagereward", "clipscore", "aesthetic")
    },
}


#: metric name -> weights backends (pcpo_eval.weights) it needs; toy metrics ship their weights.
METRIC_BACKENDS: dict[str, tuple[str, ...]] = {
    "fid": ("inception",),
    "is": ("inception",),
    "fd_dinov2": ("dinov2",),
    "lpips": ("lpips_alex",),
    "fd_toy": (),
    "is_toy": (),
    "lpips_toy": (),
    "hps": ("hps",),
    "pickscore": ("pickscore", "pickscore_processor"),
    "imagereward": ("imagereward", "imagereward_med_config", "bert_base_uncased"),
    "clipscore": ("clipscore",),
    "aesthetic": ("aesthetic", "clip_vit_l14"),
}
#: preference metrics (scores of the images alone; no reference set needed)
PREFERENCE_METRICS = ("hps", "pickscore", "imagereward", "clipscore", "aesthetic")
#: display names in the report's tables (paper style)
METRIC_LABELS = {
    "fid": "FID", "fd_dinov2": "FD-DINOv2", "is": "IS*", "lpips": "LPIPS", "fd_toy": "FD (toy)",
    "is_toy": "IS* (toy)", "lpips_toy": "LPIPS (toy)", "hps": "HPSv2.1", "pickscore": "PickScore",
    "imagereward": "ImgRwd", "clipscore": "CLIPScore", "aesthetic": "Aesthetic",
}  # fmt: skip
