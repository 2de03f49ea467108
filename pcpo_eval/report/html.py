"""One self-contained HTML report from a study's ``results.json`` (formatting only).

The report computes nothing: every number comes from :mod:`pcpo_eval.study_stats` (which calls
:mod:`pcpo_eval.stats`). Here we only lay numbers out in the paper's table styles, draw them with
matplotlib (Agg) and embed everything (plots, the credit figure, image grids) as ``data:`` URIs,
so the file opens without network access and without any script: the page has no JavaScript
and no external CSS. The Jinja2 environment autoescapes, so prompts, run names and the spec text
are shown as text, never interpreted as HTML.

Sections: study spec; speed-up (Table 1/5); reward-matched checkpoints; raw scores (Table 2,
significant differences in bold); LMM tables per effect (Tables 3-4) with df method and
diagnostics (convergence, singular fit, Q-Q plot); preference metrics (Table 6); training traces
(reward and clip fraction smoothed, Fig. 5); the credit-weight figure (Fig. 2); rho and |g|
statistics; image grids at matched reward.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_write_text

BASELINE_COLOR, PCPO_COLOR, OTHER_COLOR = "tab:blue", "tab:orange", "tab:gray"


# ------------------------------------------------------------------------------------------------
# number formatting (Jinja filters)
# ------------------------------------------------------------------------------------------------


def fmt_num(x: Any, digits: int = 4) -> str:
    """Significant-digit formatting; None/NaN -> an en dash."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.{max(digits - 1, 1)}e}"
    return f"{x:.{digits}g}" if abs(x) >= 1 else f"{x:.{digits}f}".rstrip("0").rstrip(".") or "0"


def fmt_p(p: Any) -> str:
    """p-values as in the paper (3 decimals), tiny ones as ``< 0.001`` with the exponent."""
    if p is None or (isinstance(p, float) and not math.isfinite(p)):
        return "–"
    p = float(p)
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def pretty_term(term: str) -> str:
    """``algorithm[T.PCPO]:batch[T.16]`` -> ``algorithm = PCPO × batch = 16``."""
    t = re.sub(r"C\((\w+), *Sum\)\[S\.([^\]]+)\]", r"\1 = \2 (sum)", term)
    t = re.sub(r"(\w+)\[T\.([^\]]+)\]", r"\1 = \2", t)
    return t.replace(":", " × ")


# ------------------------------------------------------------------------------------------------
# plots (matplotlib -> PNG data URI)
# ------------------------------------------------------------------------------------------------


def _plt():
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


def file_uri(path: Path) -> str | None:
    """A PNG/JPEG file as a data URI (None if absent)."""
    if not path.is_file():
        return None
    mime = "image/jpeg" if path.suffix.lower() in (".jpg", ".jpeg") else "image/png"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _color(role: str) -> str:
    return {"baseline": BASELINE_COLOR, "pcpo": PCPO_COLOR}.get(role, OTHER_COLOR)


def _cells(traces: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(t["cell"] for t in traces))


def traces_plot(traces: list[dict[str, Any]], window: int) -> str | None:
    """Fig. 5 style: smoothed reward (top) and clip fraction (bottom), one column per cell."""
    if not traces:
        return None
    plt = _plt()
    cells = _cells(traces)
    fig, axes = plt.subplots(2, len(cells), figsize=(4.6 * len(cells), 6), squeeze=False)
    for j, cell in enumerate(cells):
        for t in (t for t in traces if t["cell"] == cell):
            c = _color(t["role"])
            ax = axes[0][j]
            ax.plot(t["epoch"], t["reward_mean"], color=c, alpha=0.25, lw=0.8)
            ax.plot(t["epoch"], t["reward_smoothed"], color=c, lw=1.8, label=t["run"])
            if "clipfrac_smoothed" in t:
                axes[1][j].plot(t["epoch"], t["clipfrac_smoothed"], color=c, lw=1.8)
        axes[0][j].set(title=f"{cell}: reward (window {window})", xlabel="epoch", ylabel="reward")
        axes[1][j].set(title="clip fraction (smoothed)", xlabel="epoch", ylabel="clip fraction")
        axes[0][j].legend(fontsize=6)
    fig.tight_layout()
    return fig_uri(fig)


def rho_plot(traces: list[dict[str, Any]]) -> str | None:
    """Policy ratio rho per epoch: mean +- SD band, min / max dashed (from the run logs)."""
    have = [t for t in traces if "rho_mean" in t]
    if not have:
        return None
    plt = _plt()
    cells = _cells(have)
    fig, axes = plt.subplots(1, len(cells), figsize=(4.6 * len(cells), 3.4), squeeze=False)
    for j, cell in enumerate(cells):
        ax = axes[0][j]
        for t in (t for t in have if t["cell"] == cell):
            c = _color(t["role"])
            ep = t["epoch"]
            m = [v if v is not None else float("nan") for v in t["rho_mean"]]
            s = [v if v is not None else float("nan") for v in t.get("rho_std", [0.0] * len(m))]
            ax.plot(ep, m, color=c, lw=1.5, label=t["run"])
            ax.fill_between(ep, [a - b for a, b in zip(m, s, strict=True)], [a + b for a, b in zip(m, s, strict=True)],
                            color=c, alpha=0.2)
            for k in ("rho_min", "rho_max"):
                if k in t:
                    ax.plot(ep, t[k], color=c, lw=0.7, ls="--")
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set(title=f"{cell}: rho (mean ± SD; min/max dashed)", xlabel="epoch", ylabel="rho")
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
        c = _color(t["role"])
        ls = "-" if t["cell"] == have[0]["cell"] else "--"
        axes[0].plot(t["epoch"], t["grad_first_abs_mean"], color=c, ls=ls, label=t["run"])
        if "grad_first_abs_var" in t:
            axes[1].plot(t["epoch"], t["grad_first_abs_var"], color=c, ls=ls)
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
    ax.set(title=f"{label}: Q-Q (r = {dg.get('qq_r', float('nan')):.3f})", xlabel="normal quantiles",
           ylabel="std. residuals")
    fig.tight_layout()
    return fig_uri(fig, dpi=80)


