"""Paper figure files: the sizes, fonts and formats every figure of the package is written in.

A ground-floor module (no pipeline imports) so that any stage can write paper figures: the
report (:mod:`pcpo_eval.report.figures`) and the credit-weight figure (:mod:`pcpo_eval.credit.plot`,
ranked below the report) use the same :data:`PAPER_RC` and :func:`save_figure`.

Conventions (issue 29): widths for a two-column paper (:data:`SINGLE_COLUMN_IN` = 3.3 in for one
panel, :data:`DOUBLE_COLUMN_IN` = 6.8 in for several), fonts >= 7 pt, text kept as text in SVG and
TrueType (Type 42) fonts in PDF, no timestamps (files repeat byte for byte); each figure is written
as SVG and PDF (vector) and a 300-dpi PNG.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

#: Figure widths (inches) of a two-column paper: one column, and the full text width.
SINGLE_COLUMN_IN, DOUBLE_COLUMN_IN = 3.3, 6.8
#: Files :func:`save_figure` writes per figure, and the PNG resolution.
FORMATS = ("svg", "pdf", "png")
PNG_DPI = 300
#: matplotlib settings of every paper figure: >= 7 pt text, thin lines, editable text in SVG,
#: TrueType fonts in PDF (journals reject Type 3), no timestamps (files repeat byte for byte).
PAPER_RC: dict[str, Any] = {
    "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
    "legend.fontsize": 7, "legend.frameon": False, "lines.linewidth": 1.2, "lines.markersize": 3,
    "axes.linewidth": 0.6, "savefig.bbox": "tight", "savefig.pad_inches": 0.02,
    "svg.fonttype": "none", "svg.hashsalt": "pcpo-eval", "pdf.fonttype": 42,
}  # fmt: skip


def figure_bytes(fig: Any, fmt: str, dpi: int = PNG_DPI) -> bytes:
    """``fig`` saved as ``fmt`` (svg | pdf | png) under :data:`PAPER_RC`, without a date stamp."""
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context(PAPER_RC):
        fig.savefig(buf, format=fmt, dpi=dpi, metadata={"Date": None} if fmt in ("svg", "pdf") else None)
    return buf.getvalue()


#: Environment variable naming a subset of :data:`FORMATS` to write (comma-separated), e.g. ``png`` to
#: skip the vector files (an SVG plus a PDF: ~0.6 s per figure on 2 cores, benchmarks/bench_figure_formats.py).
FORMATS_ENV = "PCPO_EVAL_FIGURE_FORMATS"


def figure_formats() -> tuple[str, ...]:
    """:data:`FORMATS`, or the subset ``$PCPO_EVAL_FIGURE_FORMATS`` names (unknown names are an error)."""
    import os

    from pcpo_eval.errors import UserError

    raw = os.environ.get(FORMATS_ENV, "").strip()
    if not raw:
        return FORMATS
    asked = tuple(f.strip().lower() for f in raw.split(",") if f.strip())
    bad = [f for f in asked if f not in FORMATS]
    if bad or not asked:
        raise UserError(f"{FORMATS_ENV}={raw!r}: use a comma-separated subset of {', '.join(FORMATS)}")
    return tuple(f for f in FORMATS if f in asked)


def save_figure(fig: Any, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name.svg``, ``name.pdf`` and a 300-dpi ``name.png`` under ``out_dir`` (figure kept open);
    only the formats of ``$PCPO_EVAL_FIGURE_FORMATS`` when it is set (:func:`figure_formats`)."""
    from pcpo_eval.io import atomic_write_bytes

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in figure_formats():
        path = out / f"{name}.{fmt}"
        atomic_write_bytes(path, figure_bytes(fig, fmt))
        paths.append(path)
    return paths
