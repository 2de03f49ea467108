"""The report's plots: matplotlib (Agg) figures, embedded as ``data:image/png;base64`` URIs and
written as paper files (SVG and PDF vector, 300-dpi PNG) by :func:`save_figure`.

Paper conventions (issue 29): widths for a two-column paper (:data:`SINGLE_COLUMN_IN` = 3.3 in
for one panel, :data:`DOUBLE_COLUMN_IN` = 6.8 in for several), fonts >= 7 pt
(:data:`PAPER_RC`), text kept as text in SVG and TrueType (Type 42) fonts in PDF, panel titles
that say what is plotted (a study's single cell, named ``all``, is not repeated in them).

Plotting only, with one exception, a drawing aid: a curve "mean over seeds" with a min-max band is
the pointwise mean / min / max of the per-run values logged at the same epoch (the figure captions
say so). The rliable panels (Agarwal et al. 2021, "Deep RL at the edge of the statistical
precipice": interval estimates, probability of improvement, performance profiles) draw the numbers
the stats stage wrote to ``results.json`` ``rliable`` (:mod:`pcpo_eval.stats.rliable`: each run
reduced by the verdict's own function, bootstrap intervals with a fixed seed); an older results.json
without them has no such panels. Every test statistic, interval and p-value comes from
``results.json``. Figures follow the paper's conventions: Fig. 3 (reward and clip fraction per
epoch; the held-out validation reward), the appendix rho and first-layer |g| plots, the ratio
diagnostics (Taylor error of log rho ~ rho - 1 and the |dot| / squared-norm ratio of Eq. Delta per
update, Fig. on-policy-justification) and Q-Q plots of the LMM residuals.

Each ``*_figure`` function returns a matplotlib figure (or None when its data is absent);
:func:`fig_uri` makes it a PNG data URI for the HTML report.

User text (run, cell and arm names) reaches matplotlib only through :func:`mpl_text`, which escapes
``$`` so a name can never be parsed as mathtext (a malformed ``$...$`` would make ``savefig`` fail).
"""

from __future__ import annotations

import base64
import functools
import io
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from pcpo_eval.figfiles import (  # noqa: F401 (FORMATS, PNG_DPI, save_figure: re-exported for the report)
    DOUBLE_COLUMN_IN,
    FORMATS,
    PAPER_RC,
    PNG_DPI,
    SINGLE_COLUMN_IN,
    save_figure,
)
from pcpo_eval.studydir import RUN_COMPUTE_KEY

BASELINE_COLOR, PCPO_COLOR, OTHER_COLOR = "tab:blue", "tab:orange", "tab:gray"
#: Roles an arm can take in the plots (colour and legend order).
ROLE_ORDER = {"baseline": 0, "pcpo": 1, "other": 2}
#: Paper sizes, fonts and file formats live in the ground-floor :mod:`pcpo_eval.figfiles` (shared
#: with the credit figure); re-exported here.
#: Resolution of the PNGs embedded in the HTML report.
HTML_DPI = 120


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def paper_style(build: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: build the figure under :data:`PAPER_RC` (fonts are fixed when text is created)."""

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        _plt()
        with matplotlib.rc_context(PAPER_RC):
            return build(*args, **kwargs)

    return wrapper


def fig_uri(fig: Any, dpi: int = HTML_DPI, close: bool = True) -> str:
    """A matplotlib figure as a ``data:image/png;base64`` URI (closed unless ``close=False``)."""
    import matplotlib

    plt = _plt()
    buf = io.BytesIO()
    with matplotlib.rc_context(PAPER_RC):
        fig.savefig(buf, format="png", dpi=dpi)
    if close:
        plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")



def figure_name(text: str) -> str:
    """A file-name stem from user text (``qq_<metric>``): letters, digits, ``.-_`` only."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "figure"


def mpl_text(s: Any) -> str:
    """User text as a literal matplotlib label (``$`` escaped: never mathtext)."""
    return str(s).replace("$", r"\$")


def color(role: str) -> str:
    """Paper colours: baseline blue, PCPO orange, anything else gray."""
    return {"baseline": BASELINE_COLOR, "pcpo": PCPO_COLOR}.get(role, OTHER_COLOR)


def finite(values: Sequence[Any] | None) -> list[float]:
    """JSON numbers with ``null`` (NaN/inf written by ``to_jsonable``) as NaN, for plotting."""
    return [float(v) if v is not None else math.nan for v in (values or [])]


def panel_title(what: str, cell: Any = "") -> str:
    """``what`` plus the cell it shows (``batch=16: reward per epoch``); a study's only cell,
    ``all``, is left out (a panel titled "all" says nothing)."""
    cell = str(cell)
    return mpl_text(what if cell in ("", "all") else f"{cell}: {what}")


def _cells(items: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(t["cell"]) for t in items))


