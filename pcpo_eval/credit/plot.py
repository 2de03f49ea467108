"""Redraw the paper's Figure 2 (a)-(d): native vs PCPO credit weights (matplotlib, Agg)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from pcpo_eval.credit.ddim import DDIMCredit, ddim_schedule, pcpo_ddim_credit
from pcpo_eval.credit.flow import FlowCredit, flow_credit
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

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
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
    ax.legend(fontsize=7)

    ax = axes[1]
    ax.plot(ts, ddim.sigma, color=NATIVE, label="DDIM sigma_t")
    for w, col in ((4.0, "tab:cyan"), (None, "olive"), (5.0, "gray")):
        c = pcpo_ddim_credit(ddim.schedule, ddim.convention, w, ddim.fallback)  # type: ignore[arg-type]
        ax.plot(ts, c.pcpo_sigma, color=col, ls="--", label=f"sigma~ (w*={c.w_target:.2f})")
    ax.invert_xaxis()
    ax.set(title="(b) DDIM variance schedule", xlabel="timestep t", ylabel="sigma")
    ax.legend(fontsize=7)

    for ax, f, title in ((axes[2], dance, "(c) DanceGRPO SDE"), (axes[3], fgrpo, "(d) Flow-GRPO SDE")):
        ax.plot(f.t, f.native_weight, "o-", color=NATIVE, ms=3, label="native w(t_i)")
        ax.plot(f.t, f.pcpo_weight, "o-", color=PCPO, ms=3, label=f"zeta*dt (zeta={f.zeta:.3f})")
        ax.invert_xaxis()
        ax.set(title=f"{title} N={len(f.t)} eta={f.eta}", xlabel="t", ylabel="weight")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def credit_figure_png(ddim: DDIMCredit | None = None, flows: list[FlowCredit] | None = None) -> bytes:
    """Figure 2 as PNG bytes (for the HTML report)."""
    import matplotlib.pyplot as plt

    fig = credit_figure(ddim, flows)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def save_credit_figure(path: str | Path, ddim: DDIMCredit | None = None, flows: list[FlowCredit] | None = None) -> Path:
    """Write Figure 2 (a)-(d) to ``path`` (PNG) atomically."""
    path = Path(path)
    atomic_write_bytes(path, credit_figure_png(ddim, flows))
    return path
