"""Multiple-comparison adjustments across metrics (R's ``p.adjust`` conventions).

Both wrap ``statsmodels.stats.multitest.multipletests`` (a well-kept implementation); tests
compare them with a direct transcription of R's ``p.adjust`` formulas:

    Holm (1979):   p_(i) -> max_{j <= i} min(1, (m - j + 1) p_(j))     (sorted ascending)
    BH (1995):     p_(i) -> min_{j >= i} min(1, m / j * p_(j))
NaN p-values are kept as NaN and excluded from m (as ``p.adjust`` does with ``n = sum(!is.na(p))``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _adjust(pvals: Sequence[float] | np.ndarray, method: str) -> np.ndarray:
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvals, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError("p-values must be a 1-d sequence")
    if np.any((p[np.isfinite(p)] < 0) | (p[np.isfinite(p)] > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    out = np.full_like(p, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method=method)[1]
    return out


def holm(pvals: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values (family-wise error rate)."""
    return _adjust(pvals, "holm")


def benjamini_hochberg(pvals: Sequence[float] | np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg step-up adjusted p-values (false discovery rate)."""
    return _adjust(pvals, "fdr_bh")
