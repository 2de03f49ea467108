"""Rewards and preference scores behind one registry, shared by the trainer and the metrics.

A reward is a callable ``fn(images, prompts) -> torch.Tensor`` of shape (B,) (float32, CPU), where
``images`` is a uint8 tensor (B, 3, H, W) on the CPU and ``prompts`` a list of B strings, in the style
of ddpo-pytorch's ``rewards.py`` factories. Factories take keyword options (``device``, weight paths)
and load real models only from local files; a missing file raises
:class:`pcpo_eval.errors.MissingWeightsError` naming the file or variable to set.

What a config's ``reward:`` may name (:func:`make_reward`, docs/training.md#rewards):

* a built-in name of :data:`REGISTRY` (``aesthetic``, ``toy_aesthetic``, ...);
* a custom factory as ``"module:function"`` (importable from the working directory or the
  environment), or the name of an entry point in the group :data:`ENTRY_POINT_GROUP`
  (``[project.entry-points."pcpo_eval.rewards"]`` of a plug-in package). A custom factory follows
  the built-ins' conventions: called with the config's ``reward_options`` as keywords (``device``
  among them when the config sets it), it returns ``fn(images, prompts)``; its scores are checked
  (:func:`checked_reward`: one finite-or-NaN number per image, else one error line naming it);
* a weighted sum ``{aesthetic: 0.7, hps: 0.3}`` (:class:`WeightedReward`): each component is built
  as above, with ``reward_options`` keyed by component name; the trainer logs each component's mean
  as its own column ``reward_<name>_mean`` (:func:`component_column`).

This module imports no torch at import time, so configs can check a ``reward:`` value cheaply.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from pcpo_eval.errors import UserError

if TYPE_CHECKING:
    import numpy as np
    import torch

#: Entry-point group of reward plug-ins: ``name = "package.module:factory"``.
ENTRY_POINT_GROUP = "pcpo_eval.rewards"
#: What a config's ``reward`` holds: one name, or component name -> weight.
RewardSpec = str | dict[str, float]


class RewardFn(Protocol):
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


#: name -> "module:factory"; factories are imported lazily so heavy deps load only when used.
REGISTRY: dict[str, str] = {
    # DDPO's JPEG rewards (kvablack/ddpo-pytorch rewards.py): size in kB at quality 95.
    "jpeg_compressibility": "pcpo_eval.rewards.jpeg:jpeg_compressibility",
    "jpeg_incompressibility": "pcpo_eval.rewards.jpeg:jpeg_incompressibility",
    # Toy-world rewards (pcpo_eval/toy): prompt alignment via the toy classifier, toy aesthetic.
    "toy_alignment": "pcpo_eval.rewards.toy:toy_alignment",
    "toy_aesthetic": "pcpo_eval.rewards.toy:toy_aesthetic",
    # Real preference models, loaded from local weights only.
    "aesthetic": "pcpo_eval.rewards.preference:laion_aesthetic",
    "hps": "pcpo_eval.rewards.preference:hpsv21",
    "hps_v20": "pcpo_eval.rewards.preference:hpsv20",
    "pickscore": "pcpo_eval.rewards.preference:pickscore",
    "imagereward": "pcpo_eval.rewards.preference:imagereward",
    "clipscore": "pcpo_eval.rewards.preference:clipscore",
    # DDPO's prompt-alignment reward (LLaVA answer + BERTScore recall) via a local LLaVA server.
    "llava_bertscore": "pcpo_eval.rewards.llava:llava_bertscore",
    # The same in process: a local VLM's caption + BERTScore (bert-score package), ddpo-pytorch conventions.
    "vlm_bertscore": "pcpo_eval.rewards.bertscore:vlm_bertscore",
    # Flow-GRPO's OCR reward (setup 8): 1 - capped edit distance of the quoted prompt text to OCR output.
    "ocr": "pcpo_eval.rewards.ocr:ocr",
}


def parse_reward(value: Any) -> RewardSpec:
    """A config's ``reward`` value checked: a non-empty name, or a non-empty mapping of names to
    finite numeric weights (a YAML mapping given as text, ``reward={aesthetic: 0.7, hps: 0.3}`` on
    the command line, is read as one). Raises :class:`UserError` naming the problem."""
    if isinstance(value, str) and value.strip().startswith("{"):
        import yaml

        from pcpo_eval.io import yaml_safe_load

        try:
            value = yaml_safe_load(value)  # a reward named twice is refused, not summed or overwritten
        except yaml.YAMLError:
            raise UserError(f"reward {value!r} is not a YAML mapping (each reward named once); write e.g. "
                            "{aesthetic: 0.7, hps: 0.3}") from None
    if isinstance(value, str):
        if not value.strip():
            raise UserError("reward is empty; name a reward (e.g. toy_aesthetic) or a weighted sum {a: 0.7, b: 0.3}")
        return value.strip()
    if not isinstance(value, Mapping) or not value:
        raise UserError(f"reward must be a name or a mapping name -> weight, e.g. {{aesthetic: 0.7, hps: 0.3}}; got {value!r}")
    out: dict[str, float] = {}
    for name, w in value.items():
        ok = isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(float(w))
        if not isinstance(name, str) or not name.strip() or not ok:
            raise UserError(f"reward weight {name!r}: {w!r} is not a finite number; write name: weight, e.g. aesthetic: 0.7")
        out[name.strip()] = float(w)
    return out


def reward_label(spec: RewardSpec) -> str:
    """``aesthetic`` or ``0.7*aesthetic + 0.3*hps`` (messages, model cards)."""
    if isinstance(spec, str):
        return spec
    return " + ".join(f"{w:g}*{n}" for n, w in spec.items())


def reward_parts(spec: RewardSpec, options: Mapping[str, Any] | None = None) -> list[tuple[str, float, dict[str, Any]]]:
    """(name, weight, factory options) of each component; a single reward is one part of weight 1.

    A weighted reward's ``options`` map component names to their options; another key is an error.
    """
    options = dict(options or {})
    if isinstance(spec, str):
        return [(spec, 1.0, options)]
    extra = sorted(set(options) - set(spec))
    if extra:
        raise UserError(f"reward_options key(s) {', '.join(map(str, extra))} name no component of the weighted reward "
                        f"{reward_label(spec)}; key reward_options by component, e.g. {{{next(iter(spec))}: {{device: cpu}}}}")
    bad = [n for n, o in options.items() if not isinstance(o, Mapping)]
    if bad:
        raise UserError(f"reward_options.{bad[0]} must be a mapping of that reward's options")
    return [(n, w, dict(options.get(n) or {})) for n, w in spec.items()]


#: Preference rewards (also metrics of the same name): name -> (paper label, weights backends).
#: HPSv2 v2.0: the paper's Table dpo-comparison uses it "to align with prior works" (l.1276).
PREFERENCE_BACKENDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "hps": ("HPSv2.1", ("hps",)),
    "hps_v20": ("HPSv2", ("hps_v20",)),
    "pickscore": ("PickScore", ("pickscore", "pickscore_processor")),
    "imagereward": ("ImgRwd", ("imagereward", "imagereward_med_config", "bert_base_uncased")),
    "clipscore": ("CLIPScore", ("clipscore",)),
    "aesthetic": ("Aesthetic", ("aesthetic", "clip_vit_l14")),
}


def required_backends(spec: RewardSpec, options: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """Weights backends (:mod:`pcpo_eval.weights`) reward ``spec`` loads with ``options``.

    Preference models: their backends above; ``ocr``: the recogniser's model folders (options given
    as paths are the user's to check); ``vlm_bertscore``: its captioner and BERTScore model; toy and
    JPEG rewards, ``llava_bertscore`` (a server) and custom ``module:function`` rewards: none. A
    weighted sum needs every component's.
    """
    out: list[str] = []
    for name, _, opts in reward_parts(spec, options):
        out += [b for b in _backends_of(name, opts) if b not in out]
    return tuple(out)


def _backends_of(name: str, options: Mapping[str, Any]) -> tuple[str, ...]:
    if name in PREFERENCE_BACKENDS:
        return PREFERENCE_BACKENDS[name][1]
    if name == "vlm_bertscore":
        from pcpo_eval.rewards.bertscore import CAPTIONERS, SCORERS

        cap, scorer = options.get("captioner", "qwen25_vl"), options.get("scorer", "deberta")
        return ((CAPTIONERS[cap],) if cap in CAPTIONERS and not options.get("captioner_path") else ()) + (
            (SCORERS[scorer][0],) if scorer in SCORERS and not options.get("scorer_path") else ())
    if name == "ocr":
        rec = options.get("recogniser", "paddleocr")
        if rec == "paddleocr":
            keys = {"paddleocr_det": "det_model_dir", "paddleocr_rec": "rec_model_dir", "paddleocr_cls": "cls_model_dir"}
            return tuple(b for b, opt in keys.items() if not options.get(opt))
        return ("trocr",) if rec == "trocr" and not options.get("path") else ()
    return ()


def component_column(name: str) -> str:
    """The training-log column of a weighted reward's component: ``reward_<name>_mean``."""
    return f"reward_{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}_mean"


