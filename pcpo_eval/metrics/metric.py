"""The Metric shell, torchmetrics style: declared states, ``update``, ``sync``, ``compute``, ``settings``.

A metric declares each state with :meth:`Metric.add_state` and how it reduces over the ranks of a
``torch.distributed`` group (:mod:`pcpo_eval.dist`), as torchmetrics' ``dist_reduce_fx``:

========== ========================================================================================
reduce     meaning
========== ========================================================================================
sum        sufficient statistics summed over ranks (:class:`GaussianStats` n / sum / outer): an
           exact merge whose memory does not grow with N (torchmetrics FID's ``"sum"`` states)
merge      ``{prompt_id: value}`` of the prompts dealt to this rank; the union over ranks
           (torchmetrics' ``"cat"``, keyed so the prompt order is the image set's, not the ranks')
replicated already identical on every rank (arrays read back from the shared feature cache, which
           is their reduction: :mod:`pcpo_eval.metrics.extract`); nothing to do
========== ========================================================================================

``update(data)`` adds this rank's share of the image set, ``sync()`` reduces every state (all
ranks call it in the same order: the reductions are collectives), ``compute()`` turns the reduced
states into :class:`MetricValues`, and ``settings()`` is the provenance block metrics.json keeps.
One subclass per kind of the catalogue (:mod:`pcpo_eval.metrics.base`): FD (``frechet.py``), IS
(``inception_score.py``), LPIPS diversity (``lpips_diversity.py``), reward scores
(``reward_score.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from pcpo_eval import dist
from pcpo_eval.features import FeatureExtractor
from pcpo_eval.imageset import ImageSet
from pcpo_eval.metrics.base import MetricInfo
from pcpo_eval.metrics.extract import ExtractionReport, MetricsOptions


def _sum(state: Any) -> Any:
    """All-reduce SUM: objects with ``all_reduce()`` (GaussianStats) reduce themselves."""
    return state.all_reduce()


def _merge(state: dict[Any, Any]) -> dict[Any, Any]:
    """Union of every rank's dict (keys are disjoint: each prompt is dealt to one rank)."""
    return {k: v for part in dist.gather_objects(state) for k, v in part.items()}


def _replicated(state: Any) -> Any:
    return state


#: reduce name -> function applied to the state by :meth:`Metric.sync`
REDUCTIONS: dict[str, Callable[[Any], Any]] = {"sum": _sum, "merge": _merge, "replicated": _replicated}


@dataclass
class EvalData:
    """What every metric's ``update`` reads; built once per run by the workers."""

    image_set: ImageSet
    reference: ImageSet | None
    options: MetricsOptions
    report: ExtractionReport
    #: source name -> extractor (built before any long computation)
    extractors: dict[str, FeatureExtractor]
    #: source name -> output name ("features", "logits") -> (N, ...) arrays of ``image_set``, manifest order
    outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @cached_property
    def rows(self) -> dict[int, np.ndarray]:
        """prompt_id -> row indices of ``image_set`` (prompts sorted by id)."""
        return self.image_set.rows_by_prompt()

    def my_prompts(self) -> list[int]:
        """The prompt ids dealt to this rank (round-robin over the sorted ids)."""
        return sorted(self.rows)[dist.rank() :: dist.world_size()]


@dataclass
class MetricValues:
    """A metric's results: metrics.json values, per-prompt columns, per-image columns."""

    #: column -> value over the whole set (metrics.json ``metrics``)
    overall: dict[str, float]
    #: column -> {prompt_id: value}
    per_prompt: dict[str, dict[int, float]] = field(default_factory=dict)
    #: column -> (N,) values in manifest order
    per_image: dict[str, np.ndarray] = field(default_factory=dict)


class Metric(ABC):
    """Base of the metric kinds: subclasses declare states in ``__init__`` and implement the rest."""

    #: catalogue kind this class computes ("fd", "is", "lpips", "reward")
    kind: ClassVar[str]

    def __init__(self, info: MetricInfo) -> None:
        if info.kind != self.kind:
            raise ValueError(
                f"{type(self).__name__} computes kind {self.kind!r}, not {info.name} ({info.kind})"
            )
        self.info = info
        self._reductions: dict[str, str] = {}

    @property
    def name(self) -> str:
        return self.info.name

    @staticmethod
    def extractor_outputs(info: MetricInfo) -> dict[str, tuple[str, ...]]:
        """Extractors this metric needs (source -> outputs to extract for the set; may be empty)."""
        return {}

    def add_state(self, name: str, default: Any, reduce: str) -> None:
        """Declare state ``name`` with its initial value and its cross-process reduction."""
        if reduce not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduce!r}; choose one of {sorted(REDUCTIONS)}")
        setattr(self, name, default)
        self._reductions[name] = reduce

    def image_consumer(self, data: EvalData) -> Any:
        """Decoded images this metric needs beyond cached extractor outputs, as an
        :class:`~pcpo_eval.metrics.extract.ImageConsumer` fed by the call's one decode pass (LPIPS);
        None (the default) when it needs none. Called before :meth:`update`."""
        return None

    def sync(self) -> None:
        """Reduce every declared state over the ranks (in declaration order, on every rank)."""
        for name, reduce in self._reductions.items():
            setattr(self, name, REDUCTIONS[reduce](getattr(self, name)))

    @abstractmethod
    def update(self, data: EvalData) -> None:
        """Accumulate this rank's share of ``data`` into the states."""

    @abstractmethod
    def compute(self) -> MetricValues:
        """Values from the (synced) states."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """Provenance for metrics.json ``settings``: ``{block key: block}`` (blocks of one kind merge)."""
