"""Prompt alignment by caption + BERTScore, in process (the paper's setups 3-4, "BERT").

ddpo-pytorch's ``llava_bertscore`` asks a vision-language model "Answer concisely: what is going on
in this image?" and scores its answer against the reference "The image contains {prompt}" with
BERTScore; the reward is the **recall** (kvablack/ddpo-pytorch ``rewards.py``). Its server
(kvablack/LLaVA-server ``llava_server/bertscore.py``) scores with
``bert_score.BERTScorer("microsoft/deberta-xlarge-mnli")``: bert-score's layer for that model (40),
no idf weighting, no baseline rescaling; the captioner decodes greedily, at most 64 new tokens.
The paper replaced LLaVA by Qwen2.5-VL-3B-Instruct (pcpo-paper.tex l.1179-1180).

Reward ``vlm_bertscore`` does the same in this process:

1. caption: :class:`VLMCaptioner` (transformers ``AutoModelForImageTextToText`` + its processor's
   chat template) from a local folder, ``captioner="qwen25_vl"`` (default) or ``"llava"``
   (llava-hf/llava-1.5-7b-hf), or any callable ``(images uint8 (B, 3, H, W), query) -> captions``;
2. score: :class:`BertScore` over the ``bert-score`` package (extra ``bertscore``) with a local
   model folder, ``scorer="deberta"`` (the server's) or ``"roberta"`` (bert-score's own default
   for English, layer 17); ``component`` picks precision / recall / f1 (default recall).

The captioner sees each image as the reference's captioner did: ddpo-pytorch's client sends it as a JPEG
of quality 80 and LLaVA-server decodes it with PIL (``jpeg_quality``, default 80; ``null`` or 0 captions
the raw image).

The captioner's weights are held in ``captioner_dtype`` (default ``auto``: the dtype its checkpoint declares,
``config.json``'s ``torch_dtype`` (Qwen2.5-VL-3B-Instruct: bfloat16; llava-hf: float16, the fp16 LLaVA-server
runs) on CUDA, where a 3B captioner in float32 would take 15 GB of the policy's card, and float32 on a CPU,
where half precision is slow); BERTScore runs in float32, as ``bert_score.BERTScorer`` does. The resolved
name is part of the reward's settings.

Every model loads from local files only (weights backends ``qwen25_vl_3b``, ``llava``,
``bertscore_deberta``, ``bertscore_roberta``; ``pcpo-eval weights``); the server client
``llava_bertscore`` (:mod:`pcpo_eval.rewards.llava`) stays for a captioner you serve elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.precision import dtype_name_precision, precision_dtype
from pcpo_eval.registry import optional_module

#: ddpo-pytorch's query and reference (rewards.py ``llava_bertscore``)
QUERY = "Answer concisely: what is going on in this image?"
REFERENCE = "The image contains {prompt}"
#: LLaVA-server's generation budget (llava_server/llava.py MAX_TOKENS)
MAX_NEW_TOKENS = 64
#: ddpo-pytorch's client sends each image as a JPEG of this quality, which the server decodes with PIL
CLIENT_JPEG_QUALITY = 80
COMPONENTS = ("precision", "recall", "f1")
#: scorer name -> (weights backend, bert-score's layer for the model: bert_score.utils.model2layers)
SCORERS = {"deberta": ("bertscore_deberta", 40), "roberta": ("bertscore_roberta", 17)}
#: captioner name -> weights backend
CAPTIONERS = {"qwen25_vl": "qwen25_vl_3b", "llava": "llava"}

Captioner = Callable[[torch.Tensor, str], list[str]]
#: ``captioner_dtype`` values (``auto`` resolves by device and checkpoint: :func:`captioner_precision`)
CAPTIONER_DTYPES = ("auto", "fp32", "bf16", "fp16")


def captioner_precision(name: str, device: str | torch.device, declared: str | None = None) -> str:
    """The captioner's weight precision: ``fp32``, ``bf16`` or ``fp16``.

    ``auto``: on CUDA the precision the checkpoint declares (``declared``, from its ``config.json``'s
    ``torch_dtype``), bf16 when it declares none or float32; elsewhere fp32.

    Raises:
        UserError: a name outside :data:`CAPTIONER_DTYPES`.
    """
    key = str(name).strip().lower()
    key = dtype_name_precision(key) or key  # the other rewards' ``dtype`` names (float32, bfloat16, float16)
    if key not in CAPTIONER_DTYPES:
        raise UserError(f"unknown captioner_dtype {name!r}; choose {', '.join(CAPTIONER_DTYPES)} "
                        "(or float32, bfloat16, float16)")
    if key != "auto":
        return key
    if torch.device(device).type != "cuda":
        return "fp32"
    return declared if declared in ("bf16", "fp16") else "bf16"


def declared_precision(path: str) -> str | None:
    """The precision a transformers checkpoint folder declares (``config.json``: ``torch_dtype`` or
    ``dtype``, top level or its ``text_config``), None when it declares none or the file is unreadable."""
    import json
    from pathlib import Path

    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for where in (cfg, cfg.get("text_config") or {}):
        for key in ("torch_dtype", "dtype"):
            name = dtype_name_precision(str(where.get(key)))
            if name:
                return name
    return None


def references(prompts: Sequence[str]) -> list[str]:
    """The reference sentence per prompt (ddpo-pytorch: ``f"The image contains {prompt}"``)."""
    return [REFERENCE.format(prompt=p) for p in prompts]


class BertScore:
    """BERTScore precision / recall / F1 of candidates against references (Zhang et al. 2020, ICLR:
    greedy cosine matching of contextual token embeddings from one layer), via ``bert-score``."""

    def __init__(self, model_dir: str, num_layers: int, device: str = "cpu", batch_size: int = 64) -> None:
        bert_score = optional_module("bert_score")
        if bert_score is None:
            raise UserError("reward vlm_bertscore needs the bert-score package: pip install 'pcpo-eval[bertscore]'")
        self.scorer = bert_score.BERTScorer(model_type=str(model_dir), num_layers=int(num_layers), idf=False,
                                            rescale_with_baseline=False, batch_size=batch_size, device=device)

    def __call__(self, candidates: Sequence[str], refs: Sequence[str]) -> dict[str, np.ndarray]:
        """P, R, F1 per pair; an empty candidate (a captioner that answered nothing) scores 0 on all three,
        bert-score's own rule ("Empty candidate sentence detected; setting raw BERTscores to 0"), which its
        tokenizer call for an empty sentence no longer reaches under transformers 5."""
        out = {k: np.zeros(len(candidates), np.float64) for k in COMPONENTS}
        keep = [i for i, c in enumerate(candidates) if str(c).strip()]
        if keep:
            p, r, f = self.scorer.score([candidates[i] for i in keep], [refs[i] for i in keep])
            for k, v in zip(COMPONENTS, (p, r, f), strict=True):
                out[k][keep] = v.numpy().astype(np.float64)
        return out


class VLMCaptioner:
    """A local vision-language model answering one query per image, greedy, ``max_new_tokens`` tokens."""

    def __init__(self, model: Any, processor: Any, max_new_tokens: int = MAX_NEW_TOKENS) -> None:
        self.model, self.processor, self.max_new_tokens = model.eval(), processor, int(max_new_tokens)

    @classmethod
    def from_pretrained(cls, path: str, device: str = "cpu", dtype: torch.dtype = torch.float32,
                        max_new_tokens: int = MAX_NEW_TOKENS) -> VLMCaptioner:
        """The model and processor of a local folder, weights in ``dtype`` on ``device``."""
        from transformers import AutoModelForImageTextToText, AutoProcessor

        try:
            processor = AutoProcessor.from_pretrained(path, local_files_only=True)
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise MissingWeightsError(f"captioner weights {path!r} not loadable ({type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0][:160]}); see `pcpo-eval weights`") from None
        if getattr(processor, "tokenizer", None) is not None:
            processor.tokenizer.padding_side = "left"  # batched generation continues every row at its end
        return cls(model.to(device), processor, max_new_tokens)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, query: str) -> list[str]:
        from PIL import Image

        pils = [Image.fromarray(im) for im in images.permute(0, 2, 3, 1).cpu().numpy().astype(np.uint8)]
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": query}]}]
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = self.processor(images=pils, text=[text] * len(pils), return_tensors="pt", padding=True)
        inputs = inputs.to(device=self.model.device, dtype=self.model.dtype)  # floating inputs only
        out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
        new = out[:, inputs["input_ids"].shape[1]:]
        return [t.strip() for t in self.processor.batch_decode(new, skip_special_tokens=True)]


def _locate(backend: str, explicit: str | None) -> str:
    from pcpo_eval.weights.locate import locate

    return str(locate(backend, explicit))


class VLMBertScoreReward:
    """Reward ``vlm_bertscore``: caption each image, BERTScore ``component`` against the reference."""

    def __init__(self, captioner: Captioner, scorer: Callable[[Sequence[str], Sequence[str]], dict[str, np.ndarray]],
                 component: str = "recall", batch_size: int = 8, settings: dict[str, Any] | None = None,
                 jpeg_quality: int | None = CLIENT_JPEG_QUALITY) -> None:
        self.captioner, self.scorer, self.component = captioner, scorer, component
        self.batch_size, self.settings = int(batch_size), settings or {}
        self.jpeg_quality = jpeg_quality or None
        self.last_captions: list[str] = []

    def caption(self, images: torch.Tensor, query: str) -> list[str]:
        """The captioner's answers to ``query`` for uint8 (B, 3, H, W) images, ``batch_size`` per call."""
        captions: list[str] = []
        for i in range(0, len(images), self.batch_size):
            captions += self.captioner(images[i:i + self.batch_size], query)
        return captions

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        from pcpo_eval.rewards.jpeg import jpeg_round_trip

        if len(images) != len(prompts):
            raise UserError(f"vlm_bertscore: {len(images)} images but {len(prompts)} prompts")
        if self.jpeg_quality:  # what the reference's captioner saw: the client's JPEG, decoded
            images = jpeg_round_trip(images, self.jpeg_quality)
        captions = self.caption(images, QUERY)
        self.last_captions = captions
        scores = self.scorer(captions, references(prompts))[self.component]
        return torch.as_tensor(scores, dtype=torch.float32)