def _entry_point(name: str) -> Any:
    from importlib.metadata import entry_points

    return next((ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name), None)


def _unknown_reward(name: str) -> UserError:
    """The one line for a reward name that is no registry name, plug-in or ``module:function``."""
    return UserError(f"unknown reward {name!r}; choose one of: {', '.join(sorted(REGISTRY))}, a plug-in of the "
                     f"{ENTRY_POINT_GROUP!r} entry points, or a custom factory as 'module:function'")


def check_reward_names(spec: RewardSpec) -> None:
    """Every reward name of ``spec`` is a registry name, a plug-in or ``module:function`` (nothing imported
    for a registry name): one :class:`UserError` line for the first unknown one (as training gives)."""
    for name in ([spec] if isinstance(spec, str) else list(spec)):
        if name not in REGISTRY and ":" not in name and _entry_point(name) is None:
            raise _unknown_reward(name)


def resolve_factory(name: str) -> tuple[Callable[..., RewardFn], bool]:
    """(factory, built-in?) for a registry name, an entry point of :data:`ENTRY_POINT_GROUP` or
    ``module:function``; anything else is one :class:`UserError` line listing the choices."""
    if name in REGISTRY:
        module_name, factory_name = REGISTRY[name].split(":")
        return getattr(importlib.import_module(module_name), factory_name), True
    ep = _entry_point(name)
    if ep is not None:
        try:
            return ep.load(), False
        except (ImportError, AttributeError) as exc:
            raise UserError(f"reward plug-in {name!r} ({ep.value}) does not load: {exc}; reinstall the package "
                            "that declares it") from None
    if ":" in name:
        module_name, _, factory_name = name.partition(":")
        try:
            found = importlib.util.find_spec(module_name) is not None
        except (ModuleNotFoundError, ValueError):  # a missing parent package, an empty name
            found = False
        if not found:
            raise UserError(f"reward {name!r}: cannot import module {module_name!r}; put it on PYTHONPATH "
                            "or install it")
        factory = getattr(importlib.import_module(module_name), factory_name, None)  # its own errors propagate
        if factory is None:
            raise UserError(f"reward {name!r}: module {module_name!r} has no {factory_name!r}")
        if not callable(factory):
            raise UserError(f"reward {name!r} is not callable; name a factory function(**options) -> fn(images, prompts)")
        return factory, False
    raise _unknown_reward(name)


