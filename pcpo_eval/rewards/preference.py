"""Real preference models as rewards / per-image metrics, loaded from local weights only.

Each factory returns a reward ``fn(images, prompts) -> float32 (B,)`` (CPU tensor) with ``images`` a
uint8 tensor (B, 3, H, W); it batches internally (``batch_size``) and runs under ``torch.no_grad``
on ``device``. Weights are found by :func:`pcpo_eval.weights.locate` (explicit path > env var >
caches); nothing is ever downloaded. The conventions follow each model's reference code:

=============  ===========================================================================  ==========
name           score                                                                        typical
=============  ===========================================================================  ==========
aesthetic      LAION improved-aesthetic-predictor: MLP 768-1024-128-64-16-1 (dropouts, no   4-7 (1-10)
               activations) on the L2-normalised OpenAI CLIP ViT-L/14 image embedding, as
               ddpo-pytorch's ``aesthetic_scorer.py`` (``sac+logos+ava1-l14-linearMSE.pth``)
hps            HPSv2.1: cosine of normalised OpenCLIP ViT-H-14 image / text features with   0.25-0.35
               the HPS_v2.1 weights (``hpsv2/img_score.py``: diag of img @ txt.T)
pickscore      PickScore_v1: ``logit_scale.exp() * cosine`` of the CLIP-H image / text      20-23
               embeddings; processor of laion/CLIP-ViT-H-14-laion2B-s32B-b79K
imagereward    ImageReward-v1.0: BLIP ViT-L image embeds -> BLIP text encoder with          -2..2
               cross-attention, [CLS] -> MLP, then ``(r - 0.16717) / 1.03334``
clipscore      raw cosine of normalised CLIP image / text features (the paper's table;      0.3-0.4
               torchmetrics' CLIPScore is ``100 * max(cos, 0)``); backbone configurable
=============  ===========================================================================  ==========

Preprocessing is done on tensors and follows each model's own processor: resize the shortest
edge to 224 with antialiased bicubic (``torchvision.transforms.v2.functional.resize`` on uint8,
which is exactly what transformers' torchvision-backend ``CLIPImageProcessor`` does), center crop,
``/255``, normalise with the model's mean / std. The PIL-based reference transforms (open_clip's,
ImageReward's) differ from this only by PIL's uint8 rounding inside the resize (see
docs/preference.md, "Preprocessing", for measured differences); images already at 224x224 are bit-identical.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.weights.locate import locate

#: OpenAI CLIP normalisation (open_clip ``OPENAI_DATASET_MEAN/STD``; ImageReward; CLIP processors).
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: ImageReward's score normalisation (THUDM/ImageReward ``ImageReward.py``: self.mean / self.std).
IMAGEREWARD_MEAN = 0.16717362830052426
IMAGEREWARD_STD = 1.0333394966054072

#: PIL resample codes used in HF ``preprocessor_config.json`` -> torchvision interpolation names.
_PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}

ImagesAndPrompts = Callable[[torch.Tensor, list[str]], torch.Tensor]


# ==================================================================================================
# Preprocessing (pure functions on tensors)
# ==================================================================================================


@dataclass(frozen=True)
class ImageCfg:
    """How a model's processor turns an image into pixel values.

    ``resize``: ``("shortest", n)`` resizes the shortest edge to n keeping the aspect ratio
    (torchvision ``Resize(n)`` / HF ``{"shortest_edge": n}``), ``("squash", (h, w))`` resizes to
    exactly (h, w), ``None`` skips resizing. ``crop`` is the center-crop size (None: no crop).
    ``crop_rounding``: torchvision rounds the crop offset (``int(round((H - h) / 2))``), transformers
    truncates it (``int((H - h) / 2)``); they differ only for odd margins. ``float_resize``: rescale first
    and resize the float image (``ToTensor()`` before ``Resize``, as HPSv2's ``preprocess_val``: no rounding to
    uint8, bicubic overshoot kept); else resize the uint8 image (PIL's and transformers' order).
    """

    resize: tuple[str, Any] | None = ("shortest", 224)
    crop: tuple[int, int] | None = (224, 224)
    mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    std: tuple[float, ...] = OPENAI_CLIP_STD
    interpolation: str = "bicubic"
    crop_rounding: Literal["torchvision", "hf"] = "torchvision"
    rescale: float = 1.0 / 255.0
    float_resize: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def shortest_edge_size(h: int, w: int, size: int) -> tuple[int, int]:
    """Output (h, w) of a shortest-edge resize to ``size`` (torchvision and HF: long side truncated)."""
    if h <= w:
        return size, int(size * w / h)
    return int(size * h / w), size


def center_crop_offsets(h: int, w: int, ch: int, cw: int, rounding: str = "torchvision") -> tuple[int, int]:
    """Top/left offsets of a (ch, cw) center crop of an (h, w) image under either convention."""
    if rounding == "torchvision":
        return int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
    return int((h - ch) / 2.0), int((w - cw) / 2.0)


def preprocess_images(images: torch.Tensor, cfg: ImageCfg) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> normalised float32 (B, 3, h, w) per ``cfg`` (resize, crop, rescale, normalise).

    The resize runs on the uint8 tensor with antialiasing, so its output is rounded to uint8 like
    PIL's and like transformers' torchvision backend (``tvF.resize(uint8, antialias=True)``); with
    ``cfg.float_resize`` on the rescaled float image (HPSv2).
    """
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as tvF

    x = images.to(torch.float32) * cfg.rescale if cfg.float_resize else images
    if cfg.resize is not None:
        mode, size = cfg.resize
        h, w = x.shape[-2:]
        if mode == "shortest":
            out_hw = shortest_edge_size(h, w, int(size))
        elif mode == "squash":
            out_hw = (int(size[0]), int(size[1]))
        else:
            raise UserError(f"unsupported resize mode {mode!r}; use 'shortest' or 'squash'")
        if out_hw != (h, w):
            x = tvF.resize(x, list(out_hw), interpolation=InterpolationMode(cfg.interpolation), antialias=True)
    if cfg.crop is not None:
        ch, cw = cfg.crop
        h, w = x.shape[-2:]
        if ch > h or cw > w:  # both references pad with zeros; only possible with odd configs
            x = tvF.center_crop(x, [ch, cw])
        else:
            top, left = center_crop_offsets(h, w, ch, cw, cfg.crop_rounding)
            x = x[..., top : top + ch, left : left + cw]
    if not cfg.float_resize:
        x = x.to(torch.float32) * cfg.rescale
    mean = torch.tensor(cfg.mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(cfg.std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (x - mean) / std


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    if isinstance(v, dict):
        if "height" in v and "width" in v:
            return int(v["height"]), int(v["width"])
        if "shortest_edge" in v:
            return int(v["shortest_edge"]), int(v["shortest_edge"])
    raise UserError(f"unsupported image size entry {v!r} in preprocessor_config.json")


def image_cfg_from_hf(config: dict[str, Any]) -> ImageCfg:
    """:class:`ImageCfg` of a transformers ``preprocessor_config.json`` (CLIPImageProcessor keys)."""
    resize: tuple[str, Any] | None = None
    if config.get("do_resize", True):
        size = config.get("size", {"shortest_edge": 224})
        if isinstance(size, int):
            resize = ("shortest", size)
        elif "shortest_edge" in size:
            resize = ("shortest", int(size["shortest_edge"]))
        else:
            resize = ("squash", _pair(size))
    crop = _pair(config.get("crop_size", 224)) if config.get("do_center_crop", True) else None
    resample = config.get("resample", 3)
    if resample not in _PIL_RESAMPLE:
        raise UserError(f"unsupported resample {resample!r} in preprocessor_config.json")
    return ImageCfg(
        resize=resize,
        crop=crop,
        mean=tuple(config.get("image_mean", OPENAI_CLIP_MEAN)),
        std=tuple(config.get("image_std", OPENAI_CLIP_STD)),
        interpolation=_PIL_RESAMPLE[resample],
        crop_rounding="hf",
        rescale=float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else 1.0,
    )


def image_cfg_from_open_clip(pp: dict[str, Any]) -> ImageCfg:
    """:class:`ImageCfg` of an open_clip ``model.visual.preprocess_cfg`` (its validation transform)."""
    size = pp.get("size", 224)
    hw = (size, size) if isinstance(size, int) else tuple(size)
    mode = pp.get("resize_mode", "shortest")
    if mode == "shortest":
        if hw[0] != hw[1]:
            raise UserError("open_clip non-square 'shortest' preprocessing is not supported")
        resize: tuple[str, Any] = ("shortest", hw[0])
    elif mode == "squash":
        resize = ("squash", hw)
    else:
        raise UserError(f"open_clip resize_mode {mode!r} is not supported; use a model with 'shortest' or 'squash'")
    return ImageCfg(
        resize=resize,
        crop=hw if mode == "shortest" else None,
        mean=tuple(pp.get("mean", OPENAI_CLIP_MEAN)),
        std=tuple(pp.get("std", OPENAI_CLIP_STD)),
        interpolation=pp.get("interpolation", "bicubic"),
        crop_rounding="torchvision",
    )


# ==================================================================================================
# Scores (pure functions)
# ==================================================================================================


def cosine_scores(image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine of paired features: ``diag(normalize(I) @ normalize(T).T)`` as (B,), float32."""
    i = F.normalize(image_features.float(), dim=-1)
    t = F.normalize(text_features.float(), dim=-1)
    return (i * t).sum(dim=-1)


class AestheticMLP(nn.Module):
    """LAION improved-aesthetic-predictor head: 768-1024-128-64-16-1, dropouts, no activations.

    Module names match ``sac+logos+ava1-l14-linearMSE.pth`` (``layers.0/2/4/6/7.{weight,bias}``);
    dropout is inactive in eval mode, so the head is one affine map of the normalised embedding.
    """

    def __init__(self, input_size: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embeds: torch.Tensor) -> torch.Tensor:
        return self.layers(embeds)


def imagereward_normalize(raw: torch.Tensor) -> torch.Tensor:
    """ImageReward's standardisation of the MLP output: ``(r - mean) / std`` (ImageReward.py)."""
    return (raw - IMAGEREWARD_MEAN) / IMAGEREWARD_STD


# ==================================================================================================
# The reward callable
# ==================================================================================================


def check_inputs(images: Any, prompts: Sequence[str]) -> None:
    """Validate the reward contract: uint8 (B, 3, H, W) tensor and B prompt strings."""
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        raise UserError("preference rewards take a uint8 tensor (B, 3, H, W); convert images with to(torch.uint8)")
    if images.ndim != 4 or images.shape[1] != 3:
        raise UserError(f"preference rewards take RGB images (B, 3, H, W), got shape {tuple(images.shape)}")
    if len(prompts) != images.shape[0]:
        raise UserError(f"got {images.shape[0]} images but {len(prompts)} prompts; pass one prompt per image")


@dataclass
class PreferenceReward:
    """A loaded preference model as a reward ``fn(images, prompts) -> float32 (B,)``.

    ``score_batch(images_on_device, prompts)`` scores one batch; ``__call__`` validates, splits into
    ``batch_size`` chunks, runs under ``torch.no_grad`` and returns a CPU float32 tensor.
    ``settings`` records what was loaded (paths, preprocessing) for result files.
    """

    name: str
    score_batch: ImagesAndPrompts
    batch_size: int
    device: torch.device
    settings: dict[str, Any] = field(default_factory=dict)
    module: nn.Module | None = None  # the loaded network(s), for inspection / .to()

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_inputs(images, prompts)
        prompts = [str(p) for p in prompts]
        out: list[torch.Tensor] = []
        with torch.no_grad():
            for start in range(0, images.shape[0], self.batch_size):
                chunk = images[start : start + self.batch_size].to(self.device)
                scores = self.score_batch(chunk, prompts[start : start + self.batch_size])
                out.append(scores.detach().reshape(-1).to("cpu", torch.float32))
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.float32)


def _common(device: str | torch.device, batch_size: int, dtype: str) -> tuple[torch.device, torch.dtype]:
    if int(batch_size) < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    try:
        torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    except KeyError:
        raise UserError(f"unknown dtype {dtype!r}; choose one of: float32, float16, bfloat16") from None
    return torch.device(device), torch_dtype


def _unique_prompts(prompts: list[str]) -> tuple[list[str], torch.Tensor]:
    """Distinct prompts (first-seen order) and the index of each prompt among them."""
    index: dict[str, int] = {}
    inverse = [index.setdefault(p, len(index)) for p in prompts]
    return list(index), torch.tensor(inverse, dtype=torch.long)


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt / truncated / not a torch file
        raise MissingWeightsError(f"cannot read weights file {path} ({type(exc).__name__}); re-download it") from exc


# ==================================================================================================
# Backbones
# ==================================================================================================


def open_clip_offline_kwargs() -> dict[str, bool]:
    """``create_model`` flags that stop open_clip fetching tower weights (2.x: pretrained_hf, 3.x: _text)."""
    import inspect

    import open_clip

    params = inspect.signature(open_clip.create_model).parameters
    flags = {"pretrained_image": False}
    for name in ("pretrained_text", "pretrained_hf"):
        if name in params:
            flags[name] = False
    return flags


class OpenClipTower(nn.Module):
    """An open_clip CLIP model + tokenizer + its validation preprocessing, on tensors.

    Built with ``open_clip.create_model(model_name, pretrained=<local file>)`` (strict load; a
    ``{"state_dict": ...}`` checkpoint with or without ``module.`` prefixes is accepted, as
    open_clip's ``load_checkpoint`` does) and never a pretrained tag, so nothing is downloaded.
    ``float_resize``: HPSv2's validation transform (``ToTensor`` before ``Resize``, :class:`ImageCfg`), not
    mainline open_clip's (the PIL image resized).
    """

    def __init__(self, model_name: str, weights: Path, device: torch.device, dtype: torch.dtype,
                 float_resize: bool = False) -> None:
        super().__init__()
        import open_clip

        try:
            self.model = open_clip.create_model(
                model_name, pretrained=str(weights), device=device, **open_clip_offline_kwargs()
            )
        except RuntimeError as exc:
            if "not found in built-ins" in str(exc):
                raise UserError(f"unknown open_clip model {model_name!r}; use a name from open_clip.list_models()") from exc
            raise UserError(f"{weights} does not match open_clip {model_name}: {str(exc).splitlines()[0][:200]}") from exc
        self.model = self.model.to(device=device, dtype=dtype).eval()
        self.tokenizer = open_clip.get_tokenizer(model_name)
        self.image_cfg = dataclasses.replace(image_cfg_from_open_clip(dict(self.model.visual.preprocess_cfg)),
                                             float_resize=float_resize)
        self.device, self.dtype = device, dtype

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        px = preprocess_images(images, self.image_cfg).to(self.device, self.dtype)
        return self.model.encode_image(px)

    def text_features(self, prompts: list[str]) -> torch.Tensor:
        return self.model.encode_text(self.tokenizer(prompts).to(self.device))


class HFClipTower(nn.Module):
    """A transformers CLIPModel folder + tokenizer + image processor config, on tensors.

    Features are computed as ``visual_projection(vision_model(px).pooler_output)`` and
    ``text_projection(text_model(ids).pooler_output)``, i.e. ``get_image_features`` /
    ``get_text_features`` in every transformers version (5.x returns an output object from those).
    """

    def __init__(
        self,
        model_dir: Path,
        processor_dir: Path,
        device: torch.device,
        dtype: torch.dtype,
        need_text: bool = True,
    ) -> None:
        super().__init__()
        from transformers import CLIPModel

        cfg_path = processor_dir / "preprocessor_config.json"
        if not cfg_path.is_file():
            raise MissingWeightsError(f"{cfg_path} is missing; the CLIP folder needs its preprocessor_config.json")
        self.image_cfg = image_cfg_from_hf(json.loads(cfg_path.read_text()))
        self.model = CLIPModel.from_pretrained(str(model_dir), local_files_only=True)
        self.model = self.model.to(device=device, dtype=dtype).eval()
        self.tokenizer = None
        if need_text:
            from transformers import AutoTokenizer

            has_files = (processor_dir / "tokenizer.json").is_file() or (
                (processor_dir / "vocab.json").is_file() and (processor_dir / "merges.txt").is_file()
            )
            try:
                if not has_files:
                    raise OSError("no tokenizer files")
                self.tokenizer = AutoTokenizer.from_pretrained(str(processor_dir), local_files_only=True)
            except (OSError, ValueError, TypeError) as exc:
                raise MissingWeightsError(
                    f"no CLIP tokenizer files (vocab.json, merges.txt or tokenizer.json) in {processor_dir}; copy them there"
                ) from exc
        self.max_length = int(self.model.config.text_config.max_position_embeddings)
        self.device, self.dtype = device, dtype

    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        px = preprocess_images(images, self.image_cfg).to(self.device, self.dtype)
        pooled = self.model.vision_model(pixel_values=px).pooler_output
        return self.model.visual_projection(pooled)

    def text_features(self, prompts: list[str]) -> torch.Tensor:
        assert self.tokenizer is not None
        tok = self.tokenizer(prompts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        out = self.model.text_model(
            input_ids=tok["input_ids"].to(self.device), attention_mask=tok["attention_mask"].to(self.device)
        )
        return self.model.text_projection(out.pooler_output)


def _cosine_batch(tower: nn.Module, scale: Callable[[], torch.Tensor] | None = None) -> ImagesAndPrompts:
    """Batch scorer ``scale * cos(image, text)`` with each distinct prompt encoded once per batch."""

    def score(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        uniq, inverse = _unique_prompts(prompts)
        text = tower.text_features(uniq)
        text = text[inverse.to(text.device)]
        cos = cosine_scores(tower.image_features(images), text)
        return cos * scale().float() if scale is not None else cos

    return score


# ==================================================================================================
# Factories (registered in pcpo_eval.rewards.REGISTRY)
# ==================================================================================================


def hpsv21(
    weights: str | None = None,
    version: str = "v2.1",
    model_name: str = "ViT-H-14",
    device: str | torch.device = "cpu",
    batch_size: int = 16,
    dtype: str = "float32",
) -> PreferenceReward:
    """HPSv2.1 reward: cosine of normalised OpenCLIP ViT-H-14 features with HPS weights.

    Reference: tgxs002/HPSv2 ``img_score.py`` (``logits_per_image = image_features @ text_features.T``;
    score = its diagonal; features normalised by open_clip's ``forward``). ``version='v2.0'`` loads
    ``HPS_v2_compressed.pt`` instead (backend ``hps_v20``), used by the paper's DPO-comparison table.
    ``weights``: explicit checkpoint path, else ``PCPO_HPS_WEIGHTS`` (``PCPO_HPS_V20_WEIGHTS``), else caches.
    """
    backend = {"v2.1": "hps", "v2.0": "hps_v20"}.get(version)
    if backend is None:
        raise UserError(f"unknown HPS version {version!r}; choose one of: v2.1, v2.0")
    dev, torch_dtype = _common(device, batch_size, dtype)
    path = locate(backend, weights)
    tower = OpenClipTower(model_name, path, dev, torch_dtype, float_resize=True)  # HPSv2's preprocess_val
    return PreferenceReward(
        name="hps",
        score_batch=_cosine_batch(tower),
        batch_size=int(batch_size),
        device=dev,
        settings={"model": f"HPS{version}", "backbone": f"open_clip:{model_name}", "weights": str(path),
                  "score": "cosine", "preprocess": tower.image_cfg.to_dict(), "dtype": dtype},
        module=tower,
    )


def hpsv20(device: str | torch.device = "cpu", **options: Any) -> PreferenceReward:
    """HPSv2 (v2.0 weights, backend ``hps_v20``): :func:`hpsv21` with ``version='v2.0'``; reward / metric
    ``hps_v20`` (the paper's Table dpo-comparison, l.1276)."""
    return hpsv21(**{**options, "device": device, "version": "v2.0"})


def pickscore(
    model_path: str | None = None,
    processor_path: str | None = None,
    device: str | torch.device = "cpu",
    batch_size: int = 16,
    dtype: str = "float32",
) -> PreferenceReward:
    """PickScore_v1 reward: ``logit_scale.exp() * cosine`` (yuvalkirstain/PickScore README recipe).

    Model: transformers CLIPModel folder (``PCPO_PICKSCORE_PATH`` / HF cache of
    yuvalkirstain/PickScore_v1); processor + tokenizer: laion/CLIP-ViT-H-14-laion2B-s32B-b79K
    (``PCPO_PICKSCORE_PROCESSOR_PATH``), text padded / truncated to 77 tokens.
    """
    dev, torch_dtype = _common(device, batch_size, dtype)
    mpath = locate("pickscore", model_path)
    ppath = locate("pickscore_processor", processor_path)
    tower = HFClipTower(mpath, ppath, dev, torch_dtype)
    return PreferenceReward(
        name="pickscore",
        score_batch=_cosine_batch(tower, scale=lambda: tower.model.logit_scale.exp()),
        batch_size=int(batch_size),
        device=dev,
        settings={"model": "PickScore_v1", "weights": str(mpath), "processor": str(ppath),
                  "score": "logit_scale.exp() * cosine", "preprocess": tower.image_cfg.to_dict(), "dtype": dtype},
        module=tower,
    )


def clipscore(
    path: str | None = None,
    model_name: str | None = None,
    pretrained: str | None = None,
    device: str | torch.device = "cpu",
    batch_size: int = 32,
    dtype: str = "float32",
) -> PreferenceReward:
    """CLIPScore as the raw cosine of normalised CLIP image / text features (the paper's table).

    Backbone: a transformers CLIP folder (``path``, else ``PCPO_CLIPSCORE_PATH``, else the HF cache
    of openai/clip-vit-large-patch14), or an open_clip model (``model_name='ViT-L-14'`` with
    ``pretrained=<local checkpoint file>``). Hessel et al.'s CLIP-S is ``2.5 * max(cos, 0)`` and
    torchmetrics' ``100 * max(cos, 0)``; convert from this raw value if needed.
    """
    dev, torch_dtype = _common(device, batch_size, dtype)
    tower: nn.Module
    if model_name is not None:
        if pretrained is None:
            raise MissingWeightsError(
                f"clipscore with open_clip model {model_name!r} needs pretrained=<local checkpoint file>"
            )
        file = Path(pretrained).expanduser()
        if not file.is_file():
            raise MissingWeightsError(f"clipscore: pretrained file {pretrained} not found; pass a local checkpoint file")
        tower = OpenClipTower(model_name, file, dev, torch_dtype)
        backbone, weights = f"open_clip:{model_name}", str(file)
    else:
        mdir = locate("clipscore", path)
        tower = HFClipTower(mdir, mdir, dev, torch_dtype)
        backbone, weights = "transformers:CLIPModel", str(mdir)
    return PreferenceReward(
        name="clipscore",
        score_batch=_cosine_batch(tower),
        batch_size=int(batch_size),
        device=dev,
        settings={"model": "CLIPScore", "backbone": backbone, "weights": weights, "score": "raw cosine",
                  "preprocess": tower.image_cfg.to_dict(), "dtype": dtype},
        module=tower,
    )


def laion_aesthetic(
    weights: str | None = None,
    clip_path: str | None = None,
    device: str | torch.device = "cpu",
    batch_size: int = 32,
    dtype: str = "float32",
) -> PreferenceReward:
    """LAION aesthetic score: ``MLP(normalize(CLIP-L/14 image embedding))`` (ddpo-pytorch convention).

    MLP weights: ``sac+logos+ava1-l14-linearMSE.pth`` (``PCPO_AESTHETIC_WEIGHTS``); CLIP:
    transformers folder of openai/clip-vit-large-patch14 (``PCPO_CLIP_L14_PATH``). The prompt is
    ignored. The embedding is L2-normalised in float32 before the MLP, as in the reference.
    """
    dev, torch_dtype = _common(device, batch_size, dtype)
    mlp_path = locate("aesthetic", weights)
    cdir = locate("clip_vit_l14", clip_path)
    tower = HFClipTower(cdir, cdir, dev, torch_dtype, need_text=False)
    mlp = AestheticMLP(int(tower.model.config.projection_dim))
    state = _torch_load(mlp_path)
    try:
        mlp.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise UserError(
            f"{mlp_path} is not an aesthetic MLP state dict (layers.0..7, 768-d input): {str(exc).splitlines()[0][:160]}"
        ) from exc
    mlp = mlp.to(dev).eval()

    def score(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        emb = F.normalize(tower.image_features(images).float(), dim=-1)
        return mlp(emb).squeeze(-1)

    return PreferenceReward(
        name="aesthetic",
        score_batch=score,
        batch_size=int(batch_size),
        device=dev,
        settings={"model": "LAION aesthetic (sac+logos+ava1-l14-linearMSE)", "weights": str(mlp_path),
                  "clip": str(cdir), "preprocess": tower.image_cfg.to_dict(), "dtype": dtype},
        module=nn.ModuleDict({"clip": tower, "mlp": mlp}),
    )


# --------------------------------------------------------------------------------------------------
# ImageReward (optional 'preference' extra: the image-reward package)
# --------------------------------------------------------------------------------------------------


def imagereward_score_batch(model: Any, pixel_values: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """ImageReward-v1.0 scores of a preprocessed batch, batched form of ``ImageReward.score``.

    As THUDM/ImageReward ``ImageReward.py``: tokenise (``padding='max_length'``, ``max_length=35``,
    truncation), ``image_embeds = blip.visual_encoder(px)``, ``blip.text_encoder(ids, mask,
    encoder_hidden_states=image_embeds, encoder_attention_mask=ones)``, take the [CLS] hidden state,
    ``mlp`` -> ``(r - mean) / std``. ``model`` needs ``.blip.{tokenizer, visual_encoder, text_encoder}``
    and ``.mlp``.
    """
    device = pixel_values.device
    tok = model.blip.tokenizer(prompts, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    image_embeds = model.blip.visual_encoder(pixel_values)
    image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=device)
    out = model.blip.text_encoder(
        tok["input_ids"].to(device),
        attention_mask=tok["attention_mask"].to(device),
        encoder_hidden_states=image_embeds,
        encoder_attention_mask=image_atts,
        return_dict=True,
    )
    feats = out.last_hidden_state[:, 0, :].float()
    return imagereward_normalize(model.mlp(feats)).squeeze(-1)


def _blip_tokenizer_from(path: Path) -> Callable[[], Any]:
    """BLIP's ``init_tokenizer`` reading bert-base-uncased from a local folder (no hub lookup).

    Same steps as BLIP's ``blip.init_tokenizer``: BertTokenizer, add bos '[DEC]' and the additional
    special token '[ENC]', record ``enc_token_id``.
    """

    def init_tokenizer() -> Any:
        from transformers import BertTokenizer

        tokenizer = BertTokenizer.from_pretrained(str(path), local_files_only=True)
        tokenizer.add_special_tokens({"bos_token": "[DEC]"})
        tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
        tokenizer.enc_token_id = tokenizer.convert_tokens_to_ids("[ENC]")  # = additional_special_tokens_ids[0]
        return tokenizer

    return init_tokenizer


def load_imagereward_model(
    weights: Path, med_config: Path, tokenizer_dir: Path, device: torch.device
) -> nn.Module:
    """Build ``ImageReward.ImageReward.ImageReward`` from local files only and load ``ImageReward.pt``."""
    try:
        import ImageReward.models.BLIP.blip_pretrain as blip_pretrain
        from ImageReward.ImageReward import ImageReward as ImageRewardModel
    except Exception as exc:  # ImportError, or the package's own imports failing (timm / transformers)
        raise UserError(
            "imagereward needs the optional 'image-reward' package, which failed to import "
            f"({type(exc).__name__}: {str(exc)[:120]}); install it as docs/preference.md (section 'Optional extra preference') describes"
        ) from exc
    from unittest import mock

    with mock.patch.object(blip_pretrain, "init_tokenizer", _blip_tokenizer_from(tokenizer_dir)):
        model = ImageRewardModel(med_config=str(med_config), device=str(device))
    state = _torch_load(weights)
    result = model.load_state_dict(state, strict=False)  # strict=False as in ImageReward.utils.load
    missing = [k for k in result.missing_keys if not k.endswith("position_ids")]
    if missing or result.unexpected_keys:
        warnings.warn(
            f"ImageReward checkpoint {weights}: {len(missing)} missing keys (e.g. {missing[:3]}), "
            f"{len(result.unexpected_keys)} unexpected (e.g. {result.unexpected_keys[:3]})",
            stacklevel=2,
        )
    return model.to(device).eval()


def cast_imagereward_model(model: nn.Module, device: str | torch.device, dtype: str = "float32") -> nn.Module:
    """Cast an ImageReward model **in place** for scoring at ``dtype`` on ``device``; returns ``model``.

    The BLIP towers go to ``dtype``, the MLP stays float32 (the reference feeds it float32 [CLS]
    states), and the model is put in eval mode. :func:`imagereward` applies this to the model it loads
    itself; a caller who passes ``model=`` calls it first (on the object, or on ``copy.deepcopy`` of
    it), since the factory never changes a module it is given.
    """
    dev, torch_dtype = _common(device, 1, dtype)
    model = model.to(device=dev, dtype=torch_dtype).eval()
    model.mlp.float()
    return model


def _same_device(have: torch.device, want: torch.device) -> bool:
    """``have`` (a tensor's device) is ``want``; a ``want`` without an index means the current one."""
    if have.type != want.type:
        return False
    if want.index is None:
        return have.type != "cuda" or have.index == torch.cuda.current_device()
    return have.index == want.index


def imagereward_model_mismatch(model: nn.Module, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``model`` is not ready to score on ``device`` at ``dtype`` as :func:`cast_imagereward_model`
    leaves it (None when it is): training mode, or a floating tensor on another device / dtype (BLIP
    towers at ``dtype``, ``mlp.*`` float32)."""
    if any(m.training for m in model.modules()):
        return "it is in training mode (dropout would make scores random)"
    tensors = [(name, t) for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_floating_point()]
    wrong = [
        (name, t) for name, t in tensors
        if (not _same_device(t.device, device) or t.dtype != (torch.float32 if name.startswith("mlp.") else dtype))
    ]
    if not wrong:
        return None
    name, t = wrong[0]
    return f"{name} is {str(t.dtype).removeprefix('torch.')} on {t.device} ({len(wrong)} of {len(tensors)} floating tensors differ)"


def imagereward(
    weights: str | None = None,
    med_config: str | None = None,
    tokenizer_path: str | None = None,
    device: str | torch.device = "cpu",
    batch_size: int = 16,
    dtype: str = "float32",
    model: nn.Module | None = None,
) -> PreferenceReward:
    """ImageReward-v1.0 reward (BLIP-based), via the optional ``image-reward`` package.

    Files: ``ImageReward.pt`` (``PCPO_IMAGEREWARD_WEIGHTS``), ``med_config.json`` (next to it, or
    ``PCPO_IMAGEREWARD_MED_CONFIG``), and the bert-base-uncased tokenizer folder
    (``PCPO_BERT_TOKENIZER_PATH`` or the HF cache), which BLIP would otherwise fetch from the hub.
    Preprocessing: ImageReward's ``_transform(224)`` (bicubic shortest-edge resize, center crop,
    OpenAI CLIP mean / std). ``dtype`` is the BLIP towers' (``float16`` / ``bfloat16`` on a GPU); the
    MLP stays float32, as the reference feeds it float32 [CLS] states (before, any other ``dtype``
    failed at the MLP's first layer).

    ``model``: an already built model with the same attributes (tests, or a model the caller loaded).
    It is used as given and never changed: it must already be in eval mode on ``device`` with its
    towers at ``dtype`` and its MLP float32; otherwise this refuses (``UserError``) and names
    :func:`cast_imagereward_model`, which prepares it in place on the caller's say-so. (Before, the
    factory cast and moved the caller's module in place; copying it instead would hold a second
    full-precision copy of a model that reduced precision is asked for to save memory.)
    """
    dev, torch_dtype = _common(device, batch_size, dtype)
    settings: dict[str, Any] = {"model": "ImageReward-v1.0", "score": "(mlp(cls) - 0.16717) / 1.03334", "dtype": dtype}
    if model is None:
        wpath = locate("imagereward", weights)
        if med_config is None and (wpath.parent / "med_config.json").is_file():
            mpath = wpath.parent / "med_config.json"
        else:
            mpath = locate("imagereward_med_config", med_config)
        tpath = locate("bert_base_uncased", tokenizer_path)
        model = load_imagereward_model(wpath, mpath, tpath, dev)
        settings.update(weights=str(wpath), med_config=str(mpath), tokenizer=str(tpath))
        model = cast_imagereward_model(model, dev, dtype)  # ours: cast in place
    elif (problem := imagereward_model_mismatch(model, dev, torch_dtype)) is not None:
        raise UserError(
            f"imagereward(model=...): the given module is not ready for device={str(dev)!r}, dtype={dtype!r}: "
            f"{problem}; the factory does not change a module it is given. Prepare it first with "
            f"pcpo_eval.rewards.preference.cast_imagereward_model(model, {str(dev)!r}, {dtype!r}) "
            "(in place: eval mode, BLIP towers at dtype, MLP float32; on copy.deepcopy(model) to keep yours), "
            "or pass the device / dtype it already has"
        )
    cfg = ImageCfg()  # ImageReward _transform(224): Resize(224, bicubic), CenterCrop(224), CLIP mean/std
    settings["preprocess"] = cfg.to_dict()

    def score(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        px = preprocess_images(images, cfg).to(dev, torch_dtype)
        return imagereward_score_batch(model, px, prompts)

    return PreferenceReward(
        name="imagereward", score_batch=score, batch_size=int(batch_size), device=dev, settings=settings, module=model
    )

