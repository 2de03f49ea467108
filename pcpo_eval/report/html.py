"""One self-contained HTML report from a study's ``results.json`` (formatting only).

The report computes no statistic: every estimate, interval, p-value, significance flag and verdict
sentence comes from :mod:`pcpo_eval.study.results` (which calls :mod:`pcpo_eval.stats`). Here we
only lay numbers out in the paper's table styles, draw them (:mod:`pcpo_eval.report.figures`) and
embed everything (plots, the credit figure, image grids) as ``data:`` URIs, so the file opens
without network access and without any script: the page has no JavaScript and no external CSS.
The Jinja2 environment autoescapes, so prompts, run names, sentences and the spec text are shown
as text, never interpreted as HTML, and its ``finalize`` hook prints a missing number (``None``,
NaN) as an en dash, never as "None" or "nan".

Sections, in order: **verdict** (one row per run-level comparison: sentence, estimate with 95% CI,
runs per arm, p or the reason it is not estimable; the 1-run-per-arm warning; the sampler offset of
the untrained controls); study spec; speed-up (Tables 1 and 10); reward curves over seeds against epochs
and wall-clock seconds, KL-reward, rliable's interval estimates and probability of improvement over
runs (descriptive, :mod:`pcpo_eval.report.figures`), PPO health; reward-matched checkpoints; raw scores (Table 2,
significant differences in bold) and their simple effects; LMM tables per effect (Tables 3-4) with
95% CIs, df method and diagnostics; preference metrics (Table 5); the human preference study (only
when results.json has ``human``: win rates with exact CIs, mixed logistic model, Bradley-Terry,
agreement, attention checks, example pairs); training traces (Fig. 3) with rho
and |g| statistics; the credit-weight figure (Fig. 2); image grids at matched reward; progression
over epochs (only when results.json has ``progression``).

Figures: every plot is also written as ``figures/<name>.svg``, ``.pdf`` and a 300-dpi ``.png``
(:func:`write_report`; :func:`write_figures` writes only those, ``pcpo-eval report --figures-only``).

Not estimable (an LMM fit or a verdict row with ``estimable: false``): the p and adjusted-p cells
hold "not estimable: <reason>", nothing is bold, and no "p = " is printed for it.
"""

from __future__ import annotations

import base64
import collections
import functools
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_write_text, check_out_path, read_text_file
from pcpo_eval.report.figures import (
    HTML_DPI,
    closeup_figure,
    diagnostics_figure,
    fig_uri,
    figure_name,
    grad_figure,
    improvement_figure,
    interval_estimates_figure,
    kl_reward_figure,
    performance_profile_figure,
    qq_figure,
    reward_curves_figure,
    rho_figure,
    save_figure,
    traces_figure,
    validation_figure,
)
from pcpo_eval.report.kl_ref import kl_ref_figure
from pcpo_eval.stats.fmt import p_value, pct, pct_interval
from pcpo_eval.stats.rliable import MIN_INTERVAL_RUNS
from pcpo_eval.studydir import RUN_COMPUTE_KEY, StudyLayout, results_path, upgrade_runs

#: Figures the report embeds and writes (``figures/<name>.svg|pdf|png``), in report order; plus one
#: ``qq_<metric>`` per LMM fit. ``figures/credit.png`` is the stats stage's (credit weights, Fig. 2).
FIGURE_NAMES = ("reward_curves", "reward_compute_time", "kl_reward", "interval_estimates",
                "probability_of_improvement", "performance_profiles", "traces", "traces_first_epochs", "rho", "gradients", "validation", "ratio_diagnostics",
                "kl_ref_reward")
#: Resolution of the Q-Q plots embedded in the HTML (several per row).
QQ_HTML_DPI = 96

#: What the verdict's ``quantity`` keys mean (``name:arg`` -> label with the argument).
QUANTITY_LABELS = {
    "epochs_to_target": "epochs to reward {}",
    "speedup": "speed-up to reward {}",
    "speedup_reward": "speed-up to reward {}",
    "speedup_gain": "speed-up to gain {} (learning)",
    "paired_gain": "paired gain",
    "final_reward": "final reward",
    "auc": "area under the reward curve",
    "sampler_offset": "untrained-control reward (sampler offset)",
    "reward_at_epoch": "reward at epoch {}",
}
ONE_RUN_BANNER = "1 run per arm: these are differences between runs; no p-values for the algorithm effect"
NO_VERDICT = "no run-level verdict in this results.json"


