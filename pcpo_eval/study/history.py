"""The record of a study's analyses (``STUDY/analyses.jsonl``) and what it says about the one at hand.

Every computed verdict (the stats stage) is logged: when, which runs, the analysis settings
(:data:`ANALYSIS_KEYS`: the primary endpoint, targets, window, checkpoint matching, metrics, the LMM and
its alpha) and the headline. A verdict reached after earlier analyses of the same runs under other
settings, or after an earlier analysis of fewer of its runs (seeds added once a verdict was seen), is a
chosen one among several looks: each look may show a difference by chance, so picking the look that does
raises the study's false-claim rate above alpha, as interim looks do in a human study. The headline then
says so and names what changed (:func:`history_caveat`); the analyses themselves are all in the file.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pcpo_eval.study.spec import StudySpec
from pcpo_eval.studydir import StudyLayout

#: the spec keys that are choices of analysis, not of data: changing one re-analyses the same runs
ANALYSIS_KEYS = ("primary", "targets", "gain_targets", "window", "select_target", "select_on", "select_epoch",
                 "metrics", "overall_only", "lmm")


def settings_of(sp: StudySpec) -> dict[str, Any]:
    """The analysis settings of ``sp`` as JSON values (lists, not tuples), comparable across entries."""
    resolved = json.loads(json.dumps(sp.to_dict(), default=str))
    return {k: resolved.get(k) for k in ANALYSIS_KEYS}


def _differs(old: Any, new: Any) -> bool:
    """Whether a setting differs; two mappings only on the keys both record (a key a newer version of the spec
    added, such as a new LMM option, is no change of analysis)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return any(_differs(old[k], new[k]) for k in old.keys() & new.keys())
    return old != new


def read_history(layout: StudyLayout) -> list[dict[str, Any]]:
    """The analyses logged so far (unreadable lines skipped)."""
    path = layout.analyses_file
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def history_caveat(sp: StudySpec, layout: StudyLayout) -> dict[str, Any] | None:
    """What earlier analyses mean for this one: ``{"changed": keys, "earlier": n, "fewer_runs": m, "note"}``,
    or None when every earlier analysis of these runs used these settings (or there was none)."""
    runs, settings = sorted(r.name for r in sp.runs), settings_of(sp)
    earlier = read_history(layout)
    same_runs = [e for e in earlier if sorted(e.get("runs") or []) == runs]
    changed_in = [(e, [k for k in ANALYSIS_KEYS if _differs((e.get("settings") or {}).get(k), settings[k])])
                  for e in same_runs]
    other = [e for e, keys in changed_in if keys]
    changed = sorted({k for _, keys in changed_in for k in keys})
    subsets = [e for e in earlier if set(e.get("runs") or []) < set(runs)]
    parts = []
    if other:
        parts.append(f"this verdict follows {len(other)} earlier analysis(es) of these runs with other settings "
                     f"(changed: {', '.join(changed)})")
    if subsets:
        fewest = min(len(e.get("runs") or []) for e in subsets)
        parts.append(f"{len(subsets)} earlier analysis(es) used fewer of these runs (from {fewest} of {len(runs)}): "
                     "runs added after a verdict was seen")
    if not parts:
        return None
    note = ("Analysis history: " + "; ".join(parts) + ". Each look can show a difference by chance, so a verdict "
            "chosen among several has a false-claim rate above alpha; report the analysis planned before the "
            f"first look, or every one ({layout.analyses_file.name} lists them)")
    return {"earlier": len(other), "changed": changed, "fewer_runs": len(subsets), "note": note}


def record(sp: StudySpec, layout: StudyLayout, results: dict[str, Any]) -> None:
    """Append this analysis to ``analyses.jsonl`` (one JSON line; the file only grows)."""
    primary = [{"quantity": r.get("quantity"), "cell": r.get("cell"), "significant": r.get("significant"),
                "p_adjusted": r.get("p_adjusted")} for r in results.get("verdict") or [] if r.get("family") == "primary"]
    entry = {"at": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": sorted(r.name for r in sp.runs),
             "settings": settings_of(sp), "primary": primary, "headline": results.get("headline")}
    layout.out.mkdir(parents=True, exist_ok=True)
    with open(layout.analyses_file, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, default=str) + "\n")
