"""Redraw the paper's Figure 2 (a)-(d): native vs PCPO credit weights (matplotlib, Agg).

Drawn at the report's paper size and fonts (:mod:`pcpo_eval.figfiles`: full text width, >= 7 pt)
and written as SVG + PDF + 300-dpi PNG (:func:`save_credit_figure`) like every report figure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pcpo_eval.credit.ddim import DDIMCredit, ddim_schedule, pcpo_ddim_credit
from pcpo_eval.credit.flow import FlowCredit, flow_credit
from pcpo_eval.figfiles import DOUBLE_COLUMN_IN, PAPER_RC, figure_bytes, figure_formats
from pcpo_eval.io import atomic_write_bytes

NATIVE, PCPO = "tab:blue", "tab:orange"


def credit_figure(ddim: DDIMCredit | None = None, flows: list[FlowCredit] | None = None):
    """Figure 2: (a) DDIM weights, (b) sigma schedules for w* in {4.0, mean, 5.0}, (c) DanceGRPO, (d) Flow-GRPO.

    Panels not given default to the paper's settings (SD-1.x 50 DDIM steps eta 1, residual
    convention; DanceGRPO N=16 eta=0.3 shift 3; Flow-GRPO N=10 eta=0.7 shift 3).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if ddim is None:
        ddim = pcpo_ddim_credit(ddim_schedule(None, 50, 1.0), "residual")
    by_sde = {f.sde: f for f in (flows or [])}
    dance = by_sde.get("dance") or flow_credit("dance", 16, 0.3, 3.0)
    fgrpo = by_sde.get("flowgrpo") or flow_credit("flowgrpo", 10, 0.7, 3.0)

    with matplotlib.rc_context(PAPER_RC):  # fonts are fixed when the text is created
        fig, axes = plt.subplots(2, 2, figsize=(DOUBLE_COLUMN_IN, 4.6))
        _draw_panels(list(axes.flat), ddim, dance, fgrpo)
        fig.tight_layout()
    return fig


def _draw_panels(axes: list, ddim: DDIMCredit, dance: FlowCredit, fgrpo: FlowCredit) -> None:
    ts = ddim.schedule.timesteps
    ax = axes[0]
    ax.plot(ts, ddim.native_weight, color=NATIVE, label="native w(t)")
    ax.plot(ts, ddim.effective_weight, color=PCPO, label=f"PCPO (w*={ddim.w_target:.2f})")
    if ddim.fallback_steps:
        fb = np.asarray(ddim.fallback_steps)
        ax.scatter(ts[fb], ddim.effective_weight[fb], color="red", marker="x", zorder=3,
                   label=f"fallback ({ddim.fallback})")
    ax.set_yscale("log")
    ax.invert_xaxis()
    ax.set(title=f"(a) DDIM weights [{ddim.convention}]", xlabel="timestep t", ylabel="weight")
    ax.legend()

    ax = axes[1]
    ax.plot(ts, ddim.sigma, color=NATIVE, label="DDIM sigma_t")
    for w, col in ((4.0, "tab:cyan"), (None, "olive"), (5.0, "gray")):
        c = pcpo_ddim_credit(ddim.schedule, ddim.convention, w, ddim.fallback)  # type: ignore[arg-type]
        ax.plot(ts, c.pcpo_sigma, color=col, ls="--", label=f"sigma~ (w*={c.w_target:.2f})")
    ax.invert_xaxis()
    ax.set(title="(b) DDIM variance schedule", xlabel="timestep t", ylabel="sigma")
    ax.legend()

    for ax, f, title in ((axes[2], dance, "(c) DanceGRPO SDE"), (axes[3], fgrpo, "(d) Flow-GRPO SDE")):
        ax.plot(f.t, f.native_weight, "o-", color=NATIVE, ms=3, label="native w(t_i)")
        ax.plot(f.t, f.pcpo_weight, "o-", color=PCPO, ms=3, label=f"zeta*dt (zeta={f.zeta:.3f})")
        ax.invert_xaxis()
        ax.set(title=f"{title} N={len(f.t)} eta={f.eta}", xlabel="t", ylabel="weight")
        ax.legend()


def credit_figure_files(ddim: DDIMCredit | None = None, flows: list[FlowCredit] | None = None,
                        formats: tuple[str, ...] | None = None) -> dict[str, bytes]:
    """Figure 2 as paper files: ``{"svg": ..., "pdf": ..., "png": ...}`` (PNG at 300 dpi; the formats of
    :func:`~pcpo_eval.figfiles.figure_formats`)."""
    import matplotlib.pyplot as plt

    fig = credit_figure(ddim, flows)
    try:
        return {fmt: figure_bytes(fig, fmt) for fmt in (figure_formats() if formats is None else formats)}
    finally:
        plt.close(fig)


def credit_figure_png(ddim: DDIMCredit | None = None, flows: list[FlowCredit] | None = None) -> bytes:
    """Figure 2 as 300-dpi PNG bytes."""
    import matplotlib.pyplot as plt

    fig = credit_figure(ddim, flows)
    try:
        return figure_bytes(fig, "png")
    finally:
        plt.close(fig)


def save_credit_figure(path: str | Path, ddim: DDIMCredit | None = None, flows: list[FlowCredit] | None = None) -> Path:
    """Write Figure 2 (a)-(d) to ``path`` (a 300-dpi PNG) and, beside it, ``.svg`` and ``.pdf`` (atomic each).

    ``path`` keeps whatever suffix it has (the PNG bytes go there); the vector files take its stem.
    """
    path = Path(path)
    vector = tuple(f for f in figure_formats() if f != "png")
    files = credit_figure_files(ddim, flows, ("png", *vector))
    atomic_write_bytes(path, files["png"])
    for fmt in vector:
        atomic_write_bytes(path.with_suffix(f".{fmt}"), files[fmt])
    return path