# ------------------------------------------------------------------------------------------------
# number formatting (Jinja filters)
# ------------------------------------------------------------------------------------------------


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def fmt_num(x: Any, digits: int = 4) -> str:
    """Significant-digit formatting; None/NaN -> an en dash."""
    if _missing(x):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.{max(digits - 1, 1)}e}"
    return f"{x:.{digits}g}" if abs(x) >= 1 else f"{x:.{digits}f}".rstrip("0").rstrip(".") or "0"


def fmt_p(p: Any, alpha: float = 0.05) -> str:
    """p-values as in the paper (3 decimals) from 0.1 up, three significant digits below (0.0496 and 0.0504
    must not both read 0.050 beside alpha = 0.05), more where rounding would carry p across alpha
    (:func:`pcpo_eval.stats.fmt.p_value`: 0.04997 reads 0.04997, not 0.05), tiny ones with the exponent."""
    if _missing(p):
        return "–"
    p = float(p)
    return f"{p:.3f}" if p >= max(0.1, 2 * alpha) else p_value(p, alpha) if p >= 0.001 else f"{p:.1e}"


def fmt_ci(lo: Any, hi: Any) -> str:
    """A 95% CI as ``[lo, hi]``; an en dash when either end is missing."""
    return "–" if _missing(lo) or _missing(hi) else f"[{fmt_num(lo)}, {fmt_num(hi)}]"


def not_estimable(reason: Any) -> str:
    """The text that replaces a p-value of a fit / comparison that gives none."""
    return f"not estimable: {reason}" if reason else "not estimable (no reason recorded)"


def pretty_term(term: str) -> str:
    """``algorithm[T.PCPO]:batch[T.16]`` -> ``algorithm = PCPO × batch = 16``."""
    t = re.sub(r"C\((\w+), *Sum\)\[S\.([^\]]+)\]", r"\1 = \2 (sum)", term)
    t = re.sub(r"(\w+)\[T\.([^\]]+)\]", r"\1 = \2", t)
    return t.replace(":", " × ")


def text(x: Any) -> str:
    """User text for a composed string: a missing value is an en dash, never "None"."""
    return "–" if _missing(x) else str(x)


def quantity_label(quantity: Any) -> str:
    """``speedup:0.9`` -> ``speed-up to reward 0.9`` (unknown quantities as given)."""
    name, _, arg = text(quantity).partition(":")
    label = QUANTITY_LABELS.get(name)
    if label is None:
        return text(quantity)
    return label.format(arg) if "{}" in label else label


def finalize(x: Any) -> Any:
    """Jinja ``finalize``: a missing value prints as an en dash, never "None" or "nan"."""
    return "–" if _missing(x) else x


def file_uri(path: Path) -> str | None:
    """A PNG/JPEG file as a data URI (None if absent)."""
    if not path.is_file():
        return None
    mime = "image/jpeg" if path.suffix.lower() in (".jpg", ".jpeg") else "image/png"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


#: Embedded images are at most twice as wide as they are shown (sharp on a 2x screen): the grids show 72 px
#: (``img.px``), the human study's example pairs 192 px (``img.pair``). Before, every image was embedded whole:
#: two cells of 1024-px grids made a 231 MB report, twelve 1024-px example pairs 52 MB.
GRID_THUMB_PX = 144
PAIR_THUMB_PX = 384
#: JPEG quality of a shrunk image (an image no larger than its thumbnail is embedded as its own file, lossless)
THUMB_JPEG_QUALITY = 90


