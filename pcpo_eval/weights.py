"""Where the real models' weights live: one locator for every backend, and ``pcpo-eval weights``.

Nothing in pcpo-eval downloads weights. Every real model (feature nets for FID / FD-DINOv2 / LPIPS,
the preference models, the Stable Diffusion base pipelines) is resolved here from local files, in
this order (:func:`locate`):

1. an explicit path passed by the caller (a CLI flag or a factory option);
2. the backend's environment variable (e.g. ``PCPO_HPS_WEIGHTS``); if it is set, it must be valid:
   a wrong variable is an error, never silently skipped;
3. cache candidates, in the order listed: ``$PCPO_WEIGHTS_DIR`` (default
   ``~/.cache/pcpo_eval/weights``) holding the canonical file / folder name, the Hugging Face hub
   cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``; the snapshot
   ``refs/main`` points to), the torch hub cache (``TORCH_HOME/hub/checkpoints``) and the places
   the reference packages themselves cache to (clean-fid's ``/tmp``, ImageReward's
   ``~/.cache/ImageReward``, hpsv2's ``~/.cache/hpsv2``).

A backend absent everywhere raises :class:`pcpo_eval.errors.MissingWeightsError` with one line
naming the file and the variable to set. Paths are re-read from the environment on every call,
so tests (and users) can change ``HF_HOME`` / ``TORCH_HOME`` at run time.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import typer

from pcpo_eval.errors import MissingWeightsError, UserError

Kind = Literal["file", "dir"]


@dataclass(frozen=True)
class Backend:
    """A set of weights pcpo-eval can use, and where to look for it.

    ``kind == "file"``: a single weights file named ``filename``. ``kind == "dir"``: a folder (a
    Hugging Face ``save_pretrained`` layout) recognised by the marker file ``filename`` inside it.
    ``hf_repos`` are hub repositories whose cached snapshot holds ``filename``; ``torch_hub`` are
    paths relative to ``torch.hub.get_dir()``; ``extra`` are absolute paths (``~`` expanded, ``{tmp}``
    = the system temp dir) where reference packages cache the same file.
    """

    name: str
    description: str
    kind: Kind
    filename: str
    env_var: str
    obtain: str
    used_by: str
    hf_repos: tuple[str, ...] = ()
    torch_hub: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    cache_name: str | None = None  # name under $PCPO_WEIGHTS_DIR (default: filename or backend name)
    notes: tuple[str, ...] = field(default_factory=tuple)


def _hf_obtain(repo: str, files: str | None = None) -> str:
    what = f"{repo} {files}" if files else repo
    return f"on a machine with internet: `hf download {what}`, then copy the HF cache here (or point the variable at it)"


#: Every backend pcpo-eval knows, by name. Feature nets first, then preference models, then pipelines.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in [
        Backend(
            name="inception",
            description="Inception-v3 for FID/IS (NVIDIA TorchScript or torch-fidelity's converted TF weights)",
            kind="file",
            filename="inception-2015-12-05.pt",
            env_var="PCPO_INCEPTION_WEIGHTS",
            torch_hub=(
                "checkpoints/weights-inception-2015-12-05-6726825d.pth",
                "checkpoints/pt_inception-2015-12-05-6726825d.pth",
            ),
            extra=("{tmp}/inception-2015-12-05.pt",),
            obtain=(
                "download nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/inception-2015-12-05.pt "
                "(clean-fid) or torch-fidelity's weights-inception-2015-12-05-6726825d.pth release asset"
            ),
            used_by="metrics: fid, is (extractor 'inception')",
        ),
        Backend(
            name="dinov2",
            description="DINOv2 ViT-L/14 for FD-DINOv2 (transformers folder of facebook/dinov2-large)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_DINOV2_PATH",
            hf_repos=("facebook/dinov2-large",),
            cache_name="dinov2-large",
            obtain=_hf_obtain("facebook/dinov2-large"),
            used_by="metrics: fd_dinov2 (extractor 'dinov2')",
        ),
        Backend(
            name="lpips_alex",
            description="torchvision AlexNet trunk for LPIPS v0.1 (the linear layers ship in the lpips wheel)",
            kind="file",
            filename="alexnet-owt-7be5be79.pth",
            env_var="PCPO_ALEXNET_WEIGHTS",
            torch_hub=("checkpoints/alexnet-owt-7be5be79.pth",),
            obtain="download.pytorch.org/models/alexnet-owt-7be5be79.pth into TORCH_HOME/hub/checkpoints/",
            used_by="metrics: lpips",
        ),
        Backend(
            name="hps",
            description="HPSv2.1 (OpenCLIP ViT-H-14 fine-tuned), HPS_v2.1_compressed.pt",
            kind="file",
            filename="HPS_v2.1_compressed.pt",
            env_var="PCPO_HPS_WEIGHTS",
            hf_repos=("xswu/HPSv2",),
            extra=("~/.cache/hpsv2/HPS_v2.1_compressed.pt",),
            obtain=_hf_obtain("xswu/HPSv2", "HPS_v2.1_compressed.pt"),
            used_by="reward/metric 'hps'",
        ),
        Backend(
            name="hps_v20",
            description="HPSv2.0 (for the paper's DPO-comparison table), HPS_v2_compressed.pt",
            kind="file",
            filename="HPS_v2_compressed.pt",
            env_var="PCPO_HPS_V20_WEIGHTS",
            hf_repos=("xswu/HPSv2",),
            extra=("~/.cache/hpsv2/HPS_v2_compressed.pt",),
            obtain=_hf_obtain("xswu/HPSv2", "HPS_v2_compressed.pt"),
            used_by="reward/metric 'hps' with version='v2.0'",
        ),
        Backend(
            name="pickscore",
            description="PickScore_v1 CLIP-H model (transformers folder)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_PICKSCORE_PATH",
            hf_repos=("yuvalkirstain/PickScore_v1",),
            cache_name="PickScore_v1",
            obtain=_hf_obtain("yuvalkirstain/PickScore_v1"),
            used_by="reward/metric 'pickscore'",
        ),
        Backend(
            name="pickscore_processor",
            description="PickScore's processor/tokenizer: laion/CLIP-ViT-H-14-laion2B-s32B-b79K (configs only)",
            kind="dir",
            filename="preprocessor_config.json",
            env_var="PCPO_PICKSCORE_PROCESSOR_PATH",
            hf_repos=("laion/CLIP-ViT-H-14-laion2B-s32B-b79K",),
            cache_name="CLIP-ViT-H-14-laion2B-s32B-b79K",
            obtain=_hf_obtain(
                "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                "preprocessor_config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.json merges.txt",
            ),
            used_by="reward/metric 'pickscore'",
        ),
        Backend(
            name="imagereward",
            description="ImageReward-v1.0 BLIP reward model, ImageReward.pt (needs the 'preference' extra)",
            kind="file",
            filename="ImageReward.pt",
            env_var="PCPO_IMAGEREWARD_WEIGHTS",
            hf_repos=("THUDM/ImageReward",),
            extra=("~/.cache/ImageReward/ImageReward.pt",),
            obtain=_hf_obtain("THUDM/ImageReward", "ImageReward.pt med_config.json"),
            used_by="reward/metric 'imagereward'",
        ),
        Backend(
            name="imagereward_med_config",
            description="ImageReward's BLIP text-encoder config, med_config.json",
            kind="file",
            filename="med_config.json",
            env_var="PCPO_IMAGEREWARD_MED_CONFIG",
            hf_repos=("THUDM/ImageReward",),
            extra=("~/.cache/ImageReward/med_config.json",),
            obtain=_hf_obtain("THUDM/ImageReward", "med_config.json"),
            used_by="reward/metric 'imagereward' (also found next to ImageReward.pt)",
        ),
        Backend(
            name="bert_base_uncased",
            description="bert-base-uncased tokenizer files for ImageReward's BLIP (vocab.txt + configs)",
            kind="dir",
            filename="vocab.txt",
            env_var="PCPO_BERT_TOKENIZER_PATH",
            hf_repos=("google-bert/bert-base-uncased", "bert-base-uncased"),
            cache_name="bert-base-uncased",
            obtain=_hf_obtain("google-bert/bert-base-uncased", "vocab.txt tokenizer_config.json tokenizer.json config.json"),
            used_by="reward/metric 'imagereward'",
        ),
        Backend(
            name="clip_vit_l14",
            description="OpenAI CLIP ViT-L/14 (transformers folder), the aesthetic predictor's embedding net",
            kind="dir",
            filename="config.json",
            env_var="PCPO_CLIP_L14_PATH",
            hf_repos=("openai/clip-vit-large-patch14",),
            cache_name="clip-vit-large-patch14",
            obtain=_hf_obtain("openai/clip-vit-large-patch14"),
            used_by="reward/metric 'aesthetic' (and 'clipscore' by default)",
        ),
        Backend(
            name="aesthetic",
            description="LAION improved aesthetic predictor MLP, sac+logos+ava1-l14-linearMSE.pth",
            kind="file",
            filename="sac+logos+ava1-l14-linearMSE.pth",
            env_var="PCPO_AESTHETIC_WEIGHTS",
            extra=("~/.cache/ImageReward/sac+logos+ava1-l14-linearMSE.pth",),
            obtain=(
                "download sac+logos+ava1-l14-linearMSE.pth from github.com/christophschuhmann/"
                "improved-aesthetic-predictor (also in ddpo-pytorch's assets/)"
            ),
            used_by="reward/metric 'aesthetic' (with clip_vit_l14)",
        ),
        Backend(
            name="clipscore",
            description="CLIPScore backbone (transformers CLIP folder; default OpenAI CLIP ViT-L/14)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_CLIPSCORE_PATH",
            hf_repos=("openai/clip-vit-large-patch14",),
            cache_name="clip-vit-large-patch14",
            obtain=_hf_obtain("openai/clip-vit-large-patch14")
            + "; or pass backbone='open_clip:NAME' with pretrained=FILE",
            used_by="reward/metric 'clipscore'",
        ),
        Backend(
            name="trocr",
            description="TrOCR line recogniser (transformers folder, e.g. microsoft/trocr-base-printed)",
            kind="dir",
            filename="config.json",
            env_var="PCPO_TROCR_PATH",
            hf_repos=("microsoft/trocr-base-printed",),
            cache_name="trocr-base-printed",
            obtain=_hf_obtain("microsoft/trocr-base-printed"),
            used_by="reward 'ocr' with recogniser='trocr'",
        ),
        Backend(
            name="paddleocr_det",
            description="PaddleOCR text detector inference folder (paddleocr 2.x lang='en': en_PP-OCRv3_det_infer)",
            kind="dir",
            filename="inference.pdiparams",
            env_var="PCPO_PADDLEOCR_DET_DIR",
            extra=("~/.paddleocr/whl/det/en/en_PP-OCRv3_det_infer",),
            cache_name="paddleocr/det",
            obtain="on a machine with internet: run paddleocr once (it caches to ~/.paddleocr/whl/det/), then copy the folder here",
            used_by="reward 'ocr' (recogniser 'paddleocr', Flow-GRPO's default)",
        ),
        Backend(
            name="paddleocr_rec",
            description="PaddleOCR text recogniser inference folder (paddleocr 2.x lang='en': en_PP-OCRv4_rec_infer)",
            kind="dir",
            filename="inference.pdiparams",
            env_var="PCPO_PADDLEOCR_REC_DIR",
            extra=("~/.paddleocr/whl/rec/en/en_PP-OCRv4_rec_infer",),
            cache_name="paddleocr/rec",
            obtain="on a machine with internet: run paddleocr once (it caches to ~/.paddleocr/whl/rec/), then copy the folder here",
            used_by="reward 'ocr' (recogniser 'paddleocr')",
        ),
        Backend(
            name="paddleocr_cls",
            description="PaddleOCR 2.x angle classifier folder (ch_ppocr_mobile_v2.0_cls_infer; 2.x fetches it even unused)",
            kind="dir",
            filename="inference.pdiparams",
            env_var="PCPO_PADDLEOCR_CLS_DIR",
            extra=("~/.paddleocr/whl/cls/ch_ppocr_mobile_v2.0_cls_infer",),
            cache_name="paddleocr/cls",
            obtain="on a machine with internet: run paddleocr 2.x once (it caches to ~/.paddleocr/whl/cls/), then copy the folder here",
            used_by="reward 'ocr' (recogniser 'paddleocr' with paddleocr 2.x)",
        ),
        Backend(
            name="sd15",
            description="Stable Diffusion 1.5 diffusers pipeline (DDPO setups)",
            kind="dir",
            filename="model_index.json",
            env_var="PCPO_SD15_PATH",
            hf_repos=("stable-diffusion-v1-5/stable-diffusion-v1-5", "runwayml/stable-diffusion-v1-5"),
            cache_name="stable-diffusion-v1-5",
            obtain=_hf_obtain("stable-diffusion-v1-5/stable-diffusion-v1-5"),
            used_by="model adapter 'sd1' (DDPO configs)",
        ),
        Backend(
            name="sd14",
            description="Stable Diffusion 1.4 diffusers pipeline (DanceGRPO-SD setups)",
            kind="dir",
            filename="model_index.json",
            env_var="PCPO_SD14_PATH",
            hf_repos=("CompVis/stable-diffusion-v1-4",),
            cache_name="stable-diffusion-v1-4",
            obtain=_hf_obtain("CompVis/stable-diffusion-v1-4"),
            used_by="model adapter 'sd1' (DanceGRPO-SD configs)",
        ),
        Backend(
            name="sd1",
            description="any Stable Diffusion 1.x diffusers pipeline (1.5 preferred, then 1.4)",
            kind="dir",
            filename="model_index.json",
            env_var="PCPO_SD1_PATH",
            hf_repos=(
                "stable-diffusion-v1-5/stable-diffusion-v1-5",
                "runwayml/stable-diffusion-v1-5",
                "CompVis/stable-diffusion-v1-4",
            ),
            cache_name="stable-diffusion-v1-5",
            obtain=_hf_obtain("stable-diffusion-v1-5/stable-diffusion-v1-5"),
            used_by="model adapter 'sd1'",
        ),
    ]
}


# --------------------------------------------------------------------------------------------------
# Cache roots (read from the environment on every call)
# --------------------------------------------------------------------------------------------------


def hf_hub_cache() -> Path:
    """Hugging Face hub cache: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``XDG_CACHE_HOME``/default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def torch_hub_dir() -> Path:
    """torch hub directory, as ``torch.hub.get_dir()`` computes it (``TORCH_HOME/hub``)."""
    if os.environ.get("TORCH_HOME"):
        return Path(os.environ["TORCH_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "torch" / "hub"


def weights_dir() -> Path:
    """pcpo-eval's own weights folder: ``PCPO_WEIGHTS_DIR`` or ``~/.cache/pcpo_eval/weights``."""
    return Path(os.environ.get("PCPO_WEIGHTS_DIR") or "~/.cache/pcpo_eval/weights").expanduser()


def hf_snapshot_file(repo_id: str, filename: str, cache_dir: Path | None = None) -> Path | None:
    """Path of ``filename`` in the cached snapshot of ``repo_id`` (the one ``refs/main`` names), or None.

    Follows the hub cache layout ``models--ORG--NAME/{refs/main, snapshots/REV/FILE}``; if ``refs/main``
    is absent (a snapshot copied by hand) the most recently modified snapshot holding the file is used.
    No network access.
    """
    root = (cache_dir or hf_hub_cache()) / ("models--" + repo_id.replace("/", "--"))
    snapshots = root / "snapshots"
    ref = root / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip() / filename
        if candidate.exists():
            return candidate
    if not snapshots.is_dir():
        return None
    found = [s / filename for s in snapshots.iterdir() if (s / filename).exists()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


# --------------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------------


def get_backend(name: str) -> Backend:
    """The :class:`Backend` called ``name``; an unknown name lists the valid ones."""
    if name not in BACKENDS:
        raise UserError(f"unknown weights backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def _as_target(backend: Backend, path: Path) -> Path | None:
    """``path`` if it is a valid location for ``backend`` (a file, or a folder with the marker)."""
    path = path.expanduser()
    if backend.kind == "file":
        if path.is_file():
            return path
        if path.is_dir() and (path / backend.filename).is_file():  # a folder holding the file is fine
            return path / backend.filename
        return None
    return path if (path / backend.filename).is_file() else None


def candidates(backend: Backend) -> list[tuple[str, Path]]:
    """Cache candidates (after the explicit path and the env var), as (label, path), in search order.

    For ``dir`` backends the HF entries are the snapshot folder if found, else the repo's cache folder.
    """
    out: list[tuple[str, Path]] = []
    own = weights_dir() / (backend.cache_name or (backend.filename if backend.kind == "file" else backend.name))
    out.append(("PCPO_WEIGHTS_DIR", own))
    hub = hf_hub_cache()
    for repo in backend.hf_repos:
        hit = hf_snapshot_file(repo, backend.filename, hub)
        if hit is not None:
            out.append((f"HF cache {repo}", hit if backend.kind == "file" else hit.parent))
        else:
            out.append((f"HF cache {repo}", hub / ("models--" + repo.replace("/", "--"))))
    for rel in backend.torch_hub:
        out.append(("TORCH_HOME", torch_hub_dir() / rel))
    for raw in backend.extra:
        out.append(("package cache", Path(raw.replace("{tmp}", tempfile.gettempdir())).expanduser()))
    return out


def _what(backend: Backend) -> str:
    return backend.filename if backend.kind == "file" else f"a folder with {backend.filename}"


def locate(name: str, explicit: str | os.PathLike | None = None) -> Path:
    """Path of backend ``name``'s weights: explicit path > env var > cache candidates.

    Returns the weights file (``kind == "file"``) or the model folder (``kind == "dir"``). Raises
    :class:`MissingWeightsError` (one line naming the file and the variable to set) when absent, or
    when the explicit path / env var given is not a valid location (it is never silently skipped).
    """
    backend = get_backend(name)
    if explicit is not None and str(explicit) != "":
        hit = _as_target(backend, Path(explicit))
        if hit is None:
            raise MissingWeightsError(
                f"{name} weights: {explicit} is not {_what(backend)}; pass the path of {_what(backend)}"
            )
        return hit
    env = os.environ.get(backend.env_var)
    if env:
        hit = _as_target(backend, Path(env))
        if hit is None:
            raise MissingWeightsError(
                f"{name} weights: {backend.env_var}={env} is not {_what(backend)}; fix or unset {backend.env_var}"
            )
        return hit
    for _label, path in candidates(backend):
        hit = _as_target(backend, path)
        if hit is not None:
            return hit
    where = f" ({backend.hf_repos[0]})" if backend.kind == "dir" and backend.hf_repos else ""
    raise MissingWeightsError(
        f"{name} weights not found: set {backend.env_var} to the path of {_what(backend)}{where} "
        f"or put it in {weights_dir()}; see `pcpo-eval weights`"
    )


@dataclass(frozen=True)
class BackendStatus:
    """Result of a lookup for the ``weights`` command: found or not, where, and where it looked."""

    name: str
    found: bool
    path: str | None
    error: str | None
    env_var: str
    env_value: str | None
    searched: list[str]
    description: str
    used_by: str
    obtain: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def status(name: str) -> BackendStatus:
    """Look up backend ``name`` without raising; record every place searched."""
    backend = get_backend(name)
    searched = [f"${backend.env_var}"] + [f"{label}: {path}" for label, path in candidates(backend)]
    try:
        path, error = str(locate(name)), None
    except MissingWeightsError as exc:
        path, error = None, str(exc)
    return BackendStatus(
        name=name,
        found=path is not None,
        path=path,
        error=error,
        env_var=backend.env_var,
        env_value=os.environ.get(backend.env_var),
        searched=searched,
        description=backend.description,
        used_by=backend.used_by,
        obtain=backend.obtain,
    )


def format_table(rows: list[BackendStatus]) -> str:
    """Plain-text report: one block per backend (found path, or where it looked and how to get it)."""
    lines = [
        f"weights search order: explicit path > env var > {weights_dir()} > HF cache {hf_hub_cache()} "
        f"> torch hub {torch_hub_dir()} > package caches",
        "",
    ]
    for r in rows:
        mark = "found  " if r.found else "MISSING"
        lines.append(f"[{mark}] {r.name:<22} {r.description}")
        lines.append(f"          env {r.env_var}" + (f"={r.env_value}" if r.env_value else " (unset)"))
        if r.found:
            lines.append(f"          path {r.path}")
        else:
            if r.error and r.env_value:
                lines.append(f"          error: {r.error}")
            for s in r.searched[1:]:
                lines.append(f"          looked in {s}")
            lines.append(f"          obtain: {r.obtain}")
        lines.append(f"          used by {r.used_by}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``pcpo-eval weights`` to the CLI."""

    @app.command("weights")
    def weights_cmd(
        names: list[str] = typer.Argument(None, help="Backends to check (default: all)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """List every weights backend: where it looks, whether it found the weights, how to get them."""
        selected = names or list(BACKENDS)
        rows = [status(n) for n in selected]
        if as_json:
            typer.echo(json.dumps({"backends": [r.to_dict() for r in rows]}, indent=2))
        else:
            typer.echo(format_table(rows))
