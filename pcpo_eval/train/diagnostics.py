"""The paper's training diagnostics (``diagnostics: true``), as pure functions of logged quantities.

Taylor error of the log-ratio (Sec. 2.2 and App. "Soundness of log rho ~ rho - 1"). PCPO-base
replaces ``rho - 1`` in the hinge of Eq. ``eq:hinge-loss`` by ``log rho`` (Eq. ``eq:log-hinge-loss``),
the first-order Taylor expansion of log around 1. Its error at one step is

    e(rho) = (rho - 1) - log rho = expm1(l) - l = l^2/2 + l^3/6 + ...,   l = log rho   (>= 0)

and the paper reports it relative to the term it replaces ("never exceeded 1.2%"):

    e_rel(rho) = e(rho) / |rho - 1| = |1 - l / expm1(l)| = |l/2 - l^2/12 + l^4/720 - ...|

(0 at rho = 1, its limit). The App. bounds it by O(xi^2) where the gradient flows (|log rho| < xi):
``taylor_rel_err_active_max`` is the maximum over the samples whose loss was not clipped.

Eq. ``Delta`` (Prop. 1; Eq. ``eq:logrho-flow`` for velocities): ``-log rho = dot + sq`` with

    dot = w (eps_theta - eps_old) . eps_old          sq = 1/2 || w (eps_theta - eps_old) ||^2

(averaged over the latent dimensions, the trainer's scale; the ratio does not depend on it). At
the first update of an epoch theta = theta_old and both vanish; Fig. ``on-policy-justification``
plots ``|dot| / sq`` at the first off-policy data point, i.e. the update after the first optimizer
step of the epoch (update index 1), where ``|dot| >> sq`` justifies reading the gradient as
``A w(t) grad(eps_theta) . eps`` (App. "Connection to REINFORCE", Eq. ``eq:our_update``).

Missing values. A ratio is NaN where it is undefined: ``delta_ratio_per_update`` at the on-policy
updates (those before ``first_off_policy``, i.e. update 0 of every epoch), whose two terms are 0 in
exact arithmetic; what the trainer measures there is the float error of recomputing the recorded
model output, exactly 0 (0 / 0) or ~1e-10 (a ratio of rounding noise) depending on thread count and
batch shapes, so it is recorded as NaN either way. ``magnitude_ratio`` is NaN for no samples or a
zero mean ``sq``. The Taylor errors are NaN only for a non-finite log rho. ``log.parquet`` stores a
NaN inside a per-update list as null (pandas' Parquet writer); readers treat null as NaN.

PPO health (every run, not only ``diagnostics: true``): :func:`ppo_health_stats` adds the log-ratio
range and approx_kl / clipfrac per update and |log rho| per timestep to each epoch's row;
:func:`ppo_health_warning` is the trainer's end-of-run warning when updates are too large.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pcpo_eval.train.objectives import delta_dot_sq

if TYPE_CHECKING:
    import pandas as pd

#: below this |log rho| the Taylor errors use their series (expm1(l) - l loses digits there)
_SERIES_BELOW = 1e-3


def taylor_abs_error(log_rho: np.ndarray) -> np.ndarray:
    """``e = (rho - 1) - log rho = expm1(l) - l`` (>= 0), by its series ``l^2/2 + l^3/6 + l^4/24``
    for |l| < 1e-3 (relative truncation error < 2e-11 there)."""
    lr = np.asarray(log_rho, dtype=np.float64)
    series = lr**2 / 2 + lr**3 / 6 + lr**4 / 24
    with np.errstate(over="ignore", invalid="ignore"):
        direct = np.expm1(lr) - lr
    return np.where(np.abs(lr) < _SERIES_BELOW, series, direct)


def taylor_rel_error(log_rho: np.ndarray) -> np.ndarray:
    """``e / |rho - 1| = |1 - l / expm1(l)|``; the series ``|l/2 - l^2/12 + l^4/720|`` for |l| < 1e-3;
    0 at l = 0 (the limit)."""
    lr = np.asarray(log_rho, dtype=np.float64)
    series = np.abs(lr / 2 - lr**2 / 12 + lr**4 / 720)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        direct = np.abs(1.0 - lr / np.expm1(lr))
    return np.where(np.abs(lr) < _SERIES_BELOW, series, direct)


def delta_terms(model_output: torch.Tensor, old_output: torch.Tensor, noise: torch.Tensor,
                w: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample (B,): ``dot = w d . eps`` and ``sq = 1/2 ||w d||^2`` of Eq. ``Delta``, d = model output
    minus the recorded one, means over the latent dims: :func:`pcpo_eval.train.objectives.delta_dot_sq` in
    float32 without gradient (``-(dot + sq)`` is :func:`~pcpo_eval.train.objectives.eps_matching_log_rho`)."""
    with torch.no_grad():
        w = torch.as_tensor(w, dtype=torch.float32, device=model_output.device)
        return delta_dot_sq(model_output.detach().float(), old_output.float(), noise.float(), w)


def magnitude_ratio(dot: np.ndarray, sq: np.ndarray) -> float:
    """``mean |dot| / mean sq`` (Fig. ``on-policy-justification``); NaN when both are empty or sq is 0."""
    dot, sq = np.asarray(dot, dtype=np.float64), np.asarray(sq, dtype=np.float64)
    if dot.size == 0 or not np.mean(sq) > 0:
        return float("nan")
    return float(np.mean(np.abs(dot)) / np.mean(sq))


def _per(values: np.ndarray, keys: np.ndarray, fn: Any) -> list[float]:
    return [float(fn(values[keys == k])) for k in np.unique(keys)]


