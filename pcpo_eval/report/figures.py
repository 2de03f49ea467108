"""The report's plots: matplotlib (Agg) figures returned as ``data:image/png;base64`` URIs.

Plotting only. The one aggregation done here is for drawing: a curve "mean over seeds" with a
min-max band is the pointwise mean / min / max of the per-run values logged at the same epoch
(the figure captions say so); no test statistic, interval or p-value is computed here, those come
from ``results.json``. Figures follow the paper's conventions: Fig. 5 (reward and clip fraction
per epoch; the held-out validation reward), the appendix rho and first-layer |g| plots, the ratio
diagnostics (Taylor error of log rho ~ rho - 1 and the |dot| / squared-norm ratio of Eq. Delta per
update, Fig. on-policy-justification) and Q-Q plots of the LMM residuals.

User text (run, cell and arm names) reaches matplotlib only through :func:`mpl_text`, which escapes
``$`` so a name can never be parsed as mathtext (a malformed ``$...$`` would make ``savefig`` fail).
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any

BASELINE_COLOR, PCPO_COLOR, OTHER_COLOR = "tab:blue", "tab:orange", "tab:gray"
#: Roles an arm can take in the plots (colour and legend order).
ROLE_ORDER = {"baseline": 0, "pcpo": 1, "other": 2}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig_uri(fig: Any, dpi: int = 96) -> str:
    """A matplotlib figure as a ``data:image/png;base64`` URI (figure closed)."""
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def mpl_text(s: Any) -> str:
    """User text as a literal matplotlib label (``$`` escaped: never mathtext)."""
    return str(s).replace("$", r"\$")


def color(role: str) -> str:
    """Paper colours: baseline blue, PCPO orange, anything else gray."""
    return {"baseline": BASELINE_COLOR, "pcpo": PCPO_COLOR}.get(role, OTHER_COLOR)


def finite(values: Sequence[Any] | None) -> list[float]:
    """JSON numbers with ``null`` (NaN/inf written by ``to_jsonable``) as NaN, for plotting."""
    return [float(v) if v is not None else math.nan for v in (values or [])]


def _cells(items: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(t["cell"]) for t in items))


def _axes_per_cell(n: int, height: float) -> tuple[Any, list[Any]]:
    plt = _plt()
    fig, axes = plt.subplots(1, n, figsize=(4.6 * n, height), squeeze=False)
    return fig, list(axes[0])


# ------------------------------------------------------------------------------------------------
# Fig. 5 style traces (from results["traces"]): smoothed reward, clip fraction, rho, |g|
# ------------------------------------------------------------------------------------------------


def traces_plot(traces: list[dict[str, Any]], window: int) -> str | None:
    """Fig. 5 style: smoothed reward (top) and clip fraction (bottom), one column per cell."""
    if not traces:
        return None
    plt = _plt()
    cells = _cells(traces)
    fig, axes = plt.subplots(2, len(cells), figsize=(4.6 * len(cells), 6), squeeze=False)
    for j, cell in enumerate(cells):
        for t in (t for t in traces if t["cell"] == cell):
            c = color(t["role"])
            ax = axes[0][j]
            ax.plot(t["epoch"], finite(t["reward_mean"]), color=c, alpha=0.25, lw=0.8)
            ax.plot(t["epoch"], finite(t["reward_smoothed"]), color=c, lw=1.8, label=mpl_text(t["run"]))
            if "clipfrac_smoothed" in t:
                axes[1][j].plot(t["epoch"], finite(t["clipfrac_smoothed"]), color=c, lw=1.8)
        axes[0][j].set(title=mpl_text(f"{cell}: reward (window {window})"), xlabel="epoch", ylabel="reward")
        axes[1][j].set(title="clip fraction (smoothed)", xlabel="epoch", ylabel="clip fraction")
        axes[0][j].legend(fontsize=6)
    fig.tight_layout()
    return fig_uri(fig)


def rho_plot(traces: list[dict[str, Any]]) -> str | None:
    """Policy ratio rho per epoch: mean +- SD band, min / max dashed (from the run logs)."""
    have = [t for t in traces if "rho_mean" in t]
    if not have:
        return None
    cells = _cells(have)
    fig, axes = _axes_per_cell(len(cells), 3.4)
    for ax, cell in zip(axes, cells, strict=True):
        for t in (t for t in have if t["cell"] == cell):
            c = color(t["role"])
            ep = t["epoch"]
            m = finite(t["rho_mean"])
            s = finite(t.get("rho_std")) or [0.0] * len(m)
            ax.plot(ep, m, color=c, lw=1.5, label=mpl_text(t["run"]))
            ax.fill_between(ep, [a - b for a, b in zip(m, s, strict=True)], [a + b for a, b in zip(m, s, strict=True)],
                            color=c, alpha=0.2)
            for k in ("rho_min", "rho_max"):
                if k in t:
                    ax.plot(ep, finite(t[k]), color=c, lw=0.7, ls="--")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set(title=mpl_text(f"{cell}: rho (mean ± SD; min/max dashed)"), xlabel="epoch", ylabel="rho")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig_uri(fig)


def grad_plot(traces: list[dict[str, Any]]) -> str | None:
    """First-layer |g| mean and variance per epoch (log scale)."""
    have = [t for t in traces if "grad_first_abs_mean" in t]
    if not have:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.4))
    for t in have:
        c = color(t["role"])
        ls = "-" if t["cell"] == have[0]["cell"] else "--"
        axes[0].plot(t["epoch"], finite(t["grad_first_abs_mean"]), color=c, ls=ls, label=mpl_text(t["run"]))
        if "grad_first_abs_var" in t:
            axes[1].plot(t["epoch"], finite(t["grad_first_abs_var"]), color=c, ls=ls)
    axes[0].set(title="mean |g| (first layer)", xlabel="epoch", yscale="log")
    axes[1].set(title="var |g| (first layer)", xlabel="epoch", yscale="log")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    return fig_uri(fig)


def qq_plot(fit: dict[str, Any], label: str) -> str | None:
    """Normal Q-Q plot of the standardized conditional residuals stored with an LMM fit."""
    dg = fit.get("diagnostics")
    if not dg or not dg.get("qq_theoretical"):
        return None
    plt = _plt()
    x, y = dg["qq_theoretical"], dg["qq_sample"]
    fig, ax = plt.subplots(figsize=(3.0, 3.0))
    ax.scatter(x, y, s=5)
    lo, hi = min(x[0], y[0]), max(x[-1], y[-1])
    ax.plot([lo, hi], [lo, hi], color="gray", lw=1)
    r = dg.get("qq_r")
    ax.set(title=mpl_text(f"{label}: Q-Q" + (f" (r = {r:.3f})" if r is not None else "")),
           xlabel="normal quantiles", ylabel="std. residuals")
    fig.tight_layout()
    return fig_uri(fig, dpi=80)


# ------------------------------------------------------------------------------------------------
# per-run curves (from results["runs"]): mean over seeds per arm, min-max band, controls dashed
# ------------------------------------------------------------------------------------------------


def by_epoch(runs: list[dict[str, Any]], key: str) -> dict[Any, list[float]]:
    """``{epoch: [value of each run that logged a finite value at that epoch]}``, epochs sorted."""
    out: dict[Any, list[float]] = {}
    for r in runs:
        for e, v in zip(r.get("epochs") or [], finite(r.get(key)), strict=False):
            if math.isfinite(v):
                out.setdefault(e, []).append(v)
    return dict(sorted(out.items()))


def seed_band(runs: list[dict[str, Any]], key: str, x_key: str | None = None) -> dict[str, list[float]]:
    """Pointwise mean, min and max over seeds of ``key`` per epoch (drawing aid, see the module doc).

    ``x`` is the epoch, or with ``x_key`` (e.g. ``wall_time_s``) the mean of that column over the
    same runs at that epoch; epochs where ``x_key`` is missing are dropped.
    """
    ys = by_epoch(runs, key)
    xs = by_epoch(runs, x_key) if x_key else {e: [float(e)] for e in ys}
    keep = [e for e in ys if e in xs]
    return {"x": [sum(xs[e]) / len(xs[e]) for e in keep], "mean": [sum(ys[e]) / len(ys[e]) for e in keep],
            "lo": [min(ys[e]) for e in keep], "hi": [max(ys[e]) for e in keep]}


def _arms(runs: list[dict[str, Any]], roles: dict[str, str]) -> list[str]:
    arms = list(dict.fromkeys(str(r.get("arm", "")) for r in runs))
    return sorted(arms, key=lambda a: ROLE_ORDER.get(roles.get(a, "other"), 2))


def reward_curves_plot(runs: list[dict[str, Any]], roles: dict[str, str], wall_clock: bool = False) -> str | None:
    """Reward per epoch (or per cumulative wall-clock second): per arm the mean over seeds with a
    min-max band over seeds, and the paired untrained controls (same prompts and seeds) dashed."""
    if not runs:
        return None
    x_key = "wall_time_s" if wall_clock else None
    cells = _cells(runs)
    fig, axes = _axes_per_cell(len(cells), 3.6)
    for ax, cell in zip(axes, cells, strict=True):
        here = [r for r in runs if str(r["cell"]) == cell]
        for arm in _arms(here, roles):
            mine = [r for r in here if str(r.get("arm", "")) == arm]
            c = color(roles.get(arm, "other"))
            b = seed_band(mine, "reward_mean", x_key)
            ax.fill_between(b["x"], b["lo"], b["hi"], color=c, alpha=0.2, lw=0)
            ax.plot(b["x"], b["mean"], color=c, lw=1.8, label=mpl_text(f"{arm} ({len(mine)} seeds)"))
            ctl = seed_band(mine, "control_reward_mean", x_key)
            if ctl["x"]:
                ax.plot(ctl["x"], ctl["mean"], color=c, lw=1.2, ls="--", label=mpl_text(f"{arm}: untrained control"))
        ax.set(title=mpl_text(cell), xlabel="compute time (s)" if wall_clock else "epoch", ylabel="reward")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig_uri(fig)


def kl_reward_plot(runs: list[dict[str, Any]], roles: dict[str, str]) -> str | None:
    """Reward against the PPO approx. KL of each epoch, one line per run (how much policy change
    each arm spends per unit of reward)."""
    have = [r for r in runs if r.get("approx_kl")]
    if not have:
        return None
    cells = _cells(have)
    fig, axes = _axes_per_cell(len(cells), 3.6)
    for ax, cell in zip(axes, cells, strict=True):
        labelled: set[str] = set()
        for r in (r for r in have if str(r["cell"]) == cell):
            arm = str(r.get("arm", ""))
            ax.plot(finite(r["approx_kl"]), finite(r.get("reward_mean")), color=color(roles.get(arm, "other")),
                    lw=0.8, marker="o", ms=2.5, alpha=0.8, label=None if arm in labelled else mpl_text(arm))
            labelled.add(arm)
        ax.set(title=mpl_text(cell), xlabel="approx. KL (per epoch)", ylabel="reward")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig_uri(fig)


# ------------------------------------------------------------------------------------------------
# diagnostics of ``diagnostics: true`` / ``validation_every`` runs (from results["traces"])
# ------------------------------------------------------------------------------------------------


def _as_runs(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Traces in the shape :func:`seed_band` reads (``epochs``; ``arm`` defaults to the role)."""
    return [{**t, "epochs": t.get("epoch") or [], "arm": str(t.get("arm") or t.get("role", ""))} for t in traces]


