"""lme4 model formulas: ``value ~ a * b + (1|prompt)`` -> fixed part, groupings, random slopes."""

from __future__ import annotations

import re


def parse_lmm_formula(formula: str) -> tuple[str, list[str], str | None]:
    """Split lme4 syntax into (fixed formula, grouping columns, random-slopes formula).

    ``value ~ a * b + (1|prompt)`` -> (``value ~ a * b``, [``prompt``], None);
    ``(1|prompt) + (1|seed)`` -> crossed intercepts; ``(x|g)`` -> random slopes ``~x`` on ``g``.
    """
    random = re.findall(r"\(\s*([^()|]+?)\s*\|\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", formula)
    fixed = re.sub(r"\+?\s*\(\s*[^()|]+?\s*\|\s*[A-Za-z_][A-Za-z0-9_]*\s*\)", "", formula).strip()
    fixed = re.sub(r"\s*\+\s*$", "", fixed)
    groups = [g for _, g in random]
    slopes = [s.strip() for s, _ in random if s.strip() not in ("1",)]
    re_formula = f"~{slopes[0]}" if slopes else None
    return fixed, groups, re_formula
