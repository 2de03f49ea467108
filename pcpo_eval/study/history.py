"""The record of a study's analyses (``STUDY/analyses.jsonl``) and what it says about the one at hand.

Every computed verdict (the stats stage) is logged: when, which runs, the analysis settings
(:data:`ANALYSIS_KEYS`: the primary endpoint, targets, window, checkpoint matching, metrics, the LMM and
its alpha) and the headline. A verdict reached after earlier analyses of the same runs under other
verdict settings, or after an earlier analysis of another set of runs (seeds added, dropped or replaced
once a verdict was seen), is a chosen one among several looks: each look may show a difference by chance, so picking the look that does
raises the study's false-claim rate above alpha, as interim looks do in a human study. The headline then
says so and names what changed (:func:`history_caveat`); image-metric settings changed under the same
runs get a note under the raw-score table; the analyses themselves are all in the file. Runs are matched
by name (renaming a level renames its runs: such an analysis counts as one of other runs).
"""

from __future__ import annotations

import json
import time
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.io import append_jsonl, read_jsonl
from pcpo_eval.study.spec import StudySpec
from pcpo_eval.studydir import StudyLayout

#: the spec keys the run-level verdict (the headline) depends on: changing one re-analyses the same runs
VERDICT_KEYS = ("primary", "targets", "gain_targets", "window")
#: the keys the image-metric comparisons depend on besides the runs (the raw-score table, the LMMs)
IMAGE_KEYS = ("select_target", "select_on", "select_epoch", "metrics", "overall_only", "lmm")
ANALYSIS_KEYS = (*VERDICT_KEYS, *IMAGE_KEYS)
#: list-valued settings whose order means nothing
_UNORDERED = ("primary", "targets", "gain_targets", "metrics", "overall_only")


def settings_of(sp: StudySpec, primary: list[str]) -> dict[str, Any]:
    """The analysis settings of ``sp`` as JSON values, comparable across entries: ``primary`` the resolved
    primary rows (the default written out is no change), order-free lists sorted, the LMM formula without
    spaces (a reformatted formula is no change)."""
    resolved = json.loads(json.dumps(sp.to_dict(), default=str))
    out = {k: resolved.get(k) for k in ANALYSIS_KEYS} | {"primary": list(primary)}
    for k in _UNORDERED:
        if isinstance(out[k], list):
            out[k] = sorted(out[k], key=str)
    if isinstance(out["lmm"], dict) and isinstance(out["lmm"].get("formula"), str):
        out["lmm"] = {**out["lmm"], "formula": "".join(out["lmm"]["formula"].split())}
    return out


def primary_of(rows: list[dict[str, Any]]) -> list[str]:
    """The verdict's primary rows, as ``cell: quantity`` (what ``primary`` resolved to)."""
    return sorted(f"{r.get('cell')}: {r.get('quantity')}" for r in rows if r.get("family") == "primary")


def _differs(old: Any, new: Any) -> bool:
    """Whether a setting differs; two mappings only on the keys both record (a key a newer version of the spec
    added, such as a new LMM option, is no change of analysis)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return any(_differs(old[k], new[k]) for k in old.keys() & new.keys())
    return old != new


def read_history(layout: StudyLayout) -> list[dict[str, Any]]:
    """The analyses logged so far; a damaged line, or one that is no analysis record (runs a list of names,
    settings an object), is one ``error:`` naming it (before: a ``TypeError`` traceback)."""
    entries = read_jsonl(layout.analyses_file, "study's analysis history")
    for i, e in enumerate(entries, start=1):
        runs, settings, epochs = e.get("runs"), e.get("settings"), e.get("run_epochs")
        if not (isinstance(runs, list) and all(isinstance(r, str) for r in runs) and isinstance(settings, dict)
                and (epochs is None or isinstance(epochs, dict))):
            raise UserError(f"{layout.analyses_file}: record {i} is not an analysis (runs: a list of run names, "
                            "settings: an object); restore the file from a copy, or remove that line if you know "
                            "what it held")
    return entries


def run_epochs(runs: list[dict[str, Any]]) -> dict[str, int]:
    """Each run's last logged epoch (``results.json`` ``runs``): training extended after a look changes it."""
    return {str(r["run"]): int(max(r["epochs"])) for r in runs if r.get("epochs")}


