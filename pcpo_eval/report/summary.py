"""A few console lines summarising a study's ``results.json`` (printed by ``pcpo-eval demo``)."""

from __future__ import annotations

from pathlib import Path


def summary_lines(study_dir: Path) -> list[str]:
    """A few lines from ``results.json``: speed-ups and the compared factor's LMM effects."""
    import json

    res = json.loads((study_dir / "results.json").read_text())
    lines = []
    for block in res.get("speedup", []):
        for row in block["table"]["targets"]:
            sp = f"{row['speedup_pct']:+.1f}%" if row.get("speedup_pct") is not None else row.get("status", "")
            lines.append(f"  speed-up [{block['cell']}] target {row['target']:g}: baseline {row['baseline_mean']} "
                         f"vs PCPO {row['pcpo_mean']} epochs -> {sp}")
    lmm = res.get("lmm", {})
    factor = res.get("study", {}).get("compare", {}).get("factor", "")
    key = "p_bh" if lmm.get("adjust") == "bh" else "p_holm"
    for m, fit in lmm.get("fits", {}).items():
        if "error" in fit:
            lines.append(f"  LMM {m}: fit failed ({fit['error']})")
            continue
        for fe in fit["fixed"]:
            if fe["term"].startswith(f"{factor}[") and ":" not in fe["term"]:
                p_adj = lmm.get("adjusted", {}).get(m, {}).get(fe["term"], {}).get(key)
                flag = "" if fit.get("converged", True) else " [not converged: see the report's notes]"
                lines.append(f"  LMM {m}: {fe['term']} = {fe['estimate']:.4g} (p = {fe['p']:.3g}, "
                             f"adj. p = {p_adj:.3g}){flag}")
    return lines
