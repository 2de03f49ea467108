"""Reward against the KL to the reference policy, as the paper's Fig. sd3_flowgrpo_results (c, d).

"the KL divergence is plotted using a rolling mean of all estimated values up to the current epoch"
(pcpo-paper.tex l.1304-1307): x = the running (expanding) mean of the logged ``kl_ref`` (the
trainer's per-epoch mean KL of the policy to the reference, base model; logged when ``beta_kl`` > 0),
y = the epoch's reward (the held-out validation reward where the run logs it, as panels (a, b),
else the training reward smoothed with the study's window). One line per run, one panel per cell.
This is not the PPO ``approx_kl`` (policy to the sampling policy), which the report plots separately.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def running_mean(values: Sequence[Any]) -> list[float]:
    """Expanding mean of the finite values up to each epoch (NaN until the first finite value)."""
    out, total, n = [], 0.0, 0
    for v in values:
        x = float("nan") if v is None else float(v)
        if math.isfinite(x):
            total, n = total + x, n + 1
        out.append(total / n if n else float("nan"))
    return out


def _points(t: dict[str, Any]) -> tuple[list[float], list[float], str]:
    kl = t.get("kl_ref_running_mean") or running_mean(t.get("kl_ref") or [])
    val = t.get("val_reward_mean") or []
    if any(v is not None and math.isfinite(float(v)) for v in val):
        ys, label = val, "validation reward"
    else:
        ys, label = t.get("reward_smoothed") or t.get("reward_mean") or [], "training reward (smoothed)"
    pts = [(float(x), float(y)) for x, y in zip(kl, ys, strict=False)
           if x is not None and y is not None and math.isfinite(float(x)) and math.isfinite(float(y))]
    return [p[0] for p in pts], [p[1] for p in pts], label


def kl_ref_figure(traces: list[dict[str, Any]]) -> Any:
    """The figure (matplotlib; paper sizes and fonts of :mod:`pcpo_eval.report.figures`), or None
    when no run logs ``kl_ref``."""
    from pcpo_eval.report.figures import paper_style

    return paper_style(_draw)(traces)


def _draw(traces: list[dict[str, Any]]) -> Any:
    from pcpo_eval.report.figures import _legend, color, mpl_text, panel_grid, panel_title

    have = [t for t in traces if any(v is not None and math.isfinite(float(v)) for v in t.get("kl_ref") or [])]
    if not have:
        return None
    cells = list(dict.fromkeys(str(t.get("cell", "")) for t in have))
    fig, panels = panel_grid(len(cells))
    for (ax,), cell in zip(panels, cells, strict=True):
        label = ""
        for t in (t for t in have if str(t.get("cell", "")) == cell):
            xs, ys, label = _points(t)
            ax.plot(xs, ys, color=color(str(t.get("role", "other"))), marker=".", ms=3,
                    label=mpl_text(t.get("run", "")))
        ax.set(title=panel_title("reward vs KL to the reference", cell),
               xlabel="KL to the reference (running mean)", ylabel=label)
        _legend(ax)
    fig.tight_layout()
    return fig


def kl_ref_png(traces: list[dict[str, Any]]) -> bytes | None:
    """:func:`kl_ref_figure` as PNG bytes (None without ``kl_ref``)."""
    import io

    fig = kl_ref_figure(traces)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
