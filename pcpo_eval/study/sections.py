"""Study-spec sections that name the paper's exact checkpoints, prompts and seeds.

* **Explicit epochs** (``select_epoch: {DanceGRPO: 180, PCPO: 120}``, ``preference[].epochs``,
  ``grid[].epochs``): one checkpoint epoch per arm (or one epoch for every arm). The paper compares
  fixed checkpoints in several places (Table preference-metrics-combined: SD1.4 both at E200, FLUX
  PCPO E120 vs DanceGRPO E180; Table dpo-comparison: PCPO E200; Fig. image_grid (b): E200). Every
  trained run must save that epoch (``epoch % checkpoint_every == 0`` or the last epoch), checked
  when the spec is loaded.
* **Preference sets** (``preference:`` one mapping, or a list of them, each with a ``name``): Table
  preference-metrics-combined has two prompt sets, (a) 5K MS-COCO 2017 val captions, (b) MJHQ-30K.
* **Grids** (``grid:`` one mapping, or a list): ``prompts`` a count (the eval set's first N) or a
  list of prompt texts; ``seeds`` a count (first N eval seeds) or a list of seeds. A grid with named
  prompts, a seed list or explicit epochs is rendered into its own small image sets
  (``OUT/grid_sets/<grid>/...``), so its prompts need not be in the eval set.

Each parser appends one line per problem to ``problems`` (as every parser of :mod:`.spec`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

EpochMap = dict[str, int]  #: level of the compared factor (arm) -> checkpoint epoch

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class PreferenceSpec:
    """Preference scores of base and selected checkpoints on (unseen) prompts (paper Table 5).

    ``name``: the set's name (several sets: ``OUT/pref_sets/<name>/...``; "" for the one set of a
    single ``preference:`` mapping). ``epochs``: explicit checkpoint per arm (None: every selected
    checkpoint, reward-matched and matched-epoch).
    """

    prompts: str
    seeds: str = "1"
    metrics: tuple[str, ...] = ("hps",)
    max_prompts: int | None = None
    max_prompt_tokens: int | None = None
    name: str = ""
    epochs: EpochMap | None = None


@dataclass(frozen=True)
class GridSpec:
    """An image grid: ``prompts`` (count or texts) x ``seeds`` (count or list), base / baseline / PCPO.

    ``match``: which selected checkpoints (``reward`` or ``epoch``) when ``epochs`` is unset.
    """

    prompts: int | tuple[str, ...] = 4
    seeds: int | tuple[int, ...] = 4
    name: str = ""
    epochs: EpochMap | None = None
    match: str = "reward"
    caption: str = ""

    @property
    def own_sets(self) -> bool:
        """Rendered into its own image sets (named prompts, a seed list or explicit epochs)."""
        return not isinstance(self.prompts, int) or not isinstance(self.seeds, int) or self.epochs is not None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def saved_epoch_problem(run_name: str, cfg: Any, epoch: int) -> str | None:
    """Why a trained run (its TrainConfig ``cfg``) will not save a checkpoint at ``epoch``, or None."""
    if epoch > cfg.epochs:
        return f"run {run_name} trains {cfg.epochs} epochs, fewer than {epoch}"
    if epoch % cfg.checkpoint_every and epoch != cfg.epochs:
        return (f"run {run_name} saves every {cfg.checkpoint_every} epochs, not at epoch {epoch} "
                f"(set checkpoint_every to a divisor of {epoch})")
    return None


def parse_epoch_map(key: str, value: Any, levels: Sequence[str], runs: Sequence[Any],
                    arm_of: Callable[[Any], str], problems: list[str]) -> EpochMap | None:
    """``EPOCH`` (every arm) or ``{arm: EPOCH}`` (each level of the compared factor) -> EpochMap."""
    if value is None:
        return None
    if _is_int(value):
        value = dict.fromkeys(levels, value)
    if not isinstance(value, dict) or not all(_is_int(v) and v >= 1 for v in value.values()):
        problems.append(f"{key} must be a positive epoch or a mapping of each arm to one, e.g. "
                        f"{{{', '.join(f'{lv}: 200' for lv in levels) or 'PCPO: 200'}}} (got {value!r})")
        return None
    out = {str(k): int(v) for k, v in value.items()}
    if levels and set(out) != set(levels):
        problems.append(f"{key} must give an epoch for each arm ({', '.join(levels)}), got {', '.join(out) or 'none'}")
        return None
    for r in runs:
        if r.train is not None and arm_of(r) in out:
            if (msg := saved_epoch_problem(r.name, r.train, out[arm_of(r)])) is not None:
                problems.append(f"{key}: {msg}")
                break
    return out


def _entries(key: str, section: Any, problems: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """A mapping (one entry, name "") or a list of mappings with distinct ``name``s."""
    if section is None:
        return []
    if isinstance(section, dict):
        return [(str(section.get("name", "")), section)]
    if not isinstance(section, list) or not all(isinstance(e, dict) for e in section):
        problems.append(f"{key} must be a mapping or a list of mappings, each with a name")
        return []
    out, seen = [], set()
    for i, e in enumerate(section):
        name = str(e.get("name", ""))
        if not _NAME_RE.fullmatch(name):
            problems.append(f"{key}[{i}] needs a name (letters, digits, . _ -), e.g. name: coco")
            continue
        if name in seen:
            problems.append(f"{key}[{i}]: name {name!r} is used twice; give each entry its own name")
            continue
        seen.add(name)
        out.append((name, e))
    return out


def _unknown(key: str, entry: dict[str, Any], allowed: set[str], problems: list[str]) -> dict[str, Any]:
    bad = sorted(set(map(str, entry)) - allowed)
    if bad:
        problems.append(f"unknown key(s) {', '.join(bad)} in {key} (valid: {', '.join(sorted(allowed))})")
    return {str(k): v for k, v in entry.items() if str(k) in allowed}


_PREF_KEYS = {"name", "prompts", "seeds", "metrics", "max_prompts", "max_prompt_tokens", "epochs"}
_GRID_KEYS = {"name", "prompts", "seeds", "epochs", "match", "caption"}


def parse_preferences(section: Any, prompt_source: Callable[[str], str], levels: Sequence[str],
                      runs: Sequence[Any], arm_of: Callable[[Any], str], choices: Sequence[str],
                      problems: list[str]) -> tuple[PreferenceSpec, ...]:
    """``preference:`` -> one PreferenceSpec per prompt set."""
    out = []
    for name, e in _entries("preference", section, problems):
        key = f"preference {name}".strip()
        pr = _unknown(key, e, _PREF_KEYS, problems)
        metrics = tuple(str(m) for m in (pr.get("metrics") or ()))
        for m in metrics:
            if m not in choices:
                problems.append(f"{key} metric {m!r} (choose from {', '.join(choices)})")
        if "prompts" not in pr:
            problems.append(f"{key}.prompts is required (a prompt set name or file)")
            continue
        epochs = parse_epoch_map(f"{key}.epochs", pr.get("epochs"), levels, runs, arm_of, problems)
        problems += _count_problems(key, pr)
        try:
            out.append(PreferenceSpec(**{**pr, "name": name, "metrics": metrics or ("hps",), "epochs": epochs,
                                         "seeds": str(pr.get("seeds", "1")),
                                         "prompts": prompt_source(str(pr["prompts"]))}))
        except TypeError as exc:
            problems.append(f"{key}: {exc}")
    return tuple(out)


def _count_problems(key: str, pr: dict[str, Any]) -> list[str]:
    """A preference entry's ``max_prompts`` / ``max_prompt_tokens`` (whole numbers >= 1 when given) and ``seeds``
    (generate's forms). YAML's ``on`` / ``yes`` (True) passed as 1 prompt, or as the seed "True"."""
    from pcpo_eval.errors import UserError
    from pcpo_eval.generate.plan import parse_seeds

    out = [f"{key}.{k} {pr[k]!r}: use a whole number >= 1" for k in ("max_prompts", "max_prompt_tokens")
           if pr.get(k) is not None and not (_is_int(pr[k]) and pr[k] >= 1)]
    seeds = pr.get("seeds", 1)
    try:
        if isinstance(seeds, bool):
            raise UserError(f"seeds {seeds!r} is a YAML boolean; give a count or a range such as 0-3")
        parse_seeds(seeds if isinstance(seeds, int | str) else str(seeds))
    except UserError as exc:
        out.append(f"{key}.seeds: {exc}")
    return out


def _grid_axis(key: str, value: Any, kind: type, problems: list[str]) -> Any:
    """A positive count, or a non-empty list of distinct ``kind`` values (prompt texts / seeds >= 0)."""
    if _is_int(value) and value >= 1:
        return int(value)
    ok = isinstance(value, list) and value and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
    if ok and kind is int:
        ok = all(v >= 0 for v in value)
    if not ok or len(set(value)) != len(value):
        what = "prompt texts" if kind is str else "distinct seeds >= 0"
        problems.append(f"{key} must be a positive count or a list of {what} (got {value!r})")
        return 1
    return tuple(value)


def parse_grids(section: Any, levels: Sequence[str], runs: Sequence[Any], arm_of: Callable[[Any], str],
                problems: list[str]) -> tuple[GridSpec, ...]:
    """``grid:`` -> one GridSpec per grid (default: one grid of the first 4 prompts x 4 seeds)."""
    entries = _entries("grid", section, problems)
    if section is None or (not entries and isinstance(section, dict)):
        return (GridSpec(),)
    out = []
    for name, e in entries:
        key = f"grid {name}".strip()
        g = _unknown(key, e, _GRID_KEYS, problems)
        match = str(g.get("match", "reward"))
        if match not in ("reward", "epoch"):
            problems.append(f"{key}.match {match!r} (choose reward or epoch)")
            match = "reward"
        out.append(GridSpec(prompts=_grid_axis(f"{key}.prompts", g.get("prompts", 4), str, problems),
                            seeds=_grid_axis(f"{key}.seeds", g.get("seeds", 4), int, problems), name=name,
                            epochs=parse_epoch_map(f"{key}.epochs", g.get("epochs"), levels, runs, arm_of, problems),
                            match=match, caption=str(g.get("caption", ""))))
    return tuple(out)


def grid_dir_name(grid: GridSpec, index: int) -> str:
    """The folder of a grid's own sets: its name, else ``grid<index>``."""
    return grid.name or f"grid{index}"
