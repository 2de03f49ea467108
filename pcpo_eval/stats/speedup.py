"""Training speed-up: epochs to reach a target reward, baseline vs PCPO (paper Tab. 2 and App. Tab. 6).

Conventions (paper App. "Plotting and Visualization Details": curves are "smoothed with a moving
average window of 5 epochs"; App. Tab. 6: "Speedup is calculated as
(Epochs_Baseline / Epochs_PCPO - 1) x 100%", e.g. 260 vs 131 epochs -> 98.5%):

* smoothing: trailing moving average over the logged epochs, window 5. The paper does not say how
  the first ``window - 1`` epochs are handled; we average the epochs available so far (pandas
  ``rolling(window, min_periods=1)``), so every epoch has a smoothed value and a run that starts
  above the target reaches it at epoch 1. Rows are taken in epoch order; gaps in the epoch numbers
  are not filled (the window spans logged rows).
* epochs to target: the first logged ``epoch`` (1-based, from the log) whose smoothed reward is
  >= target (or <= target with ``higher_is_better=False``); ``None`` = not reached.
* several seeds per method: mean and sample SD (ddof=1) of the epochs; the speed-up is computed
  from the mean epochs, and its spread as the min..max over all (baseline seed, PCPO seed) pairs.
  If any run of a method never reaches the target, the speed-up is reported as not available
  (status names who did not reach it) rather than computed from the runs that did; when only the
  baseline misses it, ``speedup_lower_bound`` uses the baseline's last logged epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError

LOG_COLUMNS = ("epoch", "reward_mean")


def moving_average(x: Sequence[float] | np.ndarray, window: int = 5) -> np.ndarray:
    """Trailing moving average; the first ``window-1`` values average what is available."""
    if window < 1:
        raise UserError(f"moving-average window must be >= 1, got {window}")
    a = np.asarray(x, dtype=np.float64)
    c = np.cumsum(np.r_[0.0, a])
    idx = np.arange(1, a.size + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def speedup_pct(epochs_baseline: float, epochs_pcpo: float) -> float:
    """(E_base / E_pcpo - 1) * 100 (paper App. Tab. 6)."""
    return (float(epochs_baseline) / float(epochs_pcpo) - 1.0) * 100.0


def validate_log(df: pd.DataFrame, name: str = "log") -> pd.DataFrame:
    """Check the training-log columns and return it sorted by epoch."""
    missing = [c for c in LOG_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(
            f"{name} lacks column {missing[0]!r} (needs {', '.join(LOG_COLUMNS)}; has {', '.join(map(str, df.columns))})"
        )
    if len(df) == 0:
        raise UserError(f"{name} has no rows")
    for c in LOG_COLUMNS:
        if not pd.api.types.is_numeric_dtype(df[c]):
            raise UserError(f"{name} column {c!r} is not numeric (dtype {df[c].dtype})")
        n_bad = int(df[c].isna().sum())
        if n_bad:
            raise UserError(f"{name} column {c!r} has {n_bad} missing/NaN values")
    if df["epoch"].duplicated().any():
        dup = int(df.loc[df["epoch"].duplicated(), "epoch"].iloc[0])
        raise UserError(f"{name} has epoch {dup} more than once (one row per epoch expected)")
    return df.sort_values("epoch").reset_index(drop=True)


def load_log(path: str | Path) -> pd.DataFrame:
    """Read a training log: a .parquet/.csv file or a RUN directory (``RUN/log.parquet``)."""
    p = Path(path)
    if p.is_dir():
        cand = [p / "log.parquet", p / "log.csv"]
        found = [c for c in cand if c.is_file()]
        if not found:
            raise UserError(f"run directory {p} has no log.parquet")
        p = found[0]
    if not p.is_file():
        raise UserError(f"log {p} does not exist")
    try:
        if p.suffix.lower() == ".csv":
            df = pd.read_csv(p)
        elif p.suffix.lower() in (".parquet", ".pq"):
            df = pd.read_parquet(p)
        else:
            raise UserError(f"log {p} must be .parquet or .csv (or a run directory)")
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"cannot read log {p}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return validate_log(df, f"log {p}")


def smoothed_rewards(log_df: pd.DataFrame, window: int = 5) -> pd.DataFrame:
    """``epoch``, ``reward_mean`` and ``reward_smoothed`` (trailing moving average) in epoch order."""
    df = validate_log(log_df)
    out = df[["epoch", "reward_mean"]].copy()
    out["reward_smoothed"] = moving_average(out["reward_mean"].to_numpy(), window)
    return out


def epochs_to_target(
    log_df: pd.DataFrame, target: float, window: int = 5, higher_is_better: bool = True
) -> int | None:
    """First epoch whose smoothed reward reaches ``target``; None if the run never does."""
    s = smoothed_rewards(log_df, window)
    r = s["reward_smoothed"].to_numpy()
    hit = r >= target if higher_is_better else r <= target
    if not hit.any():
        return None
    return int(s["epoch"].to_numpy()[int(np.argmax(hit))])


@dataclass(frozen=True)
class SpeedupRow:
    """One target level: per-run epochs, their mean/SD per method, and the speed-up."""

    target: float
    baseline_epochs: tuple[int | None, ...]
    pcpo_epochs: tuple[int | None, ...]
    baseline_mean: float | None
    baseline_sd: float | None
    pcpo_mean: float | None
    pcpo_sd: float | None
    speedup_pct: float | None
    speedup_min_pct: float | None
    speedup_max_pct: float | None
    speedup_lower_bound_pct: float | None
    status: str


@dataclass(frozen=True)
class SpeedupTable:
    """Speed-up rows for several targets (render with :meth:`to_markdown`)."""

    rows: tuple[SpeedupRow, ...]
    window: int
    n_baseline: int
    n_pcpo: int
    baseline_names: tuple[str, ...]
    pcpo_names: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON shape of ``pcpo-eval speedup --json``."""
        return {
            "window": self.window,
            "baseline_runs": list(self.baseline_names),
            "pcpo_runs": list(self.pcpo_names),
            "targets": [
                asdict(r) | {"baseline_epochs": list(r.baseline_epochs), "pcpo_epochs": list(r.pcpo_epochs)}
                for r in self.rows
            ],
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per target."""
        return pd.DataFrame([asdict(r) for r in self.rows]).set_index("target")

    def to_markdown(self) -> str:
        """Paper-style table: target, epochs baseline, epochs PCPO, speed-up."""

        def ep(mean: float | None, sd: float | None, n: int) -> str:
            if mean is None:
                return "not reached"
            return f"{mean:.0f}" if n == 1 or sd is None else f"{mean:.1f} ± {sd:.1f}"

        lines = [
            f"Smoothing: trailing moving average, window {self.window}; "
            f"{self.n_baseline} baseline / {self.n_pcpo} PCPO run(s).",
            "",
            "| Target | Epochs baseline | Epochs PCPO | Speedup |",
            "|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            if r.speedup_pct is None:
                sp = r.status + (
                    f" (> {r.speedup_lower_bound_pct:.1f}%)" if r.speedup_lower_bound_pct is not None else ""
                )
            elif r.speedup_min_pct is not None and r.speedup_min_pct != r.speedup_max_pct:
                sp = f"{r.speedup_pct:.1f}% [{r.speedup_min_pct:.1f}, {r.speedup_max_pct:.1f}]"
            else:
                sp = f"{r.speedup_pct:.1f}%"
            lines.append(
                f"| {r.target:g} | {ep(r.baseline_mean, r.baseline_sd, self.n_baseline)} | "
                f"{ep(r.pcpo_mean, r.pcpo_sd, self.n_pcpo)} | {sp} |"
            )
        return "\n".join(lines)


def _mean_sd(v: list[int]) -> tuple[float | None, float | None]:
    if not v:
        return None, None
    a = np.asarray(v, dtype=np.float64)
    return float(a.mean()), (float(a.std(ddof=1)) if a.size > 1 else None)


def speedup_row(
    baseline_logs: Sequence[pd.DataFrame],
    pcpo_logs: Sequence[pd.DataFrame],
    target: float,
    window: int = 5,
    higher_is_better: bool = True,
) -> SpeedupRow:
    """Epochs to ``target`` for every run and the speed-up of PCPO over the baseline."""
    be = [epochs_to_target(d, target, window, higher_is_better) for d in baseline_logs]
    pe = [epochs_to_target(d, target, window, higher_is_better) for d in pcpo_logs]
    b_ok, p_ok = [e for e in be if e is not None], [e for e in pe if e is not None]
    bm, bs = _mean_sd(b_ok)
    pm, ps = _mean_sd(p_ok)
    sp = sp_min = sp_max = lower = None
    if len(b_ok) == len(be) and len(p_ok) == len(pe):
        status = "ok"
        sp = speedup_pct(bm, pm)
        pairs = [speedup_pct(b, p) for b in b_ok for p in p_ok]
        sp_min, sp_max = float(min(pairs)), float(max(pairs))
    else:
        parts = []
        if len(b_ok) < len(be):
            parts.append(f"baseline not reached ({len(be) - len(b_ok)}/{len(be)} runs)")
        if len(p_ok) < len(pe):
            parts.append(f"pcpo not reached ({len(pe) - len(p_ok)}/{len(pe)} runs)")
        status = "; ".join(parts)
        if not b_ok and len(p_ok) == len(pe):
            last = float(np.mean([float(validate_log(d)["epoch"].max()) for d in baseline_logs]))
            lower = speedup_pct(last, pm)
    return SpeedupRow(
        target=float(target),
        baseline_epochs=tuple(be),
        pcpo_epochs=tuple(pe),
        baseline_mean=bm,
        baseline_sd=bs,
        pcpo_mean=pm,
        pcpo_sd=ps,
        speedup_pct=sp,
        speedup_min_pct=sp_min,
        speedup_max_pct=sp_max,
        speedup_lower_bound_pct=lower,
        status=status,
    )


def speedup_table(
    baseline: Sequence[pd.DataFrame | str | Path],
    pcpo: Sequence[pd.DataFrame | str | Path],
    targets: Sequence[float],
    window: int = 5,
    higher_is_better: bool = True,
) -> SpeedupTable:
    """Speed-up rows for each target; logs are DataFrames, log files or RUN directories."""
    if not baseline or not pcpo:
        raise UserError("give at least one baseline log and one PCPO log")
    if not targets:
        raise UserError("give at least one --target reward level")

    def load(x: pd.DataFrame | str | Path) -> tuple[str, pd.DataFrame]:
        if isinstance(x, pd.DataFrame):
            return "<frame>", validate_log(x)
        return str(x), load_log(x)

    b = [load(x) for x in baseline]
    p = [load(x) for x in pcpo]
    rows = tuple(
        speedup_row([d for _, d in b], [d for _, d in p], t, window, higher_is_better) for t in targets
    )
    return SpeedupTable(rows, window, len(b), len(p), tuple(n for n, _ in b), tuple(n for n, _ in p))


def unreachable_targets(run_dirs: Sequence[str | Path], targets: Sequence[float], window: int) -> list[str]:
    """Problems for targets that no run's smoothed reward reaches (paper: first epoch reaching it)."""
    best = float("-inf")
    for rd in run_dirs:
        try:
            log = load_log(Path(rd) / "log.parquet")
        except UserError:
            continue
        best = max(best, float(moving_average(log["reward_mean"].to_numpy(), window).max()))
    out = []
    for t in dict.fromkeys(targets):
        if t == t and not best >= t:  # NaN-safe
            out.append(f"target {t:g} is reached by no run (best smoothed reward {best:.4g}, window {window}); "
                       "lower it or train longer")
    return out