def vlm_bertscore(captioner: str | Captioner = "qwen25_vl", captioner_path: str | None = None,
                  scorer: str = "deberta", scorer_path: str | None = None, num_layers: int | None = None,
                  component: str = "recall", batch_size: int = 8, device: str = "cpu",
                  max_new_tokens: int = MAX_NEW_TOKENS, captioner_dtype: str = "auto",
                  jpeg_quality: int | None = CLIENT_JPEG_QUALITY) -> VLMBertScoreReward:
    """Factory of reward ``vlm_bertscore`` (see the module docstring for the conventions)."""
    captioner_precision(captioner_dtype, device)  # checked before any model loads
    quality = check_jpeg_quality(jpeg_quality)
    if component not in COMPONENTS:
        raise UserError(f"unknown BERTScore component {component!r}; choose one of: {', '.join(COMPONENTS)}")
    if scorer not in SCORERS:
        raise UserError(f"unknown BERTScore scorer {scorer!r}; choose one of: {', '.join(SCORERS)}")
    if int(batch_size) < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    backend, layer = SCORERS[scorer]
    cap_dtype = None  # a callable captioner holds its own weights
    if callable(captioner):
        cap, cap_name = captioner, getattr(captioner, "__name__", type(captioner).__name__)
    elif captioner in CAPTIONERS:
        path = _locate(CAPTIONERS[captioner], captioner_path)
        cap_dtype = captioner_precision(captioner_dtype, device, declared_precision(path))
        cap = VLMCaptioner.from_pretrained(path, device=device, dtype=precision_dtype(cap_dtype),
                                           max_new_tokens=max_new_tokens)
        cap_name = captioner
    else:
        raise UserError(f"unknown captioner {captioner!r}; choose one of: {', '.join(CAPTIONERS)}, or pass a callable")
    score = BertScore(_locate(backend, scorer_path), num_layers or layer, device=device)
    settings = {"reward": "vlm_bertscore", "captioner": cap_name, "query": QUERY, "reference": REFERENCE,
                "scorer": scorer, "num_layers": num_layers or layer, "component": component, "idf": False,
                "rescale_with_baseline": False, "max_new_tokens": max_new_tokens,
                "captioner_dtype": cap_dtype, "jpeg_quality": quality}
    return VLMBertScoreReward(cap, score, component, batch_size, settings, quality)


def check_jpeg_quality(value: Any) -> int | None:
    """``jpeg_quality`` checked: an integer 1..95 (PIL's useful range), or None / 0 for the raw image."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or not 1 <= value <= 95:
        raise UserError(f"jpeg_quality must be an integer 1..95 (ddpo-pytorch's client: {CLIENT_JPEG_QUALITY}) "
                        f"or null for the raw image; got {value!r}")
    return int(value)