def diagnostic_stats(log_rho: np.ndarray, clipped: np.ndarray, update: np.ndarray, step: np.ndarray,
                     dot: np.ndarray, sq: np.ndarray, first_off_policy: int = 1) -> dict[str, Any]:
    """An epoch's diagnostic columns (one entry per sample x trained step in each input array).

    Scalars: ``taylor_abs_err_max``, ``taylor_rel_err_max`` (all samples), ``taylor_rel_err_active_max``
    (unclipped samples; NaN if none), ``delta_dot_abs``, ``delta_sq``, ``delta_ratio`` (the whole epoch),
    and ``delta_*_first_offpolicy`` at update ``first_off_policy`` (NaN when the epoch has no such
    update: one optimizer step per epoch is all on-policy). Lists, one entry per update:
    ``taylor_rel_err_per_update`` (max), ``delta_dot_abs_per_update``, ``delta_sq_per_update``,
    ``delta_ratio_per_update`` (NaN at the on-policy updates ``< first_off_policy``, see the module
    doc); and per trained step index at the first off-policy update:
    ``delta_ratio_first_offpolicy_per_step``.
    """
    lr = np.asarray(log_rho, dtype=np.float64)
    if lr.size == 0:
        return {}
    clipped, update, step = (np.asarray(a) for a in (clipped, update, step))
    dot, sq = np.asarray(dot, dtype=np.float64), np.asarray(sq, dtype=np.float64)
    rel, ab = taylor_rel_error(lr), taylor_abs_error(lr)
    active = ~clipped.astype(bool)
    off = update == first_off_policy
    nan = float("nan")
    out: dict[str, Any] = {
        "taylor_abs_err_max": float(ab.max()),
        "taylor_rel_err_max": float(rel.max()),
        "taylor_rel_err_active_max": float(rel[active].max()) if active.any() else nan,
        "taylor_rel_err_per_update": _per(rel, update, np.max),
        "delta_dot_abs": float(np.mean(np.abs(dot))) if dot.size else nan,
        "delta_sq": float(np.mean(sq)) if sq.size else nan,
        "delta_ratio": magnitude_ratio(dot, sq),
    }
    if dot.size == lr.size:
        out["delta_dot_abs_per_update"] = _per(np.abs(dot), update, np.mean)
        out["delta_sq_per_update"] = _per(sq, update, np.mean)
        out["delta_ratio_per_update"] = [magnitude_ratio(dot[update == u], sq[update == u]) if u >= first_off_policy
                                         else nan for u in np.unique(update)]  # on-policy: undefined (module doc)
        out["delta_dot_abs_first_offpolicy"] = float(np.mean(np.abs(dot[off]))) if off.any() else nan
        out["delta_sq_first_offpolicy"] = float(np.mean(sq[off])) if off.any() else nan
        out["delta_ratio_first_offpolicy"] = magnitude_ratio(dot[off], sq[off])
        out["delta_ratio_first_offpolicy_per_step"] = [
            magnitude_ratio(dot[off & (step == s)], sq[off & (step == s)]) for s in np.unique(step[off])]
    return out


#: PPO health thresholds (the ranges PPO practice treats as healthy; cf. the issue's ddpo measurements).
HEALTHY_APPROX_KL = 0.05
HEALTHY_CLIPFRAC = 0.25


def approx_kl(log_rho: np.ndarray) -> float:
    """PPO's approximate KL of an update, ``0.5 mean(log rho^2)`` (ddpo-pytorch's ``approx_kl``)."""
    return float(0.5 * np.mean(np.square(np.asarray(log_rho, dtype=np.float64))))


def ppo_health_stats(log_rho: np.ndarray, clipped: np.ndarray, update: np.ndarray, step: np.ndarray) -> dict[str, Any]:
    """Per epoch: the log-ratio range, approx_kl / clipfrac per optimizer update, and |log rho| per timestep.

    ``approx_kl = 0.5 mean(log rho^2)`` (ddpo-pytorch) computed within each update; lists are stored in
    ``log.parquet`` (one entry per update / per sampler step index) so a reader can see which update or
    which timestep carried the large ratios.
    """
    if log_rho.size == 0:
        return {}
    ups = np.unique(update)
    steps = np.unique(step)
    return {
        "log_rho_min": float(log_rho.min()),
        "log_rho_max": float(log_rho.max()),
        "approx_kl_per_update": [approx_kl(log_rho[update == u]) for u in ups],
        "clipfrac_per_update": [float(np.mean(clipped[update == u])) for u in ups],
        "log_rho_abs_per_step": [float(np.mean(np.abs(log_rho[step == s]))) for s in steps],
    }


def ppo_health_warning(log: pd.DataFrame) -> str | None:
    """A one-line warning when the run's updates are too large (median approx_kl or mean clipfrac out of range)."""
    if "approx_kl" not in log or "clipfrac" not in log or log.empty:
        return None
    kl, cf = float(np.nanmedian(log["approx_kl"])), float(np.nanmean(log["clipfrac"]))
    fired = []  # only the condition(s) out of range
    if kl > HEALTHY_APPROX_KL:
        fired.append(f"median approx_kl {kl:.3g} > {HEALTHY_APPROX_KL}")
    if cf > HEALTHY_CLIPFRAC:
        fired.append(f"mean clipfrac {cf:.3g} > {HEALTHY_CLIPFRAC}")
    if not fired:
        return None
    return f"updates too large ({' and '.join(fired)}): lower the learning rate or the clip range"
