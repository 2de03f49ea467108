"""How a verdict prints its numbers: p-values, percentages and CI ends.

One home for the sentence (:mod:`pcpo_eval.stats.verdict`), the speed-up table, the HTML report and the
console, so the same row never reads differently in two places. Two rules keep a printed number honest:

* a p-value gets more digits where rounding would carry it across alpha (0.04997 and 0.05003 both
  read "0.05" at three significant digits; beside alpha = 0.05 one is significant and one is not);
* a CI end gets more decimals until a non-zero end keeps its sign (a significant speed-up never reads
  "95% CI +0.0% to +71%").
"""

from __future__ import annotations

import math

import numpy as np

#: the most significant digits a p-value is printed with to keep its side of alpha
MAX_P_DIGITS = 8


def p_value(p: float, alpha: float = 0.05, digits: int = 3) -> str:
    """``p`` to ``digits`` significant digits, more where the printed number would fall on the other side of
    ``alpha`` than ``p`` (or on alpha itself when ``p`` is below it): 0.04997 -> '0.04997', 0.05003 -> '0.05'."""
    k = digits
    text = f"{p:.{k}g}"
    while k < MAX_P_DIGITS and (float(text) < alpha) != (p < alpha):
        k += 1
        text = f"{p:.{k}g}"
    return text


def _pct_decimals(x: float) -> int:
    return 1 if abs(x) < 0.1 else 0


def pct(x: float | None, missing: str = "?") -> str:
    """A fraction as a signed percentage: 0.254 -> '+25%', 0.035 -> '+3.5%'; None / NaN -> ``missing``."""
    if x is None or isinstance(x, bool) or not math.isfinite(float(x)):
        return missing
    x = float(x)
    return f"{x:+.{_pct_decimals(x)}%}"


def pct_end(x: float | None, missing: str = "?") -> str:
    """A CI end as :func:`pct`, with decimals added until a non-zero end keeps its sign (9.4e-05 ->
    '+0.01%', never '+0.0%')."""
    if x is None or isinstance(x, bool) or not math.isfinite(float(x)):
        return missing
    x = float(x)
    d = _pct_decimals(x)
    while d < 6 and x != 0 and round(100 * x, d) == 0:
        d += 1
    return f"{x:+.{d}%}"


def pct_interval(low: float | None, high: float | None, gap: tuple[float | None, float | None] | None = None,
                 unbounded: str = "unbounded") -> str:
    """A speed-up CI in %: 'lo to hi', or a two-piece Fieller set 'lo to a or b to hi' when ``gap`` holds
    its hole (:func:`pcpo_eval.stats.speedup.fieller_set`); a missing upper end reads ``unbounded``."""
    hi = pct_end(high, unbounded)
    if gap is not None and len(gap) == 2 and gap[0] is not None and gap[1] is not None:
        return f"{pct_end(low)} to {pct_end(gap[0])} or {pct_end(gap[1])} to {hi}"
    return f"{pct_end(low)} to {hi}"


def decimals(scale: float) -> int:
    """Decimals that show a quantity of size ``scale`` with about two significant digits."""
    if not np.isfinite(scale) or scale <= 0:
        return 3
    return int(np.clip(1 - np.floor(np.log10(scale)), 0, 6))


def ci_decimals(estimate: float, lo: float, hi: float) -> int:
    """Decimals for an estimate and its CI: about two significant digits of the CI's width, more until every
    non-zero end keeps its sign when printed (a significant CI never reads ``+0.00 to +0.11``)."""
    d = decimals(hi - lo)
    while d < 8 and any(x != 0 and round(x, d) == 0 for x in (estimate, lo, hi)):
        d += 1
    return d