def panel_grid(n: int, panel_height: float = 2.3, rows_per_panel: int = 1) -> tuple[Any, list[list[Any]]]:
    """A figure for ``n`` panels, at most 3 per row: one column wide (3.3 in) for one panel, the text
    width (6.8 in) otherwise. Returns the figure and, per panel, its ``rows_per_panel`` axes."""
    plt = _plt()
    ncols = max(1, min(n, 3))
    nrows = math.ceil(max(n, 1) / ncols)
    width = SINGLE_COLUMN_IN if n == 1 else DOUBLE_COLUMN_IN
    fig, axes = plt.subplots(nrows * rows_per_panel, ncols, squeeze=False,
                             figsize=(width, panel_height * nrows * rows_per_panel))
    panels = [[axes[(j // ncols) * rows_per_panel + r][j % ncols] for r in range(rows_per_panel)] for j in range(n)]
    for j in range(n, nrows * ncols):  # unused slots of the last row
        for r in range(rows_per_panel):
            axes[(j // ncols) * rows_per_panel + r][j % ncols].set_visible(False)
    return fig, panels


def _axes_per_cell(n: int, height: float = 2.3) -> tuple[Any, list[Any]]:
    fig, panels = panel_grid(n, height)
    return fig, [p[0] for p in panels]


def _legend(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", handlelength=1.5)


# ------------------------------------------------------------------------------------------------
# Fig. 3 (fig:reward-traj-comparison) style traces (from results["traces"]): smoothed reward, clip fraction, rho, |g|
# ------------------------------------------------------------------------------------------------


@paper_style
def traces_figure(traces: list[dict[str, Any]], window: int) -> Any:
    """Fig. 3 style: smoothed reward (top) and clip fraction (bottom), one column per cell."""
    if not traces:
        return None
    cells = _cells(traces)
    fig, panels = panel_grid(len(cells), 2.0, rows_per_panel=2)
    for (top, bottom), cell in zip(panels, cells, strict=True):
        for t in (t for t in traces if t["cell"] == cell):
            c = color(t["role"])
            top.plot(t["epoch"], finite(t["reward_mean"]), color=c, alpha=0.25, lw=0.6)
            top.plot(t["epoch"], finite(t["reward_smoothed"]), color=c, label=mpl_text(t["run"]))
            if "clipfrac_smoothed" in t:
                bottom.plot(t["epoch"], finite(t["clipfrac_smoothed"]), color=c)
        top.set(title=panel_title(f"reward (moving average, {window} epochs)", cell), xlabel="epoch", ylabel="reward")
        bottom.set(title=panel_title("clip fraction (moving average)", cell), xlabel="epoch", ylabel="clip fraction")
        _legend(top)
    fig.tight_layout()
    return fig


#: Epochs of the close-up of the first training epochs (Fig. ablations-aes (b): "the initial 20 steps").
CLOSEUP_EPOCHS = 20


@paper_style
def closeup_figure(traces: list[dict[str, Any]], n_epochs: int = CLOSEUP_EPOCHS) -> Any:
    """Fig. ablations-aes (b): the first ``n_epochs`` logged epochs of each run, unsmoothed: the raw
    per-epoch mean reward (top) and clip fraction (bottom), one line per run, one column per cell."""
    have = [t for t in traces if t.get("epoch") and "reward_mean" in t]
    if not have:
        return None
    cells = _cells(have)
    fig, panels = panel_grid(len(cells), 2.0, rows_per_panel=2)
    for (top, bottom), cell in zip(panels, cells, strict=True):
        for t in (t for t in have if t["cell"] == cell):
            first = sorted(t["epoch"])[:n_epochs]
            keep = [i for i, e in enumerate(t["epoch"]) if first and e <= first[-1]]
            c, ep, reward = color(t["role"]), [t["epoch"][i] for i in keep], finite(t["reward_mean"])
            top.plot(ep, [reward[i] for i in keep], color=c, marker="o", label=mpl_text(t["run"]))
            if "clipfrac" in t:
                clip = finite(t["clipfrac"])
                bottom.plot(ep, [clip[i] for i in keep], color=c, marker="o")
        top.set(title=panel_title(f"reward, first {n_epochs} epochs (unsmoothed)", cell), xlabel="epoch",
                ylabel="reward")
        bottom.set(title=panel_title(f"clip fraction, first {n_epochs} epochs (unsmoothed)", cell), xlabel="epoch",
                   ylabel="clip fraction")
        _legend(top)
    fig.tight_layout()
    return fig


@paper_style
def rho_figure(traces: list[dict[str, Any]]) -> Any:
    """Policy ratio rho per epoch: mean +- SD band, min / max dashed (from the run logs)."""
    have = [t for t in traces if "rho_mean" in t]
    if not have:
        return None
    cells = _cells(have)
    fig, axes = _axes_per_cell(len(cells))
    for ax, cell in zip(axes, cells, strict=True):
        for t in (t for t in have if t["cell"] == cell):
            c = color(t["role"])
            ep = t["epoch"]
            m = finite(t["rho_mean"])
            s = finite(t.get("rho_std")) or [0.0] * len(m)
            ax.plot(ep, m, color=c, label=mpl_text(t["run"]))
            ax.fill_between(ep, [a - b for a, b in zip(m, s, strict=True)], [a + b for a, b in zip(m, s, strict=True)],
                            color=c, alpha=0.2, lw=0)
            for k in ("rho_min", "rho_max"):
                if k in t:
                    ax.plot(ep, finite(t[k]), color=c, lw=0.6, ls="--")
        ax.axhline(1.0, color="black", lw=0.5)
        ax.set(title=panel_title("policy ratio rho (mean ± SD; min/max dashed)", cell), xlabel="epoch", ylabel="rho")
        _legend(ax)
    fig.tight_layout()
    return fig


@paper_style
def grad_figure(traces: list[dict[str, Any]]) -> Any:
    """First-layer |g| mean and variance per epoch (log scale); second cell dashed."""
    have = [t for t in traces if "grad_first_abs_mean" in t]
    if not have:
        return None
    fig, axes = _plt().subplots(1, 2, figsize=(DOUBLE_COLUMN_IN, 2.4))
    for t in have:
        c = color(t["role"])
        ls = "-" if t["cell"] == have[0]["cell"] else "--"
        axes[0].plot(t["epoch"], finite(t["grad_first_abs_mean"]), color=c, ls=ls, label=mpl_text(t["run"]))
        if "grad_first_abs_var" in t:
            axes[1].plot(t["epoch"], finite(t["grad_first_abs_var"]), color=c, ls=ls)
    axes[0].set(title="first-layer gradient: mean |g|", xlabel="epoch", ylabel="mean |g|", yscale="log")
    axes[1].set(title="first-layer gradient: variance of |g|", xlabel="epoch", ylabel="var |g|", yscale="log")
    _legend(axes[0])
    fig.tight_layout()
    return fig


@paper_style
def qq_figure(fit: dict[str, Any], label: str) -> Any:
    """Normal Q-Q plot of the standardized conditional residuals stored with an LMM fit."""
    dg = fit.get("diagnostics")
    if not dg or not dg.get("qq_theoretical"):
        return None
    x, y = dg["qq_theoretical"], dg["qq_sample"]
    fig, ax = _plt().subplots(figsize=(2.3, 2.3))
    ax.scatter(x, y, s=4, lw=0)
    lo, hi = min(x[0], y[0]), max(x[-1], y[-1])
    ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8)
    r = dg.get("qq_r")
    ax.set(title=mpl_text(f"{label}: LMM residual Q-Q" + (f" (r = {r:.3f})" if r is not None else "")),
           xlabel="normal quantiles", ylabel="std. residuals")
    fig.tight_layout()
    return fig


def qq_plot(fit: dict[str, Any], label: str) -> str | None:
    """:func:`qq_figure` as a PNG data URI (lower resolution: several per row in the HTML)."""
    fig = qq_figure(fit, label)
    return None if fig is None else fig_uri(fig, dpi=96)


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

    ``x`` is the epoch, or with ``x_key`` (e.g. ``compute_s``) the mean of that column over the
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


@paper_style
def reward_curves_figure(runs: list[dict[str, Any]], roles: dict[str, str], wall_clock: bool = False) -> Any:
    """Reward per epoch (or per cumulative compute second): per arm the mean over seeds with a
    min-max band over seeds, and the paired untrained controls (same prompts and seeds) dashed."""
    if not runs:
        return None
    x_key = RUN_COMPUTE_KEY if wall_clock else None
    cells = _cells(runs)
    fig, axes = _axes_per_cell(len(cells))
    for ax, cell in zip(axes, cells, strict=True):
        here = [r for r in runs if str(r["cell"]) == cell]
        for arm in _arms(here, roles):
            mine = [r for r in here if str(r.get("arm", "")) == arm]
            c = color(roles.get(arm, "other"))
            b = seed_band(mine, "reward_mean", x_key)
            ax.fill_between(b["x"], b["lo"], b["hi"], color=c, alpha=0.2, lw=0)
            ax.plot(b["x"], b["mean"], color=c, label=mpl_text(f"{arm} ({len(mine)} seeds)"))
            ctl = seed_band(mine, "control_reward_mean", x_key)
            if ctl["x"]:
                ax.plot(ctl["x"], ctl["mean"], color=c, lw=0.9, ls="--", label=mpl_text(f"{arm}: untrained control"))
        what = "reward against compute time" if wall_clock else "reward per epoch"
        ax.set(title=panel_title(what, cell), xlabel="compute time (s)" if wall_clock else "epoch", ylabel="reward")
        _legend(ax)
    fig.tight_layout()
    return fig


def kl_bins(points: list[tuple[float, float]], n_bins: int = 8) -> tuple[list[float], list[float]]:
    """Drawing aid of the KL-reward plot: (x, y) points sorted by x, cut into ``n_bins`` groups of
    (nearly) equal size; returns the mean x and mean y of each group, so the line runs left to right."""
    pts = sorted(p for p in points if math.isfinite(p[0]) and math.isfinite(p[1]))
    if not pts:
        return [], []
    k = max(1, min(n_bins, len(pts)))
    groups = [pts[i * len(pts) // k:(i + 1) * len(pts) // k] for i in range(k)]
    return ([sum(p[0] for p in g) / len(g) for g in groups if g], [sum(p[1] for p in g) / len(g) for g in groups if g])


@paper_style
def kl_reward_figure(runs: list[dict[str, Any]], roles: dict[str, str]) -> Any:
    """Reward against the PPO approx. KL of each epoch: one dot per (run, epoch); per arm a line
    through the mean reward of 8 equal-count KL bins, sorted by KL (how much policy change each
    arm spends per unit of reward). KL on a log axis when every value is positive."""
    have = [r for r in runs if r.get("approx_kl")]
    if not have:
        return None
    cells = _cells(have)
    fig, axes = _axes_per_cell(len(cells))
    for ax, cell in zip(axes, cells, strict=True):
        here = [r for r in have if str(r["cell"]) == cell]
        for arm in _arms(here, roles):
            c = color(roles.get(arm, "other"))
            pts = [(x, y) for r in here if str(r.get("arm", "")) == arm
                   for x, y in zip(finite(r["approx_kl"]), finite(r.get("reward_mean")), strict=False)]
            ok = [p for p in pts if math.isfinite(p[0]) and math.isfinite(p[1])]
            if ok:
                ax.scatter(*zip(*ok, strict=True), s=5, color=c, alpha=0.35, lw=0)
            bx, by = kl_bins(ok)
            ax.plot(bx, by, color=c, marker="o", ms=3, label=mpl_text(arm))
        xs = [p for r in here for p in finite(r["approx_kl"]) if math.isfinite(p)]
        if xs and min(xs) > 0:
            ax.set_xscale("log")
        ax.set(title=panel_title("reward against approx. KL", cell), xlabel="approx. KL (per epoch)", ylabel="reward")
        _legend(ax)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# diagnostics of ``diagnostics: true`` / ``validation_every`` runs (from results["traces"])
# ------------------------------------------------------------------------------------------------


def _as_runs(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Traces in the shape :func:`seed_band` reads (``epochs``; ``arm`` defaults to the role)."""
    return [{**t, "epochs": t.get("epoch") or [], "arm": str(t.get("arm") or t.get("role", ""))} for t in traces]


@paper_style
def validation_figure(traces: list[dict[str, Any]], roles: dict[str, str]) -> Any:
    """Held-out validation reward per epoch (paper Fig. 5; Flow-GRPO's eval): per arm the mean over
    seeds with a min-max band over seeds, the untrained model on the same images dashed."""
    runs = [r for r in _as_runs(traces) if any(v is not None and math.isfinite(v) for v in finite(r.get("val_reward_mean")))]
    if not runs:
        return None
    cells = _cells(runs)
    fig, axes = _axes_per_cell(len(cells))
    for ax, cell in zip(axes, cells, strict=True):
        here = [r for r in runs if str(r["cell"]) == cell]
        for arm in _arms(here, roles):
            mine = [r for r in here if r["arm"] == arm]
            c = color(roles.get(arm, mine[0].get("role", "other")))
            b = seed_band(mine, "val_reward_mean")
            ax.fill_between(b["x"], b["lo"], b["hi"], color=c, alpha=0.2, lw=0)
            ax.plot(b["x"], b["mean"], color=c, marker="o", label=mpl_text(f"{arm} ({len(mine)} seeds)"))
            ctl = seed_band(mine, "val_control_reward_mean")
            if ctl["x"]:
                ax.plot(ctl["x"], ctl["mean"], color=c, lw=0.9, ls="--", label=mpl_text(f"{arm}: untrained"))
        ax.set(title=panel_title("held-out validation reward", cell), xlabel="epoch", ylabel="validation reward")
        _legend(ax)
    fig.tight_layout()
    return fig


def per_update_series(trace: dict[str, Any], key: str) -> tuple[list[float], list[float]]:
    """(x, y) of a per-update list column: x = epoch - 1 + (u + 0.5) / (updates in that epoch)."""
    xs: list[float] = []
    ys: list[float] = []
    for e, vals in zip(trace.get("epoch") or [], trace.get(key) or [], strict=False):
        vals = finite(vals)
        xs += [e - 1 + (u + 0.5) / len(vals) for u in range(len(vals))]
        ys += vals
    return xs, ys


@paper_style
def diagnostics_figure(traces: list[dict[str, Any]]) -> Any:
    """Per update, one line per run: the maximum relative Taylor error of log rho ~ rho - 1 (App.
    "Soundness": the paper reports <= 1.2%) and the |dot| / squared-norm ratio of Eq. Delta (Fig.
    on-policy-justification; at update 0 of an epoch both terms vanish, so it starts at update 1)."""
    keys = [("taylor_rel_err_per_update", "max rel. Taylor error of log rho ≈ rho - 1"),
            ("delta_ratio_per_update", "|dot| / squared norm (Eq. Delta)")]
    have = [t for t in traces if any(t.get(k) for k, _ in keys)]
    if not have:
        return None
    fig, axes = _plt().subplots(1, 2, figsize=(DOUBLE_COLUMN_IN, 2.4))
    for ax, (key, title) in zip(axes, keys, strict=True):
        for t in have:
            x, y = per_update_series(t, key)
            pos = [(a, b) for a, b in zip(x, y, strict=True) if math.isfinite(b) and b > 0]
            if pos:
                ax.plot(*zip(*pos, strict=True), color=color(t.get("role", "other")), lw=0.7, marker=".", ms=2.5,
                        label=mpl_text(t["run"]))
        if not ax.lines:  # every value missing (NaN: e.g. only on-policy updates for the ratio) or 0
            ax.text(0.5, 0.5, "no positive finite value logged", transform=ax.transAxes, ha="center")
        ax.set(title=title, xlabel="epoch (per update)", yscale="log")
    if axes[0].lines or axes[1].lines:
        _legend(axes[0] if axes[0].lines else axes[1])
    axes[0].axhline(0.012, color="black", lw=0.5, ls=":")
    axes[1].axhline(1.0, color="black", lw=0.5, ls=":")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------------
# rliable panels over runs (from results["rliable"]): interval estimates, probability of improvement,
# performance profiles
# ------------------------------------------------------------------------------------------------


def _panel_rows(block: dict[str, Any], roles: dict[str, str]) -> list[tuple[str, str]]:
    """(cell, arm) rows of the interval and profile panels: cells as the runs list them, then baseline,
    PCPO, other arms."""
    cells = _cells(block.get("runs") or [])
    rows = list(dict.fromkeys((str(r["cell"]), str(r["arm"])) for r in block.get("intervals") or []))
    return sorted(rows, key=lambda ca: (cells.index(ca[0]) if ca[0] in cells else len(cells),
                                        ROLE_ORDER.get(roles.get(ca[1], "other"), 2), ca[1]))


def _n_runs(block: dict[str, Any], cell: str, arm: str) -> int:
    return max((int(i["n_runs"]) for i in block.get("intervals") or [] if (i["cell"], i["arm"]) == (cell, arm)),
               default=0)


def _row_label(cell: str, text: str, n_cells: int) -> str:
    return mpl_text(text if n_cells == 1 or cell in ("", "all") else f"{text}, {cell}")


def _interval_panels(n_panels: int, n_rows: int) -> tuple[Any, list[Any]]:
    width = SINGLE_COLUMN_IN if n_panels == 1 else DOUBLE_COLUMN_IN
    fig, axes = _plt().subplots(1, n_panels, squeeze=False, sharey=True,
                                figsize=(width, 0.9 + 0.28 * max(n_rows, 1)))
    return fig, list(axes[0])


def _interval(ax: Any, i: int, est: float, lo: float | None, hi: float | None, c: str) -> None:
    """One rliable row: a bar from ``lo`` to ``hi`` and a black tick at the estimate; without an interval (too
    few runs: :data:`pcpo_eval.stats.rliable.MIN_INTERVAL_RUNS`) the estimate alone, as a dot."""
    if lo is None or hi is None:
        ax.plot([est], [i], "o", color=c, ms=5, mec="black", mew=0.6)
        return
    ax.barh(i, max(hi - lo, 1e-12), left=lo, height=0.6, color=c, alpha=0.75, lw=0)
    ax.vlines(est, i - 0.35, i + 0.35, color="black", lw=1.2)


def _ci_label(block: dict[str, Any], rows: list[dict[str, Any]], what: str) -> str:
    """The x label: ``what, 95% CI``, or that no interval is drawn below the panels' minimum runs."""
    if any(r.get("ci_low") is not None for r in rows):
        return f"{what}, 95% CI"
    return f"{what} (no CI: < {block.get('min_interval_runs', 10)} runs)"


def _finish_rows(axes: list[Any], labels: list[str]) -> None:
    axes[0].set_yticks(range(len(labels)), labels)
    axes[0].set_ylim(len(labels) - 0.4, -0.6)


@paper_style
def interval_estimates_figure(block: dict[str, Any] | None, roles: dict[str, str]) -> Any:
    """rliable's interval estimates (Agarwal et al. 2021): per arm (and cell) the IQM over runs of each
    per-run quantity with its 95% percentile bootstrap CI, as ``results.json`` ``rliable`` holds them
    (:func:`pcpo_eval.stats.rliable.rliable_panels`)."""
    ivs = (block or {}).get("intervals") or []
    if not ivs:
        return None
    qs, rows = list(block["quantities"]), _panel_rows(block, roles)
    n_cells = len({c for c, _ in rows})
    fig, axes = _interval_panels(len(qs), len(rows))
    for ax, q in zip(axes, qs, strict=True):
        for iv in (iv for iv in ivs if iv["quantity"] == q):
            i = rows.index((str(iv["cell"]), str(iv["arm"])))
            _interval(ax, i, iv["iqm"], iv["ci_low"], iv["ci_high"], color(roles.get(iv["arm"], "other")))
        ax.set(title=block["quantities"][q],
               xlabel=_ci_label(block, [iv for iv in ivs if iv["quantity"] == q], "IQM over runs"))
    _finish_rows(axes, [_row_label(c, f"{a} ({_n_runs(block, c, a)} runs)", n_cells) for c, a in rows])
    fig.tight_layout()
    return fig


@paper_style
def improvement_figure(block: dict[str, Any] | None, roles: dict[str, str]) -> Any:
    """rliable's probability of improvement (Agarwal et al. 2021): P(a run of arm X beats a run of the
    baseline) per per-run quantity with its 95% stratified bootstrap CI, as ``results.json`` ``rliable``
    holds them; 0.5 = no difference."""
    imp = (block or {}).get("improvement") or []
    if not imp:
        return None
    qs = [q for q in block["quantities"] if any(r["quantity"] == q for r in imp)]
    cells = _cells(block.get("runs") or [])
    pairs = sorted(dict.fromkeys((str(r["cell"]), str(r["baseline"]), str(r["arm"])) for r in imp),
                   key=lambda p: (cells.index(p[0]) if p[0] in cells else len(cells),
                                  ROLE_ORDER.get(roles.get(p[2], "other"), 2), p[2]))
    fig, axes = _interval_panels(len(qs), len(pairs))
    for ax, q in zip(axes, qs, strict=True):
        for r in (r for r in imp if r["quantity"] == q):
            i = pairs.index((str(r["cell"]), str(r["baseline"]), str(r["arm"])))
            _interval(ax, i, r["p_improvement"], r["ci_low"], r["ci_high"], color(roles.get(r["arm"], "other")))
        ax.axvline(0.5, color="black", lw=0.5, ls="--")
        ax.set(xlim=(-0.02, 1.02), title=block["quantities"][q],
               xlabel=_ci_label(block, [r for r in imp if r["quantity"] == q], "P(improvement)"))
    _finish_rows(axes, [_row_label(c, f"P({a} > {b})", len({p[0] for p in pairs})) for c, b, a in pairs])
    fig.tight_layout()
    return fig


@paper_style
def performance_profile_figure(block: dict[str, Any] | None, roles: dict[str, str]) -> Any:
    """rliable's performance profiles (Agarwal et al. 2021): per arm (and cell) the fraction of runs
    whose per-run quantity exceeds tau, against tau, with a 95% bootstrap band over runs, as
    ``results.json`` ``rliable`` holds them; further right / higher is better."""
    profs = (block or {}).get("profiles") or []
    if not profs:
        return None
    qs, rows = list(block["quantities"]), _panel_rows(block, roles)
    cells = list(dict.fromkeys(c for c, _ in rows))
    width = SINGLE_COLUMN_IN if len(qs) == 1 else DOUBLE_COLUMN_IN
    fig, axes = _plt().subplots(1, len(qs), squeeze=False, sharey=True, figsize=(width, 2.2))
    for ax, q in zip(axes[0], qs, strict=True):
        taus = block["taus"][q]
        for cell, arm in rows:
            pr = next((p for p in profs if (p["cell"], p["arm"], p["quantity"]) == (cell, arm, q)), None)
            if pr is None:
                continue
            c, ls = color(roles.get(arm, "other")), ("-", "--", ":", "-.")[cells.index(cell) % 4]
            ax.fill_between(taus, pr["band_low"], pr["band_high"], color=c, alpha=0.2, lw=0, step="post")
            ax.step(taus, pr["fraction"], where="post", color=c, ls=ls,
                    label=_row_label(cell, f"{arm} ({pr['n_runs']} runs)", len(cells)))
        ax.set(title=block["quantities"][q], xlabel="threshold tau", ylim=(-0.02, 1.02))
    axes[0][0].set_ylabel("fraction of runs > tau")
    _legend(axes[0][0])
    fig.tight_layout()
    return fig