def image_uri(path: Path, max_px: int) -> dict[str, Any] | None:
    """An image file as ``{"uri", "smooth"}`` for the report (None if absent or unreadable): the file itself when
    its longer side is at most ``max_px``, else a JPEG shrunk to ``max_px`` (``smooth``: draw it without the
    toy images' pixelated upscaling)."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _image_uri_cached(str(path.resolve()), stat.st_mtime_ns, stat.st_size, max_px)


@functools.lru_cache(maxsize=1024)  # a grid repeats the base model's images in every cell: read and shrink once
def _image_uri_cached(path: str, mtime_ns: int, size: int, max_px: int) -> dict[str, Any] | None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            if max(im.size) <= max_px:
                return {"uri": file_uri(Path(path)), "smooth": False}
            im = im.convert("RGB")
            im.thumbnail((max_px, max_px), Image.Resampling.LANCZOS)
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=THUMB_JPEG_QUALITY)
    except (OSError, UnidentifiedImageError, ValueError):
        return None
    return {"uri": "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), "smooth": True}


# ------------------------------------------------------------------------------------------------
# view model: the verdict and the per-run curves
# ------------------------------------------------------------------------------------------------


def _is_speedup(quantity: Any) -> bool:
    return str(quantity).startswith("speedup")


def fmt_pct(x: Any) -> str:
    """A fraction as a signed percentage (0.254 -> +25%; :func:`pcpo_eval.stats.fmt.pct`); None/NaN -> an en dash."""
    return pct(None if _missing(x) else x, "–")


def _speedup_ci(v: dict[str, Any]) -> str:
    """A speed-up row's CI in %: 'lo to hi', or its two Fieller pieces 'lo to a or b to hi' when ``ci_gap``
    (a speed-up table row) or ``details["ci_gap"]`` (a verdict row) holds the hole, as the sentence prints it
    (:func:`pcpo_eval.stats.fmt.pct_interval`: a non-zero end keeps its sign)."""
    gap = v.get("ci_gap") or (v.get("details") or {}).get("ci_gap")
    return pct_interval(v.get("ci_low"), v.get("ci_high"), tuple(gap) if gap else None)


def _mde_cell(v: dict[str, Any], q: str, estimable: bool) -> str:
    """The detectable column: ±MDE (speed-ups in %), "none" where an estimable row could detect nothing (as the
    speed-up table says it), "–" where the row is not estimable or found its effect (a review: speed-up rows
    printed "–", elsewhere "not estimable", beside the speed-up table's "none")."""
    if not _missing(v.get("mde")):
        return ("" if _is_speedup(q) else "±") + (fmt_pct if _is_speedup(q) else fmt_num)(v.get("mde"))
    return "none" if estimable and v.get("significant") is not True else "–"


def verdict_row(v: dict[str, Any]) -> dict[str, Any]:
    """One verdict object as printed: p only when the study marked it estimable, bold only then;
    speed-ups in %, the row's family with its Holm-adjusted p, its power (MDE) and pairing."""
    ok = v.get("estimable") is True
    q = v.get("quantity", "")
    num = fmt_pct if _is_speedup(q) else fmt_num
    ci = (_speedup_ci(v) if _is_speedup(q) and v.get("ci_low") is not None else fmt_ci(v.get("ci_low"), v.get("ci_high")))
    return {
        "cell": v.get("cell", ""), "quantity": quantity_label(q), "family": v.get("family", ""),
        "comparison": f"{text(v.get('treatment'))} vs {text(v.get('baseline'))}", "sentence": v.get("sentence", ""),
        "estimate": num(v.get("estimate")), "ci": ci, "mde": _mde_cell(v, q, ok),
        "paired": "paired by seed" if v.get("paired") else "unpaired",
        "p_adjusted": fmt_p(v.get("p_adjusted")) if ok and v.get("p_adjusted") is not None else "–",
        "runs": f"{fmt_num(v.get('n_treatment_runs'))} vs {fmt_num(v.get('n_baseline_runs'))}",
        "p": fmt_p(v.get("p")) if ok else not_estimable(v.get("reason")), "estimable": ok,
        "significant": ok and v.get("significant") is True,
        "gated": bool((v.get("details") or {}).get("gated")),
        # the t interval of a row the exact permutation test decides (too few runs): marked, as in the
        # simple-effect table, so an interval excluding 0 beside p > alpha is not read as evidence
        "ci_note": v.get("reason") if ok and v.get("reason") and v.get("ci_low") is not None else None,
    }  # fmt: skip


def one_run_per_arm(verdict: list[dict[str, Any]] | None, runs: list[dict[str, Any]] | None) -> bool:
    """True when every compared arm has exactly one run (from the verdict, else from ``runs``)."""
    if verdict:
        return all(v.get("n_baseline_runs") == 1 and v.get("n_treatment_runs") == 1 for v in verdict)
    if runs:
        return all(n == 1 for n in collections.Counter((r.get("cell"), r.get("arm")) for r in runs).values())
    return False


def per_cell(block: Any) -> list[dict[str, Any]]:
    """``{cell: {...}}`` or ``[{cell, ...}]`` -> ``[{cell, ...}]`` (the sampler-offset block)."""
    if isinstance(block, dict):
        return [{"cell": c, **v} for c, v in block.items()]
    return list(block or [])


def verdict_view(results: dict[str, Any]) -> dict[str, Any]:
    """The opening section: the headline, the notes on what limits the comparison (runs cut short, missing
    controls, partial pairing), verdict rows, the 1-run banner, the sampler offset per cell."""
    verdict = results.get("verdict")
    return {
        "present": verdict is not None,
        "headline": results.get("headline") or "",
        "notes": [str(n) for n in results.get("verdict_notes") or []],
        "rows": [verdict_row(v) for v in verdict or []],
        "one_run": one_run_per_arm(verdict, results.get("runs")),
        "sampler_offset": per_cell(results.get("sampler_offset")),
    }


def arm_roles(results: dict[str, Any]) -> dict[str, str]:
    """Arm name -> plot role (``baseline`` blue, ``pcpo`` orange) from the spec and the verdict."""
    roles = {"baseline": "baseline", "treatment": "pcpo", "pcpo": "pcpo"}
    cmp = results.get("study", {}).get("compare", {})
    roles.update({str(cmp.get("baseline")): "baseline", str(cmp.get("pcpo")): "pcpo"})
    for v in results.get("verdict") or []:
        roles.update({str(v.get("baseline")): "baseline", str(v.get("treatment")): "pcpo"})
    return roles


def health_rows(runs: list[dict[str, Any]], roles: dict[str, str]) -> list[dict[str, Any]]:
    """PPO health per run: median approx. KL, mean clip fraction, the study's warning (if any)."""
    out = []
    for r in runs:
        h = r.get("ppo_health") or {}
        out.append({"run": r.get("run", ""), "cell": r.get("cell", ""), "arm": r.get("arm", ""),
                    "role": roles.get(str(r.get("arm")), "other"), "seed": r.get("seed"),
                    "kl": h.get("median_approx_kl"), "clipfrac": h.get("mean_clipfrac"), "warning": h.get("warning")})
    return out


def runs_view(results: dict[str, Any], uris: dict[str, str]) -> dict[str, Any] | None:
    """Figures and the PPO-health table from ``runs`` (None for an older results.json without it)."""
    runs = results.get("runs")
    if not runs:
        return None
    roles = arm_roles(results)
    return {
        "reward_png": uris.get("reward_curves"),
        "wall_png": uris.get("reward_compute_time"),
        "kl_png": uris.get("kl_reward"),
        "interval_png": uris.get("interval_estimates"),
        "poi_png": uris.get("probability_of_improvement"),
        "profile_png": uris.get("performance_profiles"),
        "min_interval_runs": MIN_INTERVAL_RUNS,
        "health": health_rows(runs, roles),
        "has_controls": any(r.get("control_reward_mean") for r in runs),
    }


def _qq_names(results: dict[str, Any]) -> dict[str, str]:
    """LMM metric -> its Q-Q figure's file stem (``qq_<metric>``, unique)."""
    names: dict[str, str] = {}
    for m in (results.get("lmm") or {}).get("fits", {}):
        stem, i = f"qq_{figure_name(str(m))}", 2
        while stem in names.values():
            stem, i = f"qq_{figure_name(str(m))}_{i}", i + 1
        names[m] = stem
    return names


def report_figures(results: dict[str, Any]) -> dict[str, Any]:
    """Every figure of the report by file stem (:data:`FIGURE_NAMES`, ``qq_<metric>``), as open
    matplotlib figures; figures whose data ``results`` lacks are left out."""
    runs = results.get("runs") or []
    roles = arm_roles(results)
    trs = results.get("traces") or []
    window = int(results.get("study", {}).get("window", 5))
    builders = {
        "reward_curves": lambda: reward_curves_figure(runs, roles),
        "reward_compute_time": lambda: (reward_curves_figure(runs, roles, wall_clock=True)
                                        if any(r.get(RUN_COMPUTE_KEY) for r in runs) else None),
        "kl_reward": lambda: kl_reward_figure(runs, roles),
        "interval_estimates": lambda: interval_estimates_figure(results.get("rliable"), roles),
        "probability_of_improvement": lambda: improvement_figure(results.get("rliable"), roles),
        "performance_profiles": lambda: performance_profile_figure(results.get("rliable"), roles),
        "traces": lambda: traces_figure(trs, window),
        "traces_first_epochs": lambda: closeup_figure(trs),  # Fig. ablations-aes (b), unsmoothed
        "rho": lambda: rho_figure(trs),
        "gradients": lambda: grad_figure(trs),
        "validation": lambda: validation_figure(trs, roles),
        "ratio_diagnostics": lambda: diagnostics_figure(trs),
        "kl_ref_reward": lambda: kl_ref_figure(trs),  # Fig. sd3_flowgrpo (c, d), report/kl_ref.py
    }
    figs = {name: build() for name, build in builders.items()}
    labels = results.get("metric_labels", {})
    fits = (results.get("lmm") or {}).get("fits", {})
    for m, stem in _qq_names(results).items():
        figs[stem] = qq_figure(fits[m], labels.get(m, m)) if "error" not in fits[m] else None
    return {k: v for k, v in figs.items() if v is not None}


def figure_uris(figs: dict[str, Any], save_to: str | Path | None = None) -> dict[str, str]:
    """The figures as PNG data URIs (closed afterwards); with ``save_to`` each is also written there
    as SVG, PDF and 300-dpi PNG (:func:`~pcpo_eval.report.figures.save_figure`)."""
    uris = {}
    for name, fig in figs.items():
        if save_to is not None:
            save_figure(fig, save_to, name)
        uris[name] = fig_uri(fig, dpi=QQ_HTML_DPI if name.startswith("qq_") else HTML_DPI)
    return uris


# ------------------------------------------------------------------------------------------------
# view model: LMM tables, simple effects, image grids
# ------------------------------------------------------------------------------------------------


def fixed_effects(fit: dict[str, Any]) -> list[dict[str, Any]]:
    """A fit's fixed effects as rows with ``term``: the study writes ``dataclasses.asdict`` (a list)
    while ``LMMResult.to_dict`` keys them by term (a dict); both are valid results.json shapes."""
    fx = fit.get("fixed") or []
    return [{"term": t, **v} for t, v in fx.items()] if isinstance(fx, dict) else list(fx)


def p_cells(p: Any, p_adj: Any, estimable: bool, reason: Any, significant: bool) -> dict[str, Any]:
    """The p / adjusted-p cells: numbers, or one "not estimable: <reason>" (``ne``) and no bold."""
    if not estimable:
        return {"ne": not_estimable(reason), "p": None, "p_adj": None, "significant": False}
    return {"ne": None, "p": fmt_p(p), "p_adj": fmt_p(p_adj), "significant": significant}


def _lmm_effect_rows(term: str, lmm: dict[str, Any], labels: dict[str, str]) -> list[dict[str, Any]]:
    alpha = float(lmm.get("alpha", 0.05))
    key = "p_bh" if lmm.get("adjust") == "bh" else "p_holm"
    rows = []
    for m, f in lmm.get("fits", {}).items():
        fe = next((fe for fe in fixed_effects(f) if fe["term"] == term), None)
        if fe is None:
            continue
        ok = f.get("estimable", True) is not False
        p_adj = lmm.get("adjusted", {}).get(m, {}).get(term, {}).get(key)
        sig = ok and bool(f.get("converged", True)) and not _missing(p_adj) and p_adj < alpha
        rows.append({"metric": labels.get(m, m), "estimate": fe.get("estimate"), "se": fe.get("se"),
                     "df": fe.get("df"), "t": fe.get("t"), "ci": fmt_ci(fe.get("ci_low"), fe.get("ci_high")),
                     "mde": fe.get("mde") if ok else None,  # at its family's level (study.image_metrics.family_mdes)
                     **p_cells(fe.get("p"), p_adj, ok, f.get("reason"), sig)})
    return rows


def _lmm_diagnostics(m: str, f: dict[str, Any], label: str, qq: str | None = None) -> dict[str, Any]:
    if "error" in f:
        return {"metric": label, "error": f["error"]}
    dg = f.get("diagnostics") or {}
    ok = f.get("estimable", True) is not False
    return {
        "metric": label, "estimable": "yes" if ok else not_estimable(f.get("reason")), "ok": ok,
        "converged": f.get("converged"), "singular": f.get("singular"), "optimizer": f.get("optimizer"),
        "reml": f.get("reml_criterion", f.get("deviance")), "n_obs": f.get("n_obs"),
        "random_sd": f.get("random_sd", f.get("random")) or {}, "max_grad": f.get("max_grad"),
        "normality_test": dg.get("normality_test"), "normality_p": dg.get("normality_p"),
        "skewness": dg.get("skewness"), "kurtosis": dg.get("excess_kurtosis"), "qq": qq,
        "remarks": list(f.get("remarks") or []),
    }  # fmt: skip


def lmm_view(lmm: dict[str, Any], labels: dict[str, str], qq: dict[str, str] | None = None) -> dict[str, Any]:
    """Per effect (fixed term, intercept excluded) a row per metric; per metric the diagnostics and
    its Q-Q plot (``qq``: metric -> data URI)."""
    fits = lmm.get("fits", {})
    terms = list(dict.fromkeys(fe["term"] for f in fits.values() for fe in fixed_effects(f)
                               if fe["term"] != "(Intercept)"))
    effects = [{"term": t, "label": pretty_term(t), "rows": _lmm_effect_rows(t, lmm, labels)} for t in terms]
    diags = [_lmm_diagnostics(m, f, labels.get(m, m), (qq or {}).get(m)) for m, f in fits.items()]
    return {"effects": effects, "diagnostics": diags,
            "adjust_label": "Benjamini-Hochberg" if lmm.get("adjust") == "bh" else "Holm"}


def _runs_text(values: dict[str, Any] | None) -> str | None:
    """``"3 vs 3"`` (treatment vs baseline runs) of a row's per-run values, None without them."""
    if not values:
        return None
    return f"{len(values.get('treatment') or [])} vs {len(values.get('baseline') or [])}"


def simple_effect_rows(significance: dict[str, dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """The raw-score simple effects (PCPO - baseline per cell and metric) as printed rows."""
    rows = []
    for cell, per in significance.items():
        for i, (m, e) in enumerate(per.items()):
            row: dict[str, Any] = {"cell": cell, "metric": labels.get(m, m), "first": i == 0, "error": e.get("error")}
            if not row["error"]:
                ok = e.get("estimable", True) is not False
                row |= {"estimate": e.get("estimate"), "se": e.get("se"), "df": e.get("df"), "mde": e.get("mde"),
                        "ci": fmt_ci(e.get("ci_low"), e.get("ci_high")),
                        # an estimable row with a reason: its p is not the t test's alone (too few runs:
                        # the exact permutation test bounds it), so the t CI beside it does not decide
                        "ci_note": e.get("reason") if ok and e.get("reason") else None,
                        "runs": _runs_text(e.get("run_values") or e.get("run_means")),
                        "caveat": e.get("caveat"),
                        **p_cells(e.get("p"), e.get("p_adj"), ok, e.get("reason"), ok and e.get("significant") is True)}
            rows.append(row)
    return rows


def _image(p: str | None, root: Path | None, max_px: int = GRID_THUMB_PX) -> dict[str, Any]:
    """``{"uri", "smooth", "path"}`` of an image path of results.json (relative to the study folder ``root``;
    ``uri`` None when missing)."""
    if p and p.startswith("data:"):
        return {"uri": p, "smooth": False, "path": None}
    found = (image_uri(Path(root) / p if root is not None else Path(p), max_px)
             if p and (root is not None or Path(p).is_absolute()) else None)
    return {"uri": None, "smooth": False, **(found or {}), "path": p}


def grid_view(grids: list[dict[str, Any]], root: Path | None) -> list[dict[str, Any]]:
    """Image grids at matched reward with every image as a data URI (None when missing)."""
    out = []
    for g in grids:
        rows = [{**r, "images": [[_image(p, root) for p in col] for col in r.get("images", [])]}
                for r in g.get("rows", [])]
        out.append({**g, "rows": rows})
    return out


def progression_view(progression: list[dict[str, Any]] | None, root: Path | None) -> list[dict[str, Any]]:
    """Per run: one row per (prompt, seed), one column per epoch (same prompts and seeds throughout)."""
    return [{"run": p.get("run", ""), "epochs": list(p.get("epochs", [])),
             "rows": [[_image(path, root) for path in row] for row in p.get("images", [])]}
            for p in progression or []]


def _human_comparison_row(c: dict[str, Any]) -> dict[str, Any]:
    mm = c.get("mixed_model") or {}
    lo, hi = (mm.get("ci95") or [None, None])[:2]
    # the pooled rate is bold only when it leans the verdict's way (``human.analysis.pooled_agrees``; older
    # analysis files lack the key: as before, bold when significant)
    bold = bool(c.get("significant")) and c.get("win_rate_a") is not None and c.get("pooled_agrees", True) is not False
    return {**c, "bold_rate": bold, "or": mm.get("odds_ratio_a"), "or_ci": fmt_ci(lo, hi), "mm_p": mm.get("p"),
            "mm_estimable": bool(mm.get("estimable")), "mm_reason": mm.get("reason"),
            "ci": fmt_ci(*(c.get("ci95") or [None, None])[:2]),
            "rater_ci": fmt_ci(*((c.get("rater_level") or {}).get("ci95") or [None, None])[:2])}


def _bt_rows(bt: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not bt or not bt.get("log_strength"):
        return []
    boot = bt.get("bootstrap") or {}
    cis = boot.get("elo_ci95") or {}
    rows = [{"method": m, "log_strength": bt["log_strength"][m], "elo": bt["elo"][m],
             "elo_ci": fmt_ci(*cis[m]) if m in cis else boot.get("reason") or "none"} for m in bt["methods"]]
    return sorted(rows, key=lambda r: -r["elo"])


def human_view(h: dict[str, Any] | None, root: Path | None) -> dict[str, Any] | None:
    """The human preference study section (``results["human"]``, written by ``pcpo-eval human analyze``; its
    example images are relative to the study folder ``root``, or absolute in an older analysis)."""
    if not h:
        return None
    examples = [{**e, "left": _image(e["left_image"], root, PAIR_THUMB_PX),
                 "right": _image(e["right_image"], root, PAIR_THUMB_PX)} for e in h.get("examples", [])]
    return {"h": h, "comparisons": [_human_comparison_row(c) for c in h.get("comparisons", [])],
            "bt": h.get("bradley_terry"), "bt_rows": _bt_rows(h.get("bradley_terry")),
            "raters": (h.get("attention_checks") or {}).get("raters", []), "examples": examples,
            "scope": human_scope(h)}


def human_scope(h: dict[str, Any]) -> str:
    """What a human comparison is about: two checkpoints, each of ONE training run. Raters see images of
    these checkpoints only, so the run-to-run (seed) variation of training is not in its test: two runs of
    one algorithm with different seeds differ in the images raters prefer as well. It says which
    checkpoints' images raters preferred, not which algorithm trains better (that is the run-level verdict)."""
    cks = [c for c in (h.get("design") or {}).get("checkpoints") or [] if isinstance(c, dict)]
    runs = sorted({str(c["run"]) for c in cks if c.get("run")})
    named = f" ({', '.join(runs)})" if runs else ""
    return (f"Each comparison is between two checkpoints, each from one training run{named}: it says which "
            "checkpoint's images raters preferred, not which algorithm trains better. Training seeds alone "
            "change the images raters prefer, and one run per arm holds no run-to-run variation to test "
            "against; the run-level verdict above is the comparison of the algorithms.")


def view_model(results: dict[str, Any], root: Path | None, uris: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything the template needs; ``uris`` are the figures as data URIs (default: drawn here)."""
    uris = figure_uris(report_figures(results)) if uris is None else uris
    labels = results.get("metric_labels", {})
    study = results.get("study", {})
    figs = results.get("figures", {})
    credit = file_uri(Path(root) / figs["credit"]) if root is not None and figs.get("credit") else figs.get("credit_uri")
    raw = results.get("raw_scores") or {}
    qq = {m: uris[stem] for m, stem in _qq_names(results).items() if stem in uris}
    return {
        "r": results,
        "study": study,
        "spec_json": json.dumps({k: v for k, v in study.items() if k != "spec_yaml"}, indent=2, default=str),
        "labels": labels,
        "metrics": results.get("metrics", []),
        "verdict": verdict_view(results),
        "banner": ONE_RUN_BANNER,
        "no_verdict": NO_VERDICT,
        "curves": runs_view(results, uris),
        "simple_effects": simple_effect_rows(raw.get("significance") or {}, labels),
        "lmm": lmm_view(results.get("lmm", {}), labels, qq) if results.get("lmm") else None,
        "traces_png": uris.get("traces"),
        "closeup_png": uris.get("traces_first_epochs"),
        "rho_png": uris.get("rho"),
        "grad_png": uris.get("gradients"),
        "val_png": uris.get("validation"),
        "diag_png": uris.get("ratio_diagnostics"),
        "credit_png": credit,
        # Fig. sd3_flowgrpo (c, d): reward against the running-mean KL to the reference (study/results.py)
        "kl_ref_png": uris.get("kl_ref_reward") or (
            file_uri(Path(root) / figs["kl_ref"]) if root is not None and figs.get("kl_ref") else None),
        "grids": grid_view(results.get("grids", []), root),
        "progression": progression_view(results.get("progression"), root),
        "human": human_view(results.get("human"), root),
    }


def render_report(results: dict[str, Any], root: str | Path | None = None,
                  figures_dir: str | Path | None = None) -> str:
    """The report's HTML (a string) from a results dict; ``root`` resolves relative image paths;
    with ``figures_dir`` every figure is also written there (SVG, PDF, 300-dpi PNG)."""
    import jinja2

    uris = figure_uris(report_figures(results), figures_dir)
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pcpo_eval.report", "templates"),
        autoescape=True,  # every {{ }} is HTML-escaped: prompts and run names are text, never markup
        undefined=jinja2.StrictUndefined,
        finalize=finalize,  # None / NaN print as an en dash
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = fmt_num
    env.filters["pct"] = fmt_pct
    env.filters["speedup_ci"] = _speedup_ci
    env.filters["pval"] = fmt_p
    env.filters["term"] = pretty_term
    return env.get_template("report.html.j2").render(**view_model(results, Path(root) if root else None, uris))


def read_results(study_dir: str | Path) -> dict[str, Any]:
    """``STUDY_DIR/results.json`` as a dict; anything else is one :class:`UserError` line."""
    study_dir = Path(study_dir)
    res = results_path(study_dir)
    if not res.is_file():
        from pcpo_eval.rundir import is_run_dir

        if is_run_dir(study_dir):
            raise UserError(f"{study_dir} is a training run, not a study; a report compares runs: list them in a "
                            "study spec (runs:) and run `pcpo-eval study SPEC --out STUDY`, then report STUDY")
        raise UserError(f"{res} not found; run `pcpo-eval study SPEC --out {study_dir}` first "
                        "(the stats stage writes it)")
    try:
        results = json.loads(read_text_file(res, "results file", "re-run the study's stats stage"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{res} is not valid JSON ({exc.msg}); re-run the study's stats stage") from None
    if not isinstance(results, dict):
        raise UserError(f"{res} holds a JSON {type(results).__name__}, not a study's results object; "
                        "re-run the study's stats stage")
    if not isinstance(results.get("study"), dict):
        raise UserError(f"{res} is not a study's results object (no 'study' section); nothing was written "
                        f"(an existing report is kept); re-run `pcpo-eval study SPEC --out {study_dir} --stages stats`")
    for key, kind in SECTION_TYPES.items():  # a hand-edited or foreign file: one line, not a template traceback
        if results.get(key) is not None and not isinstance(results[key], kind):
            raise UserError(f"{res}: section {key!r} is a JSON {type(results[key]).__name__}, not "
                            f"{'a list' if kind is list else 'an object'}; nothing was written (an existing report "
                            f"is kept); re-run `pcpo-eval study SPEC --out {study_dir} --stages stats`")
    return upgrade_runs(results)


#: the results.json sections the report reads, by JSON type (list or object)
SECTION_TYPES: dict[str, type] = {
    "verdict": list, "runs": list, "traces": list, "grids": list, "targets": list,
    "speedup": list, "preferences": list, "verdict_notes": list, "study": dict, "lmm": dict, "human": dict,
    "figures": dict, "selection": dict, "raw_scores": dict, "metric_labels": dict, "rliable": dict,
}


def write_report(study_dir: str | Path, out_file: str | Path | None = None, figures: bool = True) -> Path:
    """Render ``STUDY_DIR/results.json`` into ``out_file`` (default ``STUDY_DIR/report.html``); with
    ``figures`` (default) every figure also goes to ``STUDY_DIR/figures/<name>.svg|pdf|png``."""
    study_dir = Path(study_dir)
    results = read_results(study_dir)
    out = check_out_path(out_file if out_file is not None else StudyLayout(study_dir).report_file, "--output",
                         folder=False)  # before any figure is written
    if figures:
        check_out_path(study_dir / "figures", "the figures folder")
    atomic_write_text(out, render_report(results, study_dir, study_dir / "figures" if figures else None))
    return out


def write_figures(study_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Only the report's figures of ``STUDY_DIR/results.json``: ``<name>.svg``, ``.pdf`` and a 300-dpi
    ``.png`` each, in ``out_dir`` (default ``STUDY_DIR/figures``); returns the files written."""
    study_dir = Path(study_dir)
    results = read_results(study_dir)
    out = check_out_path(out_dir if out_dir is not None else study_dir / "figures", "--figures-dir")
    paths: list[Path] = []
    for name, fig in report_figures(results).items():
        paths += save_figure(fig, out, name)
        _close(fig)
    return paths


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)