def checked_reward(name: str, fn: RewardFn) -> RewardFn:
    """``fn`` whose output is checked and normalised like the built-ins': a tensor / array / list of one
    number per image, returned as float32 (B,) on the CPU; a wrong shape or type is one
    :class:`UserError` naming the reward (NaN/inf pass through: the trainer rejects that epoch)."""
    import numpy as np
    import torch

    def wrapped(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        out = fn(images, prompts)
        try:
            t = out.detach().float().cpu() if isinstance(out, torch.Tensor) else torch.as_tensor(np.asarray(out, dtype=np.float32))
        except (TypeError, ValueError):
            raise UserError(f"reward {name!r} returned {type(out).__name__}; return one number per image "
                            "(a tensor of shape (B,))") from None
        if t.ndim == 2 and t.shape[1] == 1:
            t = t[:, 0]
        if t.shape != (images.shape[0],):
            raise UserError(f"reward {name!r} returned shape {tuple(t.shape)} for {images.shape[0]} images; "
                            "return one number per image (shape (B,))")
        return t

    return wrapped


class WeightedReward:
    """``sum_k w_k r_k(images, prompts)``; ``last_components`` keeps each component's scores of the
    last call (name -> float64 array), which the trainer logs as ``reward_<name>_mean``."""

    def __init__(self, parts: list[tuple[str, float, RewardFn]]) -> None:
        self.parts = parts
        self.last_components: dict[str, np.ndarray] = {}

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        total = None
        comps = {}
        for name, w, fn in self.parts:
            r = fn(images, prompts)
            comps[name] = r.double().numpy()
            total = w * r if total is None else total + w * r
        self.last_components = comps
        assert total is not None
        return total.float()


def options_on_device(name: RewardSpec, options: Mapping[str, Any] | None, device: str) -> dict[str, Any]:
    """``options`` with ``device`` set for every component whose factory declares a ``device`` parameter
    and whose options do not name one (flat for a single reward, per component for a weighted sum).

    The trainer builds its reward with this on its own device, as ddpo-pytorch, DanceGRPO and Flow-GRPO
    score on the accelerator's device: a preference model or captioner left at its factory's ``cpu``
    default would score every epoch's images on the host of a GPU run. An explicit ``device`` (say
    ``cpu``, to keep GPU memory for the policy) is kept; factories without the parameter get nothing."""
    import inspect

    spec = parse_reward(name)
    parts = reward_parts(spec, options)
    out: dict[str, Any] = {}
    for part, _, opts in parts:
        try:
            takes = "device" in inspect.signature(resolve_factory(part)[0]).parameters
        except UserError:  # an unknown name: left to make_reward, whose error it is (and which a caller may wrap)
            takes = False
        if takes and "device" not in opts:
            opts = {**opts, "device": str(device)}
        out[part] = opts
    return out[spec] if isinstance(spec, str) else out


def check_options(name: str, factory: Callable[..., RewardFn], options: Mapping[str, Any]) -> None:
    """Refuse options the factory of ``name`` does not take (one line naming the ones it does), before any
    model loads; a factory with ``**kwargs`` takes any."""
    import inspect

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: its own error, if any
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [k for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UserError(f"reward {name!r} has no option {', '.join(map(repr, unknown))}; "
                        f"its options: {', '.join(known) or 'none'}")


def make_reward(name: RewardSpec, **options: Any) -> RewardFn:
    """Build the reward ``name``: a :data:`REGISTRY` name, a plug-in, ``module:function`` or a weighted
    sum (see the module doc); options go to the factory (per component for a weighted sum) and are
    checked against its parameters first (:func:`check_options`)."""
    spec = parse_reward(name)
    if isinstance(spec, str):
        factory, builtin = resolve_factory(spec)
        check_options(spec, factory, options)
        fn = factory(**options)
        return fn if builtin else checked_reward(spec, fn)
    built = []
    for part, w, opts in reward_parts(spec, options):
        factory, _ = resolve_factory(part)
        check_options(part, factory, opts)
        built.append((part, w, checked_reward(part, factory(**opts))))
    return WeightedReward(built)


def reward_components(fn: Any) -> dict[str, np.ndarray]:
    """A weighted reward's per-component scores of its last call (empty for a single reward)."""
    return dict(getattr(fn, "last_components", None) or {})