# ------------------------------------------------------------------------------------------------
# view model: reshape results.json into rows the template prints
# ------------------------------------------------------------------------------------------------


def _lmm_view(lmm: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """Per effect (fixed term, intercept excluded) a row per metric; per metric the diagnostics."""
    fits = lmm.get("fits", {})
    adjusted = lmm.get("adjusted", {})
    alpha = float(lmm.get("alpha", 0.05))
    key = "p_bh" if lmm.get("adjust") == "bh" else "p_holm"
    terms: list[str] = []
    for f in fits.values():
        for fe in f.get("fixed", []):
            if fe["term"] != "(Intercept)" and fe["term"] not in terms:
                terms.append(fe["term"])
    effects = []
    for term in terms:
        rows = []
        for m, f in fits.items():
            fe = next((fe for fe in f.get("fixed", []) if fe["term"] == term), None)
            if fe is None:
                continue
            p_adj = adjusted.get(m, {}).get(term, {}).get(key)
            rows.append({"metric": labels.get(m, m), "estimate": fe["estimate"], "se": fe["se"], "df": fe["df"],
                         "t": fe["t"], "p": fe["p"], "p_adj": p_adj,
                         "significant": bool(f.get("converged", True)) and p_adj is not None and p_adj < alpha})
        effects.append({"term": term, "label": pretty_term(term), "rows": rows})
    diags = []
    for m, f in fits.items():
        if "error" in f:
            diags.append({"metric": labels.get(m, m), "error": f["error"]})
            continue
        dg = f.get("diagnostics") or {}
        diags.append({
            "metric": labels.get(m, m), "converged": f.get("converged"), "singular": f.get("singular"),
            "optimizer": f.get("optimizer"), "reml": f.get("reml_criterion", f.get("deviance")),
            "n_obs": f.get("n_obs"), "n_groups": f.get("n_groups", {}), "random_sd": f.get("random_sd", {}),
            "reference_levels": f.get("reference_levels", {}), "max_grad": f.get("max_grad"),
            "normality_test": dg.get("normality_test"), "normality_p": dg.get("normality_p"),
            "skewness": dg.get("skewness"), "kurtosis": dg.get("excess_kurtosis"),
            "qq": qq_plot(f, labels.get(m, m)),
        })
    return {"effects": effects, "diagnostics": diags, "adjust_label": "Benjamini-Hochberg" if key == "p_bh" else "Holm"}


def _grid_view(grids: list[dict[str, Any]], root: Path | None) -> list[dict[str, Any]]:
    out = []
    for g in grids:
        rows = []
        for r in g.get("rows", []):
            imgs = []
            for col in r.get("images", []):
                imgs.append([{"uri": _image_uri(p, root), "path": p} for p in col])
            rows.append({**r, "images": imgs})
        out.append({**g, "rows": rows})
    return out


def _image_uri(p: str, root: Path | None) -> str | None:
    if p.startswith("data:"):
        return p
    return file_uri(Path(root) / p) if root is not None else None


def view_model(results: dict[str, Any], root: Path | None) -> dict[str, Any]:
    """Everything the template needs, with plots rendered to data URIs."""
    labels = results.get("metric_labels", {})
    study = results.get("study", {})
    trs = results.get("traces", [])
    figs = results.get("figures", {})
    credit = file_uri(Path(root) / figs["credit"]) if root is not None and figs.get("credit") else figs.get("credit_uri")
    return {
        "r": results,
        "study": study,
        "spec_json": json.dumps({k: v for k, v in study.items() if k != "spec_yaml"}, indent=2, default=str),
        "labels": labels,
        "metrics": results.get("metrics", []),
        "lmm": _lmm_view(results.get("lmm", {}), labels) if results.get("lmm") else None,
        "traces_png": traces_plot(trs, int(study.get("window", 5))),
        "rho_png": rho_plot(trs),
        "grad_png": grad_plot(trs),
        "credit_png": credit,
        "grids": _grid_view(results.get("grids", []), root),
    }


def render_report(results: dict[str, Any], root: str | Path | None = None) -> str:
    """The report's HTML (a string) from a results dict; ``root`` resolves relative image paths."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pcpo_eval.report", "templates"),
        autoescape=True,  # every {{ }} is HTML-escaped: prompts and run names are text, never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = fmt_num
    env.filters["pval"] = fmt_p
    env.filters["term"] = pretty_term
    return env.get_template("report.html.j2").render(**view_model(results, Path(root) if root else None))


def write_report(study_dir: str | Path, out_file: str | Path | None = None) -> Path:
    """Render ``STUDY_DIR/results.json`` into ``out_file`` (default ``STUDY_DIR/report.html``)."""
    study_dir = Path(study_dir)
    res = study_dir / "results.json"
    if not res.is_file():
        raise UserError(f"{res} not found; run `pcpo-eval study SPEC --out {study_dir}` first "
                        "(the stats stage writes it)")
    try:
        results = json.loads(res.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{res} is not valid JSON ({exc.msg}); re-run the study's stats stage") from None
    out = Path(out_file) if out_file is not None else study_dir / "report.html"
    atomic_write_text(out, render_report(results, study_dir))
    return out
