"""A few console lines summarising a study's ``results.json`` (printed by ``pcpo-eval demo``).

Order: the run-level verdict sentences first (they are the study's answer, over runs), with the
1-run-per-arm warning and the notes; then the sampler offset of the untrained controls; then the
speed-up table (uninformative targets labelled), the matched-reward balance and the compared factor's
LMM effects. A missing number is printed as "n/a", never as "None" or "nan".
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pcpo_eval.stats.fmt import p_value, pct
from pcpo_eval.studydir import results_path

ONE_RUN_WARNING = "  1 run per arm: these are differences between runs, not algorithms (no CI, no p-value)"


def _num(x: Any, fmt: str = ".4g") -> str:
    """``x`` formatted, or ``n/a`` for None / NaN / non-numbers."""
    if isinstance(x, bool) or not isinstance(x, int | float) or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return format(x, fmt)


def _p(x: Any) -> str:
    """A p-value as the verdict prints it (:func:`pcpo_eval.stats.fmt.p_value`), or ``n/a``."""
    return p_value(float(x)) if _num(x) != "n/a" else "n/a"


def verdict_lines(res: dict[str, Any]) -> list[str]:
    """The verdict sentences per cell, the 1-run warning and the notes."""
    rows = res.get("verdict") or []
    lines = ["verdict (runs are the replicates):"] if rows else ["verdict: none in this results.json"]
    if res.get("headline"):
        lines.insert(0, f"headline: {res['headline']}")
    if rows and all(v.get("n_baseline_runs") == 1 and v.get("n_treatment_runs") == 1 for v in rows):
        lines.append(ONE_RUN_WARNING)
    for v in rows:
        lines.append(f"  [{v.get('cell') or '-'}] {v.get('quantity') or '?'}: {v.get('sentence') or '(no sentence)'}")
    lines += [f"  note: {n}" for n in res.get("verdict_notes") or []]
    for cell, off in (res.get("sampler_offset") or {}).items():
        lines.append(f"  sampler offset [{cell}]: {off.get('explains') or '(none)'}")
    return lines


def _verdict_row(res: dict[str, Any], cell: Any, quantity: Any) -> dict[str, Any] | None:
    """The verdict row of one cell and quantity (a speed-up table row's own test), or None."""
    return next((x for x in res.get("verdict") or [] if x.get("cell") == cell and x.get("quantity") == quantity), None)


def _speedup_status(v: dict[str, Any] | None, row: dict[str, Any]) -> str:
    """What a speed-up's point estimate is worth, as its verdict row ``v`` says: significant (after Holm and
    the gate), not tested (the secondary family's gate closed), or no evidence; with the Holm-adjusted p."""
    gated = bool(((v or {}).get("details") or {}).get("gated"))
    word = "significant" if row.get("significant") else "not tested" if gated else "no evidence of a difference"
    p = row.get("p_adjusted")
    power = f"; detectable {pct(row['mde'])}" if isinstance(row.get("mde"), int | float) else ""  # what it could find
    return f" (Holm p {_p(p)}: {word}{power})" if isinstance(p, int | float) else f" ({word}{power})"


def speedup_lines(res: dict[str, Any]) -> list[str]:
    """The speed-up table: restricted mean epochs to each gain / reward target per arm, in %, each with
    what its verdict row says of it (a bare "+67%" of an A/A study read as a finding)."""
    lines = []
    for block in res.get("speedup") or []:
        for row in block.get("rows", []):
            head = f"  speed-up [{block.get('cell')}] {row.get('curve')} {_num(row.get('target'), 'g')}: "
            if row.get("uninformative"):
                lines.append(head + str(row.get("status")))
                continue
            sp = row.get("speedup")
            v = _verdict_row(res, block.get("cell"), row.get("quantity"))
            if v is not None and v.get("estimable") is False:  # "+0.0% (not tested)" read as a measured 0
                what = f"{pct(sp)}, not estimable: {v.get('reason')}" if isinstance(sp, int | float) else str(v.get("reason"))
            else:
                what = (f"{pct(sp)}{_speedup_status(v, row)}" if isinstance(sp, int | float)
                        else (row.get("status") or "n/a"))
            lines.append(head + f"{block.get('baseline') or 'baseline'} {row.get('baseline_epochs')} vs "
                         f"{block.get('pcpo') or 'PCPO'} {row.get('pcpo_epochs')} epochs -> {what}")
    return lines


def balance_lines(res: dict[str, Any]) -> list[str]:
    """Per cell: do the arms' reward-matched checkpoints carry the same reward (``selection.balance``)?"""
    return [f"  {b.get('sentence')}" for b in ((res.get("selection") or {}).get("balance") or {}).values()]


def lmm_lines(res: dict[str, Any]) -> list[str]:
    """The compared factor's main effect per metric: estimate, p, adjusted p, or why there is none."""
    from pcpo_eval.stats.design import term_factors

    lmm = res.get("lmm") or {}
    factor = (res.get("study") or {}).get("compare", {}).get("factor", "")
    key = "p_bh" if lmm.get("adjust") == "bh" else "p_holm"
    lines = [f"  LMM formula: {lmm['formula']}"] if lmm.get("formula") else []
    for m, fit in (lmm.get("fits") or {}).items():
        if "error" in fit:
            lines.append(f"  LMM {m}: fit failed ({fit['error']})")
            continue
        for fe in fit.get("fixed", []):
            if term_factors(fe["term"]) != (factor,):  # the factor's main effect, either coding
                continue
            if fit.get("estimable", True) is False:
                lines.append(f"  LMM {m}: {fe['term']} = {_num(fe.get('estimate'))} (not estimable: {fit.get('reason')})")
                continue
            p_adj = (lmm.get("adjusted") or {}).get(m, {}).get(fe["term"], {}).get(key)
            power = f", detectable ±{_num(fe['mde'], '.3g')}" if isinstance(fe.get("mde"), int | float) else ""
            lines.append(f"  LMM {m}: {fe['term']} = {_num(fe.get('estimate'))} (p = {_p(fe.get('p'))}, "
                         f"adj. p = {_p(p_adj)}{power})")
    return lines


def summary_lines(study_dir: Path) -> list[str]:
    """The console summary of ``STUDY_DIR/results.json`` (see the module docstring)."""
    res = json.loads(results_path(study_dir).read_text())
    return [*verdict_lines(res), "details:", *speedup_lines(res), *balance_lines(res), *lmm_lines(res)]