def validation_plot(traces: list[dict[str, Any]], roles: dict[str, str]) -> str | None:
    """Held-out validation reward per epoch (paper Fig. 5; Flow-GRPO's eval): per arm the mean over
    seeds with a min-max band over seeds, the untrained model on the same images dashed."""
    runs = [r for r in _as_runs(traces) if any(v is not None and math.isfinite(v) for v in finite(r.get("val_reward_mean")))]
    if not runs:
        return None
    cells = _cells(runs)
    fig, axes = _axes_per_cell(len(cells), 3.6)
    for ax, cell in zip(axes, cells, strict=True):
        here = [r for r in runs if str(r["cell"]) == cell]
        for arm in _arms(here, roles):
            mine = [r for r in here if r["arm"] == arm]
            c = color(roles.get(arm, mine[0].get("role", "other")))
            b = seed_band(mine, "val_reward_mean")
            ax.fill_between(b["x"], b["lo"], b["hi"], color=c, alpha=0.2, lw=0)
            ax.plot(b["x"], b["mean"], color=c, lw=1.8, marker="o", ms=3, label=mpl_text(f"{arm} ({len(mine)} seeds)"))
            ctl = seed_band(mine, "val_control_reward_mean")
            if ctl["x"]:
                ax.plot(ctl["x"], ctl["mean"], color=c, lw=1.2, ls="--", label=mpl_text(f"{arm}: untrained"))
        ax.set(title=mpl_text(f"{cell}: held-out validation reward"), xlabel="epoch", ylabel="validation reward")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig_uri(fig)


