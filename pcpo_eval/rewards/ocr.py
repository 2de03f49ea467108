"""Flow-GRPO's OCR reward (paper setup 8): edit distance between the prompt's quoted text and OCR output.

Reference: yifan123/flow_grpo ``flow_grpo/ocr.py`` (``OcrScorer``) and ``rewards.ocr_score``. With
``T`` the target and ``R`` the recognised text, the convention is (step -> function here):

==  ================================================================  ==========================
1   target = the text between the first pair of double quotes:        :func:`extract_target`
    ``prompt.split('"')[1]`` (a lone opening quote takes the rest)
2   recognised = concatenation, without separator, of every detected   :func:`join_detections`
    line whose confidence is ``> 0`` (PaddleOCR ``res[1][0]`` if
    ``res[1][1] > 0``); nothing detected -> ``""``
3   normalise both: delete ASCII spaces (``replace(' ', '')``) and     :func:`normalize_text`
    ``str.lower()``
4   ``d = 0`` if ``T`` is a substring of ``R`` else                    :func:`ocr_distance`
    ``Levenshtein.distance(R, T)``; then ``d = min(d, len(T))``
    ("recognised many unrelated characters": capped penalty)
5   ``reward = 1 - d / len(T)``, in [0, 1]; an OCR exception counts    :func:`ocr_reward_value`
    as ``d = len(T)`` (reward 0)
==  ================================================================  ==========================

Where Flow-GRPO crashes we choose explicitly (``no_target``): a prompt without a double quote
raises ``IndexError`` there and an empty quoted text ``ZeroDivisionError``; here both are "no target"
and by default a :class:`~pcpo_eval.errors.UserError` naming the prompt (``no_target='error'``), or
the whole prompt is the target (``'prompt'``, the variant of GenRL's port), or the reward is 0
(``'zero'``). Curly quotes are not quotes (as in the reference).

Recognisers (:data:`RECOGNISERS`) turn RGB uint8 HWC arrays into raw texts:

- ``paddleocr`` (Flow-GRPO's choice: ``PaddleOCR(use_angle_cls=False, lang='en')``, ``ocr(img,
  cls=False)``, images passed as RGB arrays exactly as Flow-GRPO does); the package is optional and
  its model folders must be local: paddleocr fetches them by default, so we pass them explicitly
  and refuse to run without them.
- ``trocr`` (transformers ``VisionEncoderDecoderModel`` + ``TrOCRProcessor`` from a local folder,
  e.g. microsoft/trocr-base-printed): a line recogniser applied to the whole image, greedy decoding.
  It is not Flow-GRPO's detector + recogniser pipeline; its rewards are not comparable with
  PaddleOCR's, but it runs in the default environment.

A callable ``images -> texts`` can be passed as ``recogniser`` (tests, other engines).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.registry import optional_module
from pcpo_eval.rewards.preference import check_inputs
from pcpo_eval.weights.locate import locate

#: A recogniser maps a batch of RGB uint8 (H, W, 3) arrays to one raw text per image; ``None`` marks
#: an image whose recognition failed (scored as Flow-GRPO's exception branch: reward 0).
Recogniser = Callable[[list[np.ndarray]], list[str | None]]
NoTarget = Literal["error", "prompt", "zero"]
NO_TARGET_CHOICES: tuple[str, ...] = ("error", "prompt", "zero")


# ==================================================================================================
# Text side (pure functions, Flow-GRPO ``OcrScorer.__call__``)
# ==================================================================================================


def extract_target(prompt: str) -> str | None:
    """Text to render: between the first two ``"`` of ``prompt`` (Flow-GRPO: ``prompt.split('"')[1]``).

    ``None`` when the prompt has no double quote (Flow-GRPO raises ``IndexError`` there). With a single
    quote the text after it is returned, as ``split`` does.
    """
    parts = prompt.split('"')
    return parts[1] if len(parts) > 1 else None


def normalize_text(text: str) -> str:
    """Flow-GRPO normalisation of both target and recognised text: drop ASCII spaces, lower-case.

    Only ``' '`` is removed (``str.replace(' ', '')``); tabs / newlines and punctuation are kept.
    """
    return text.replace(" ", "").lower()


def join_detections(detections: Sequence[tuple[str, float]] | None) -> str:
    """Recognised text of one image: detected lines joined without separator, confidence ``> 0`` only.

    Flow-GRPO: ``''.join([res[1][0] if res[1][1] > 0 else '' for res in result[0]]) if result[0] else ''``
    with ``detections = [(text, confidence), ...]`` in PaddleOCR's reading order.
    """
    if not detections:
        return ""
    return "".join(text for text, conf in detections if conf > 0)


def _levenshtein_dp(a: str, b: str) -> int:
    """Unit-cost edit distance (insert / delete / substitute) by Wagner-Fischer with two rows."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        cur = [i]
        for j, cb in enumerate(b, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def levenshtein(a: str, b: str) -> int:
    """Levenshtein distance with unit costs, as ``Levenshtein.distance`` (Flow-GRPO's import).

    Uses the optional ``levenshtein`` package (C++, the one Flow-GRPO imports) when installed, else
    an equivalent pure-Python dynamic programme (tested against a brute-force reference).
    """
    lev = optional_module("Levenshtein")
    return _levenshtein_dp(a, b) if lev is None else int(lev.distance(a, b))


def ocr_distance(recognized: str, target: str) -> int:
    """Flow-GRPO's capped distance of *normalised* texts: 0 if ``target in recognized``, else
    ``min(Levenshtein(recognized, target), len(target))``."""
    if target in recognized:
        return 0
    return min(levenshtein(recognized, target), len(target))


def ocr_reward_value(recognized: str | None, target: str) -> float:
    """``1 - d / len(T)`` on normalised texts (Flow-GRPO); ``recognized=None`` (OCR failed) gives 0.

    ``target`` must be non-empty after normalisation (Flow-GRPO divides by its length).
    """
    t = normalize_text(target)
    if not t:
        raise UserError(f"OCR target {target!r} is empty after removing spaces; quote non-blank text in the prompt")
    d = len(t) if recognized is None else ocr_distance(normalize_text(recognized), t)
    return 1.0 - d / len(t)


def resolve_target(prompt: str, no_target: str = "error") -> str | None:
    """Target of ``prompt`` under the ``no_target`` policy; ``None`` means "score 0" (policy 'zero')."""
    if no_target not in NO_TARGET_CHOICES:
        raise UserError(f"unknown no_target {no_target!r}; choose one of: {', '.join(NO_TARGET_CHOICES)}")
    target = extract_target(prompt)
    if target is not None and normalize_text(target):
        return target
    if no_target == "prompt" and normalize_text(prompt):
        return prompt
    if no_target == "error":
        raise UserError(
            f"OCR prompt {prompt!r} has no text in double quotes; quote the text to render, "
            "or pass reward option no_target='prompt' or 'zero'"
        )
    return None


# ==================================================================================================
# Recognisers
# ==================================================================================================


def _device_str(device: str | torch.device) -> str:
    return str(torch.device(device))


def paddleocr_recogniser(
    det_model_dir: str | None = None,
    rec_model_dir: str | None = None,
    cls_model_dir: str | None = None,
    det_model_name: str | None = None,
    rec_model_name: str | None = None,
    device: str | torch.device = "cpu",
    on_error: str = "zero",
    **_: Any,
) -> tuple[Recogniser, dict[str, Any]]:
    """PaddleOCR detector + recogniser from local model folders (Flow-GRPO's ``OcrScorer``).

    Folders (each holding ``inference.pdiparams``): ``det_model_dir`` / ``PCPO_PADDLEOCR_DET_DIR``,
    ``rec_model_dir`` / ``PCPO_PADDLEOCR_REC_DIR``, and for paddleocr 2.x also ``cls_model_dir`` /
    ``PCPO_PADDLEOCR_CLS_DIR`` (2.x fetches the angle classifier even with ``use_angle_cls=False``).
    paddleocr 2.x is called as Flow-GRPO does (``PaddleOCR(use_angle_cls=False, lang='en', use_gpu,
    show_log=False)``, ``ocr(img, cls=False)``); 3.x as ``predict(img)`` with the document
    preprocessors and text-line orientation off (the 3.x names of ``use_angle_cls=False``).
    ``on_error='zero'`` scores an image whose OCR raises as 0 (Flow-GRPO), ``'raise'`` re-raises.
    """
    if on_error not in ("zero", "raise"):
        raise UserError(f"unknown on_error {on_error!r}; choose one of: zero, raise")
    det = locate("paddleocr_det", det_model_dir)
    rec = locate("paddleocr_rec", rec_model_dir)
    paddleocr = optional_module("paddleocr")
    if paddleocr is None:
        raise MissingWeightsError(
            "recogniser 'paddleocr' needs the paddleocr and paddlepaddle packages: "
            "pip install 'pcpo-eval[ocr]' paddlepaddle, or use recogniser='trocr'"
        )
    version = str(getattr(paddleocr, "__version__", "2"))
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 2
    dev = _device_str(device)
    settings: dict[str, Any] = {"recogniser": "paddleocr", "paddleocr_version": version,
                                "det_model_dir": str(det), "rec_model_dir": str(rec)}
    if major >= 3:
        # paddlex would otherwise contact its model hosts to check sources at import time
        os.environ.setdefault("PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK", "True")
        kwargs: dict[str, Any] = dict(
            text_detection_model_dir=str(det),
            text_recognition_model_dir=str(rec),
            use_doc_orientation_classify=False,
            use_doc_unwarping=False,
            use_textline_orientation=False,
            device="cpu" if dev == "cpu" else dev.replace("cuda", "gpu"),
        )
        if det_model_name:
            kwargs["text_detection_model_name"] = det_model_name
        if rec_model_name:
            kwargs["text_recognition_model_name"] = rec_model_name
    else:
        cls = locate("paddleocr_cls", cls_model_dir)
        settings["cls_model_dir"] = str(cls)
        kwargs = dict(use_angle_cls=False, lang="en", use_gpu=dev.startswith("cuda"), show_log=False,
                      det_model_dir=str(det), rec_model_dir=str(rec), cls_model_dir=str(cls))
    engine = paddleocr.PaddleOCR(**kwargs)

    def one(img: np.ndarray) -> str:
        if major >= 3:
            results = list(engine.predict(img))
            pairs = [(t, float(s)) for r in results for t, s in zip(r["rec_texts"], r["rec_scores"], strict=True)]
            return join_detections(pairs)
        result = engine.ocr(img, cls=False)
        lines = result[0] if result else None
        return join_detections([(res[1][0], float(res[1][1])) for res in lines] if lines else None)

    def recognise(images: list[np.ndarray]) -> list[str | None]:
        out: list[str | None] = []
        for img in images:
            try:
                out.append(one(img))
            except Exception as exc:  # Flow-GRPO: any OCR failure -> maximal distance
                if on_error == "raise":
                    raise
                warnings.warn(f"PaddleOCR failed on an image ({type(exc).__name__}: {exc}); scored 0", stacklevel=2)
                out.append(None)
        return out

    return recognise, settings


def trocr_recogniser(
    path: str | None = None,
    device: str | torch.device = "cpu",
    dtype: str = "float32",
    max_new_tokens: int = 32,
    num_beams: int = 1,
    **_: Any,
) -> tuple[Recogniser, dict[str, Any]]:
    """TrOCR (``VisionEncoderDecoderModel`` + ``TrOCRProcessor``) from a local folder, whole image as one line.

    ``path`` / ``PCPO_TROCR_PATH`` / HF cache of microsoft/trocr-base-printed; loaded with
    ``local_files_only=True``. Pixel values come from the folder's own image processor (ViT: resize
    to 384 bilinear, mean = std = 0.5 for the released checkpoints); decoding is greedy
    (``num_beams=1``) up to ``max_new_tokens``, special tokens skipped.
    """
    from transformers import TrOCRProcessor, VisionEncoderDecoderModel

    if int(max_new_tokens) < 1 or int(num_beams) < 1:
        raise UserError(f"max_new_tokens and num_beams must be >= 1, got {max_new_tokens}, {num_beams}")
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise UserError(f"unknown dtype {dtype!r}; choose one of: float32, float16, bfloat16")
    folder = locate("trocr", path)
    from pcpo_eval.weights.folders import transformers_missing

    if missing := transformers_missing(folder):  # name config.json / the weights file, not a loader traceback
        raise MissingWeightsError(f"trocr: {folder} is not a complete TrOCR folder (missing {', '.join(missing)}); "
                                  "copy the whole microsoft/trocr-base-printed snapshot there")
    dev = torch.device(device)
    try:
        processor = TrOCRProcessor.from_pretrained(str(folder), local_files_only=True)
        model = VisionEncoderDecoderModel.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise MissingWeightsError(
            f"trocr: {folder} is not a complete TrOCR folder ({first}); copy the whole "
            "microsoft/trocr-base-printed snapshot (model, processor and tokenizer files) there"
        ) from exc
    model = model.to(device=dev, dtype=torch_dtype).eval()

    def recognise(images: list[np.ndarray]) -> list[str | None]:
        px = processor(images=images, return_tensors="pt").pixel_values.to(dev, torch_dtype)
        with torch.no_grad():
            ids = model.generate(px, max_new_tokens=int(max_new_tokens), num_beams=int(num_beams))
        return list(processor.batch_decode(ids, skip_special_tokens=True))

    settings = {"recogniser": "trocr", "path": str(folder), "max_new_tokens": int(max_new_tokens),
                "num_beams": int(num_beams), "dtype": dtype}
    return recognise, settings


#: recogniser name -> factory ``(**options) -> (recognise, settings)``
RECOGNISERS: dict[str, Callable[..., tuple[Recogniser, dict[str, Any]]]] = {
    "paddleocr": paddleocr_recogniser,
    "trocr": trocr_recogniser,
}


def make_recogniser(name: str, **options: Any) -> tuple[Recogniser, dict[str, Any]]:
    """Build recogniser ``name`` from :data:`RECOGNISERS`; an unknown name lists the valid ones."""
    if name not in RECOGNISERS:
        raise UserError(f"unknown OCR recogniser {name!r}; choose one of: {', '.join(RECOGNISERS)}")
    return RECOGNISERS[name](**options)


# ==================================================================================================
# The reward
# ==================================================================================================


@dataclass(frozen=True)
class OcrDetail:
    """One image's OCR reward, with the texts it came from (for tables and debugging)."""

    prompt: str
    target: str | None
    recognized: str | None
    distance: int | None
    reward: float


@dataclass
class OcrReward:
    """Flow-GRPO's OCR reward as ``fn(images, prompts) -> float32 (B,)`` in [0, 1].

    Targets of all prompts are resolved first (a prompt without quoted text fails before any OCR
    runs), then the images go to ``recognise`` in chunks of ``batch_size`` as RGB uint8 HWC arrays.
    """

    recognise: Recogniser
    batch_size: int = 16
    no_target: str = "error"
    settings: dict[str, Any] = field(default_factory=dict)

    def details(self, images: torch.Tensor, prompts: Sequence[str]) -> list[OcrDetail]:
        """Per image: target, recognised text, capped distance and reward."""
        check_inputs(images, prompts)
        prompts = [str(p) for p in prompts]
        targets = [resolve_target(p, self.no_target) for p in prompts]
        arrays = images.detach().to("cpu").permute(0, 2, 3, 1).contiguous().numpy()
        texts: list[str | None] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = [arrays[i] for i in range(start, min(start + self.batch_size, len(prompts)))]
            got = list(self.recognise(chunk))
            if len(got) != len(chunk):
                raise RuntimeError(f"OCR recogniser returned {len(got)} texts for {len(chunk)} images")
            texts.extend(got)
        out: list[OcrDetail] = []
        for prompt, target, text in zip(prompts, targets, texts, strict=True):
            if target is None:
                out.append(OcrDetail(prompt, None, text, None, 0.0))
                continue
            t = normalize_text(target)
            d = len(t) if text is None else ocr_distance(normalize_text(text), t)
            out.append(OcrDetail(prompt, target, text, d, 1.0 - d / len(t)))
        return out

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return torch.tensor([d.reward for d in self.details(images, prompts)], dtype=torch.float32)


def ocr(
    recogniser: str | Recogniser = "paddleocr",
    batch_size: int = 16,
    no_target: str = "error",
    device: str = "cpu",
    **options: Any,
) -> OcrReward:
    """Factory of reward ``"ocr"`` (Flow-GRPO's OCR reward, paper setup 8).

    ``recogniser``: ``"paddleocr"`` (default, Flow-GRPO's engine; options ``det_model_dir``,
    ``rec_model_dir``, ``cls_model_dir``, ``det_model_name``, ``rec_model_name``, ``on_error``),
    ``"trocr"`` (options ``path``, ``max_new_tokens``, ``num_beams``, ``dtype``), or a callable
    ``list[np.ndarray (H, W, 3) uint8 RGB] -> list[str | None]``. Both take ``device``.
    ``no_target``: ``'error'`` | ``'prompt'`` | ``'zero'`` for prompts without quoted text.
    """
    if int(batch_size) < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    if no_target not in NO_TARGET_CHOICES:
        raise UserError(f"unknown no_target {no_target!r}; choose one of: {', '.join(NO_TARGET_CHOICES)}")
    if callable(recogniser):
        fn, settings = recogniser, {"recogniser": getattr(recogniser, "__name__", type(recogniser).__name__)}
    else:
        fn, settings = make_recogniser(str(recogniser), device=device, **options)
    settings = {**settings, "reward": "ocr", "no_target": no_target, "batch_size": int(batch_size),
                "formula": "1 - min(levenshtein(R, T), len(T)) / len(T); 1 if T in R (spaces removed, lower-cased)"}
    return OcrReward(recognise=fn, batch_size=int(batch_size), no_target=no_target, settings=settings)