def history_caveat(sp: StudySpec, layout: StudyLayout, rows: list[dict[str, Any]],
                   epochs: dict[str, int] | None = None) -> dict[str, Any] | None:
    """What earlier analyses mean for this one (``rows``: its verdict rows; ``epochs``: each run's last
    epoch, :func:`run_epochs`): ``note`` for the headline when an earlier analysis of these runs used other
    verdict settings (:data:`VERDICT_KEYS`; counted once per distinct setting, not per re-run), saw the runs
    at other lengths (trained further after a verdict was seen) or another set of runs (added, dropped or
    replaced); ``image_note`` when it used other image-metric settings (:data:`IMAGE_KEYS`); None when there
    is nothing to say."""
    runs, settings = set(r.name for r in sp.runs), settings_of(sp, primary_of(rows))
    earlier = read_history(layout)
    same_runs = [e for e in earlier if set(e.get("runs") or []) == runs]
    changed_in = [(e, [k for k in ANALYSIS_KEYS if _differs((e.get("settings") or {}).get(k), settings[k])])
                  for e in same_runs]
    verdict_changed = sorted({k for _, keys in changed_in for k in keys if k in VERDICT_KEYS})
    image_changed = sorted({k for _, keys in changed_in for k in keys if k in IMAGE_KEYS})
    n_verdict = len({json.dumps({k: (e.get("settings") or {}).get(k) for k in VERDICT_KEYS}, sort_keys=True, default=str)
                     for e, keys in changed_in if any(k in VERDICT_KEYS for k in keys)})
    lengths = {json.dumps(e["run_epochs"], sort_keys=True) for e in same_runs
               if e.get("run_epochs") and epochs and e["run_epochs"] != epochs}
    others = [set(e.get("runs") or []) for e in earlier if set(e.get("runs") or []) != runs]
    how = {"added": sum(1 for o in others if o < runs), "dropped": sum(1 for o in others if o > runs)}
    how["replaced"] = len(others) - how["added"] - how["dropped"]
    parts = []
    if lengths:
        parts.append(f"{len(lengths)} earlier analysis(es) saw these runs at other lengths (trained further, or cut, "
                     "after a verdict was seen)")
    if n_verdict:
        parts.append(f"this verdict follows {n_verdict} earlier analysis(es) of these runs with other settings "
                     f"(changed: {', '.join(verdict_changed)})")
    if others:
        what = ", ".join(f"{n} with runs {w} since" for w, n in how.items() if n)
        parts.append(f"{len(others)} earlier analysis(es) used another set of runs ({what}): runs chosen after a "
                     "verdict was seen")
    note = ("Analysis history: " + "; ".join(parts) + ". Each look can show a difference by chance, so a verdict "
            "chosen among several has a false-claim rate above alpha; report the analysis planned before the "
            f"first look, or every one ({layout.analyses_file.name} lists them)") if parts else None
    image_note = (f"Analysis history: earlier analyses of these runs compared the images with other settings "
                  f"(changed: {', '.join(image_changed)}); a comparison chosen among several has a false-claim "
                  f"rate above alpha ({layout.analyses_file.name} lists them)") if image_changed else None
    if note is None and image_note is None:
        return None
    return {"earlier": n_verdict, "changed": verdict_changed, "image_changed": image_changed,
            "other_runs": how, "other_lengths": len(lengths), "note": note, "image_note": image_note}


def record(sp: StudySpec, layout: StudyLayout, results: dict[str, Any]) -> None:
    """Append this analysis to ``analyses.jsonl`` (one JSON line; the file only grows)."""
    rows = results.get("verdict") or []
    primary = [{"quantity": r.get("quantity"), "cell": r.get("cell"), "significant": r.get("significant"),
                "p_adjusted": r.get("p_adjusted")} for r in rows if r.get("family") == "primary"]
    entry = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": sorted(r.name for r in sp.runs),
             "run_epochs": run_epochs(results.get("runs") or []),
             "settings": settings_of(sp, primary_of(rows)), "primary": primary, "headline": results.get("headline")}
    layout.out.mkdir(parents=True, exist_ok=True)
    append_jsonl(layout.analyses_file, entry)