def per_update_series(trace: dict[str, Any], key: str) -> tuple[list[float], list[float]]:
    """(x, y) of a per-update list column: x = epoch - 1 + (u + 0.5) / (updates in that epoch)."""
    xs: list[float] = []
    ys: list[float] = []
    for e, vals in zip(trace.get("epoch") or [], trace.get(key) or [], strict=False):
        vals = finite(vals)
        xs += [e - 1 + (u + 0.5) / len(vals) for u in range(len(vals))]
        ys += vals
    return xs, ys


def diagnostics_plot(traces: list[dict[str, Any]]) -> str | None:
    """Per update, one line per run: the maximum relative Taylor error of log rho ~ rho - 1 (App.
    "Soundness": the paper reports <= 1.2%) and the |dot| / squared-norm ratio of Eq. Delta (Fig.
    on-policy-justification; at update 0 of an epoch both terms vanish, so it starts at update 1)."""
    keys = [("taylor_rel_err_per_update", "max relative Taylor error of log rho ~ rho - 1"),
            ("delta_ratio_per_update", "|dot| / squared norm (Eq. Delta)")]
    have = [t for t in traces if any(t.get(k) for k, _ in keys)]
    if not have:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.4))
    for ax, (key, title) in zip(axes, keys, strict=True):
        for t in have:
            x, y = per_update_series(t, key)
            pos = [(a, b) for a, b in zip(x, y, strict=True) if math.isfinite(b) and b > 0]
            if pos:
                ax.plot(*zip(*pos, strict=True), color=color(t.get("role", "other")), lw=0.8, marker=".", ms=3,
                        label=mpl_text(t["run"]))
        if not ax.lines:  # every value missing (NaN: e.g. only on-policy updates for the ratio) or 0
            ax.text(0.5, 0.5, "no positive finite value logged", transform=ax.transAxes, ha="center", fontsize=8)
        ax.set(title=title, xlabel="epoch (per update)", yscale="log")
    if axes[0].lines or axes[1].lines:
        (axes[0] if axes[0].lines else axes[1]).legend(fontsize=6)
    axes[0].axhline(0.012, color="black", lw=0.6, ls=":")
    axes[1].axhline(1.0, color="black", lw=0.6, ls=":")
    fig.tight_layout()
    return fig_uri(fig)
