"""Existing run directories in a study must be the runs the spec says they are, and comparable.

A study trains its own runs from the spec, so their settings are what the YAML says. A run listed
under ``runs:`` (trained elsewhere, or imported) brings settings the spec never shows: its
``config.yaml``. Comparing arms whose runs were trained with another reward, base model, prompt
set, sampler setting or learning rate would print a verdict about that setting, labelled as the
algorithm's; a run listed under the wrong seed would be paired with the wrong run of the other arm.
:func:`existing_run_problems` names, before any work, every existing run whose ``config.yaml``

* records another training seed than the run is listed with (pairing by seed would pair the wrong runs);
* contradicts its design level's overrides (e.g. listed under ``PCPO: {objective: pcpo}`` but trained
  with ``objective: ppo_clip``);
* differs from another run of its comparison cell in a setting the compared factor's levels do not
  declare (the arms may differ only in what ``design.<compared factor>.<level>`` sets; a declared key
  must still agree within an arm);
* was trained on another reward than a run of its cell, declared or not, trained by the study or not
  (:func:`reward_problems`): every row compares rewards.

Even a declared difference must not change what one *epoch* is (:func:`epoch_unit_problems`): the
verdict counts epochs (speed-up = epochs to a target; paired gain, final reward and AUC at equal
epochs), as the paper does ("Speedup in epochs", both arms at one batch), so a PCPO level that samples
twice the images per epoch, or takes twice the optimizer steps, would have its extra samples or
compute credited as speed. Such a design is refused unless the spec says ``unequal_epochs_ok: true``
(then the headline names the difference).

Only keys present in both configs are compared (an imported run records its model and objective
only), and :data:`EXEMPT_KEYS` never are: they do not change what a run learns, or another part of
the study handles them (``epochs``: every cell is cut to its shortest run, with a note; ``paired_control``:
the verdict names runs without a control).

File-valued settings (``prompts``, ``validation_prompts``, ``init_from``, a model folder) arrive as
:class:`~pcpo_eval.train.inputs.FileSetting` (``settings_of`` builds them from the run's
``inputs.json``): the same input when their content digests agree, else their resolved paths, else
their texts. So ``prompts: train/prompts/x.txt`` and the same file given as an absolute path agree,
and one path string that held other prompts when each run was trained does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from pcpo_eval.train.inputs import FileSetting

#: config keys never compared between runs: execution and logging, importer bookkeeping, the seed
#: (checked on its own) and the keys the verdict already handles (``epochs``, ``paired_control``)
EXEMPT_KEYS = frozenset({
    "seed", "epochs", "paired_control", "device", "keep_checkpoints", "compile", "deterministic", "allow_tf32",
    "diagnostics",
    "log_to", "log_project", "log_images_every", "wandb_mode", "imported_from", "source",
})  # fmt: skip


def same_value(a: Any, b: Any) -> bool:
    """Config values equal as the trainer reads them: numbers by value (YAML may give ``5e-5`` as text),
    files by what they held (:meth:`FileSetting.same_input`; a plain value counts as its text)."""
    if isinstance(a, FileSetting) or isinstance(b, FileSetting):
        return _as_file(a).same_input(_as_file(b))
    if a == b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return False
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=0.0)


def _as_file(v: Any) -> FileSetting:
    return v if isinstance(v, FileSetting) else FileSetting(str(v))


def _show(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def _one_path_text(by_arm: dict[str, list[tuple[str, Any]]]) -> str:
    """The hint for runs whose file-valued setting reads the same but held other contents (else "")."""
    vals = [v for items in by_arm.values() for _, v in items]
    if len({_as_file(v).text for v in vals}) == 1 and any(isinstance(v, FileSetting) for v in vals):
        return " (one path, other contents: the file changed between the trainings, or they ran on other machines)"
    return ""


def epoch_budget(cfg: dict[str, Any]) -> dict[str, int | None]:
    """What one epoch of a run is, from the settings it records: ``images`` sampled per epoch (what its log
    records over all processes, :data:`IMAGES_LOGGED`; else the stated total ``paper_total_batch`` when > 0,
    else ``sample_batch_size x sample_batches_per_epoch``, per process: a config does not record how many
    processes trained it, and a study trains its own runs on one) and ``updates``, the optimizer steps
    (``gradient_updates x num_inner_epochs``); None where the config does not record the keys (an imported
    run records its model and objective only)."""
    def num(key: str) -> int | None:
        try:
            return int(float(cfg[key])) if key in cfg and not isinstance(cfg[key], bool) else None
        except (TypeError, ValueError):
            return None

    total, per, batches = num("paper_total_batch"), num("sample_batch_size"), num("sample_batches_per_epoch")
    images = total if total else (per * batches if per is not None and batches is not None else None)
    if (logged := num(IMAGES_LOGGED)) is not None:  # what the run's log says it sampled, all processes
        images = logged
    steps, inner = num("gradient_updates"), num("num_inner_epochs")
    return {"images": images, "updates": steps * inner if steps is not None and inner is not None else None}


#: a run's settings may carry the images per epoch its log records over all processes
#: (:func:`pcpo_eval.rundir.logged_images_per_epoch`); :func:`epoch_budget` takes it over the config's count
IMAGES_LOGGED = "images_per_epoch_logged"

#: how :func:`epoch_unit_problems` names each part of an epoch, and the keys that set it
EPOCH_PARTS = {"images": ("images sampled per epoch", "sample_batch_size x sample_batches_per_epoch (or "
                          "paper_total_batch)"),
               "updates": ("optimizer steps per epoch", "gradient_updates x num_inner_epochs")}


#: settings named first when a run does not record them (what most often separates two trainings)
SALIENT_KEYS = ("learning_rate", "sample_steps", "sample_eta", "cfg", "prompts", "lora_rank", "clip_range",
                "beta_kl", "train_batch_size", "timestep_fraction")


def unchecked_settings(runs: Sequence[tuple[str, str, dict[str, Any]]]) -> dict[str, list[str]]:
    """What could not be compared, per run of one cell (``(arm, run name, settings)`` each): the parts of an
    epoch (:data:`EPOCH_PARTS`) it does not record, then the :data:`SALIENT_KEYS` and the settings other runs
    of the cell record that it does not (salient ones first). Before the salient keys were named whatever
    the others record, two imported arms that stated their batch as advised had no caveat left, though
    neither recorded its learning rate (one arm's was twice the other's). Every check here compares only what both runs record, so
    an imported run (model, objective and reward only) passed all of them unseen: two imported arms whose PCPO
    runs sampled twice the images per epoch had a "+39% speed-up" with nothing said."""
    keys = {k for _, _, cfg in runs for k in cfg} - EXEMPT_KEYS - {IMAGES_LOGGED}
    out: dict[str, list[str]] = {}
    for _, name, cfg in runs:
        missing = [EPOCH_PARTS[part][0] for part, v in epoch_budget(cfg).items() if v is None]
        # the salient settings whatever the others record (two imported arms record none of them: both unchecked)
        missing += sorted((keys | set(SALIENT_KEYS)) - set(cfg), key=lambda k: (
            k not in SALIENT_KEYS, SALIENT_KEYS.index(k) if k in SALIENT_KEYS else 0, k))
        if missing:
            out[name] = missing
    return out


def unchecked_text(unchecked: dict[str, list[str]], bare: Sequence[str] = ()) -> str:
    """The caveat for runs whose settings could not be compared (:func:`unchecked_settings`), and for ``bare``
    logs given without their run folder (no ``config.yaml`` at all)."""
    names = sorted(unchecked)
    items = list(dict.fromkeys(m for name in names for m in unchecked[name]))
    shown = ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "")
    who = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    parts = [f"{len(names)} run(s) ({who}) record no {shown}"] if names else []
    if bare:
        parts.append(f"{len(bare)} log(s) ({', '.join(list(bare)[:3])}{', ...' if len(bare) > 3 else ''}) come without "
                     "their run folder's config.yaml (reward, epoch size, settings)")
    return (f"settings not checked: {'; '.join(parts)}, so the arms may differ in them unseen (an imported run's "
            "config.yaml holds its model, objective and reward only); add the settings each run was trained with to "
            "its config.yaml (a total batch as paper_total_batch)" + ("" if not bare else ", and give run folders"))


#: settings that define the reward every row of the verdict compares; the arms may never differ in them
REWARD_KEYS = ("reward", "reward_options")
#: ``reward_options`` keys that say where the reward runs, not what it scores
REWARD_PLACEMENT_KEYS = frozenset({"device"})


def _reward_setting(cfg: dict[str, Any], key: str) -> Any:
    v = cfg[key]
    if key == "reward" and isinstance(v, str):  # a name is its weighted sum of one
        return {v: 1.0}
    if key == "reward_options" and isinstance(v, dict):
        return {k: o for k, o in v.items() if k not in REWARD_PLACEMENT_KEYS}
    return v


def reward_problems(cell: str | None, runs: Sequence[tuple[str, str, dict[str, Any]]], compare: str, *,
                    fix: str | None = None) -> list[str]:
    """Where the runs of one cell (``(arm, run name, settings)`` each; trained or existing) were trained on
    different rewards, declared by a level of the compared factor or not: every row of the verdict (paired
    gain, speed-ups to reward targets, final reward, AUC) compares rewards, so two rewards are two scales.
    A PCPO level that set ``reward: {toy_aesthetic: 2.0}`` (the same reward doubled, learning exactly the same)
    had a significantly higher paired gain (+0.042, p = 0.029, 5 seeds) and its scale was reported as a
    sampler offset; on one scale its gain was lower (p = 0.005). ``cell``: the study's cell (None: a command's
    runs, no cell); ``fix``: the advice (default: a study spec's)."""
    where = "" if cell is None else f"in cell {cell}, "
    out = []
    for key in REWARD_KEYS:
        if _differing([(arm, name, {key: _reward_setting(cfg, key)}) for arm, name, cfg in runs if key in cfg],
                      key) is not None:
            diff = _differing(runs, key)  # as the configs spell them
            assert diff is not None
            advice = fix or f"set {key} once for the study (under train: or in its train config), not per level"
            out.append(f"{where}the runs are trained on different {key} ({_values_text(diff)}): every row "
                       f"compares rewards (paired gain, speed-ups, final reward), so runs on two rewards put the arms "
                       f"of {compare} on two scales (a reward doubled doubles every gain); {advice}")
    return out


def epoch_unit_problems(cell: str | None, runs: Sequence[tuple[str, str, dict[str, Any]]], baseline: str, pcpo: str,
                        compare: str, *, fix: str | None = None) -> list[str]:
    """Where the compared arms of one cell differ in what one epoch is (:func:`epoch_budget`), one text per
    part: the verdict's epochs would then be unequal amounts of sampling or compute. ``runs``: (arm, run
    name, settings) per run; a run that does not record a part is not compared on it. ``fix``: the advice
    (default: a study spec's)."""
    out = []
    for part, (what, keys) in EPOCH_PARTS.items():
        vals = {arm: sorted({b for a, _, cfg in runs if a == arm and (b := epoch_budget(cfg)[part]) is not None})
                for arm in (baseline, pcpo)}
        if vals[baseline] and vals[pcpo] and vals[baseline] != vals[pcpo]:
            shown = {arm: " / ".join(map(str, v)) for arm, v in vals.items()}
            advice = fix or (f"give both levels of {compare} one {keys.split(' (')[0]}, or set unequal_epochs_ok: "
                             "true to compare per epoch anyway (the headline then says so)")
            out.append(f"{'' if cell is None else f'in cell {cell}, '}the arms differ in {what} ({pcpo} {shown[pcpo]}, {baseline} {shown[baseline]}; "
                       f"{keys}): the verdict counts epochs, so a speed-up in epochs (and the gain, final reward and "
                       f"AUC at equal epochs) would count the extra samples or compute of one arm as an effect of "
                       f"{compare}; {advice}")
    return out


def edited_settings(name: str, cfg: dict[str, Any], trained: dict[str, Any] | None) -> list[str]:
    """Where a run's ``config.yaml`` (``cfg``) says other than the config its latest checkpoint was trained with
    (``trained``: ``checkpoint.json``'s ``config``; None for runs that record none, e.g. imported ones): the
    file was edited after training, and every check here would read the edit. A PCPO run trained on
    ``reward: {toy_aesthetic: 2.0}`` and ``gradient_updates: 2``, its config.yaml then edited to the baseline's,
    passed every check. Keys a resume may change, and :data:`EXEMPT_KEYS`, are not compared."""
    from pcpo_eval.train.config import RESUME_MAY_CHANGE

    if not trained:
        return []
    keys = sorted((set(cfg) & set(trained)) - EXEMPT_KEYS - set(RESUME_MAY_CHANGE))
    return [f"run {name}: its config.yaml records {k}: {_show(cfg[k])}, but its checkpoints were trained with {k}: "
            f"{_show(trained[k])} (checkpoint.json): the file was edited after training; restore it (the checkpoints "
            "record what the run was trained with)" for k in keys if not same_value(cfg[k], trained[k])]


def seed_problem(name: str, listed: int, cfg: dict[str, Any]) -> str | None:
    """An existing run listed with another seed than its ``config.yaml`` records (None: agrees or unrecorded)."""
    seed = cfg.get("seed")
    if seed is None or isinstance(seed, bool) or same_value(seed, listed):
        return None
    return (f"run {name} is listed with seed {listed}, but its config.yaml records seed {_show(seed)}: pairing by "
            f"seed would pair it with the other arm's seed-{listed} run; list it with seed: {_show(seed)}")


def override_problems(name: str, overrides: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """Keys of the run's design levels that its ``config.yaml`` contradicts."""
    return [f"run {name} is listed under a design level that sets {k}: {_show(v)}, but its config.yaml records "
            f"{k}: {_show(cfg[k])}; list it under the level it was trained as"
            for k, v in overrides.items() if k in cfg and k not in EXEMPT_KEYS and not same_value(cfg[k], v)]


def _differing(runs: Sequence[tuple[str, str, dict[str, Any]]], key: str) -> dict[str, list[tuple[str, Any]]] | None:
    """Per arm, (run, value) of ``key`` among the runs that record it, when two values differ; else None."""
    have = [(arm, name, cfg[key]) for arm, name, cfg in runs if key in cfg]
    if all(same_value(v, have[0][2]) for _, _, v in have[1:]):
        return None
    out: dict[str, list[tuple[str, Any]]] = {}
    for arm, name, v in have:
        out.setdefault(arm, []).append((name, v))
    return out


def _values_text(by_arm: dict[str, list[tuple[str, Any]]]) -> str:
    parts = []
    for arm, items in by_arm.items():
        vals = list(dict.fromkeys(_show(v) for _, v in items))
        parts.append(f"{arm} {' / '.join(vals)}")
    return "; ".join(parts)


def cell_problems(cell: str, runs: Sequence[tuple[str, str, dict[str, Any], bool]], declared: set[str],
                  compare: str) -> list[str]:
    """Settings that differ between the runs of one comparison cell.

    ``runs``: (arm, run name, settings, existing) per run. Undeclared keys must agree over the whole
    cell, declared ones (set by a level of the compared factor) within each arm. Only cells with an
    existing run are checked: trained runs are what the spec says.
    """
    if not any(existing for *_, existing in runs):
        return []
    rows = [(arm, name, cfg) for arm, name, cfg, _ in runs]
    keys = sorted({k for _, _, cfg in rows for k in cfg} - EXEMPT_KEYS - set(REWARD_KEYS))  # reward_problems
    out = []
    for key in keys:
        if key in declared:
            for arm in dict.fromkeys(a for a, _, _ in rows):
                diff = _differing([r for r in rows if r[0] == arm], key)
                if diff is not None:
                    who = ", ".join(f"{n}: {_show(v)}" for items in diff.values() for n, v in items)
                    out.append(f"in cell {cell}, the {arm} runs differ in {key} ({who}); the runs of an arm must be "
                               "replicates of one setting")
            continue
        diff = _differing(rows, key)
        if diff is not None:
            out.append(f"in cell {cell}, the runs differ in {key} ({_values_text(diff)}){_one_path_text(diff)}, "
                       f"which no level of {compare} "
                       f"sets: the verdict would credit that difference to {compare}; use runs trained with one "
                       f"{key}, or declare it in design.{compare}.<level> if the arms are meant to differ in it")
    return out


def existing_run_problems(runs: Sequence[Any], compare: str, declared: set[str], cell_of: Callable[[Any], str],
                          settings_of: Callable[[Any], dict[str, Any] | None],
                          overrides_of: Callable[[Any], dict[str, Any]] = lambda r: r.overrides) -> list[str]:
    """Every problem of :mod:`this module <pcpo_eval.stats.comparability>` over the spec's runs.

    ``settings_of(run)`` is the run's resolved train config (a trained run) or its ``config.yaml``
    (an existing run; None when unreadable, reported elsewhere), file-valued settings as
    :class:`FileSetting`; ``overrides_of(run)``: its design levels' overrides, likewise.
    """
    problems: list[str] = []
    by_cell: dict[str, list[tuple[str, str, dict[str, Any], bool]]] = {}
    for r in runs:
        cfg = settings_of(r)
        if cfg is None:
            continue
        if r.run_dir is not None:
            if (msg := seed_problem(r.name, r.seed, cfg)) is not None:
                problems.append(msg)
            problems += override_problems(r.name, overrides_of(r), cfg)
        by_cell.setdefault(cell_of(r), []).append((r.levels.get(compare, ""), r.name, cfg, r.run_dir is not None))
    for cell, members in by_cell.items():
        problems += cell_problems(cell, members, declared, compare)
    return problems
