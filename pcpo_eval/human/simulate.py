"""Simulated raters for a human study's pairs table: planted preferences, rater and prompt noise, checks.

:func:`simulate_responses` draws a study's responses (tests, the demo, ``pcpo-eval human
simulate``, the calibration in benchmarks/bench_human.py); the rows are marked ``simulated`` so
that ``human analyze`` never lets them reach the study report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.human import RESPONSE_COLUMNS
from pcpo_eval.human.tables import parse_comparison, validate_pairs

P_CLIP = 1e-9  # a planted probability of 0 or 1 is taken as 1e-9 / 1 - 1e-9


def _p_first(a: str, b: str, p_prefer: dict[str, float] | float) -> float:
    """P(A chosen over B) among decisive answers: a float is P(A); a dict maps methods to their P of
    being chosen against an unlisted method (log-strength logit(p), unlisted = 0)."""
    if not isinstance(p_prefer, dict):
        return min(max(float(p_prefer), P_CLIP), 1.0 - P_CLIP)

    def s(x: str) -> float:
        p = min(max(float(p_prefer.get(x, 0.5)), P_CLIP), 1.0 - P_CLIP)
        return math.log(p / (1.0 - p))

    return min(max(1.0 / (1.0 + math.exp(-(s(a) - s(b)))), P_CLIP), 1.0 - P_CLIP)


def _check_answer(kind: str, expected: str, fail_rate: float, rng: np.random.Generator) -> str:
    if kind == "degraded":
        degraded_side = "right" if expected == "left" else "left"
        return expected if rng.random() >= fail_rate else str(rng.choice(["tie", degraded_side]))
    return "tie" if rng.random() < 0.6 else str(rng.choice(["left", "right"]))


def simulate_responses(
    pairs: pd.DataFrame,
    n_raters: int,
    responses_per_rater: int | Sequence[int],
    p_prefer: dict[str, float] | float,
    rng_seed: int,
    fail_rate: float = 0.0,
    *,
    tie_rate: float = 0.05,
    rater_sd: float = 0.3,
    prompt_sd: float = 0.3,
) -> pd.DataFrame:
    """Simulated responses (columns RESPONSE_COLUMNS and ``simulated``, always true) of ``n_raters`` raters.

    Each rater answers ``responses_per_rater`` main pairs drawn without replacement plus every
    attention-check pair; a sequence gives each rater their own count (``n_raters`` of them: e.g.
    ``[600] + [20] * 14``, one rater who gives most answers, as ``per_rater: null`` allows). On a main pair of ``"A vs B"`` the rater ties with ``tie_rate``, else
    chooses A with log-odds logit(P(A)) + rater effect + prompt effect (N(0, rater_sd^2) and
    N(0, prompt_sd^2)); P(A) from ``p_prefer``: a float is P(A) for every comparison, a dict maps
    method names to their chance against an unlisted method (e.g. ``{"pcpo@120": 0.7}``;
    Bradley-Terry log-strengths logit(p); 0 and 1 are taken as 1e-9 and 1 - 1e-9). Degraded checks
    are answered ``expected`` except with probability ``fail_rate`` (then the degraded side or a
    tie); identical checks with a tie 60% of the time, else a random side.
    """
    pairs = validate_pairs(pairs)
    probs = [p_prefer] if not isinstance(p_prefer, dict) else list(p_prefer.values())
    if not all(0.0 <= float(p) <= 1.0 for p in probs):
        raise UserError(f"p_prefer {p_prefer!r}: every probability must lie in [0, 1]")
    counts = ([int(responses_per_rater)] * n_raters if isinstance(responses_per_rater, int | np.integer)
              else [int(k) for k in responses_per_rater])
    if len(counts) != n_raters or min(counts, default=0) < 0:
        raise UserError(f"responses_per_rater {responses_per_rater!r}: one count >= 0 per rater ({n_raters})")
    rng = np.random.default_rng(rng_seed)
    main, checks = pairs[pairs.kind == "main"], pairs[pairs.kind != "main"]
    prompts = sorted(map(str, pairs.prompt_id.unique()))
    prompt_eff = dict(zip(prompts, rng.normal(0.0, prompt_sd, len(prompts)), strict=True))
    rows, t0 = [], pd.Timestamp("2026-01-01T00:00:00Z")
    recs = main[["pair_id", "comparison", "prompt_id", "left_method"]].astype(str).to_numpy().tolist()
    checks = checks[["pair_id", "kind", "expected"]].astype(str).to_numpy().tolist()
    for r, count in enumerate(counts):
        eff = rng.normal(0.0, rater_sd)
        take = rng.choice(len(recs), size=min(count, len(recs)), replace=False)
        for pair_id, label, prompt_id, left in (recs[i] for i in take):
            a, b = parse_comparison(label)
            p = _p_first(a, b, p_prefer)
            pa = 1.0 / (1.0 + math.exp(-(math.log(p / (1.0 - p)) + eff + prompt_eff[prompt_id])))
            if rng.random() < tie_rate:
                choice = "tie"
            else:
                choice = "left" if (rng.random() < pa) == (left == a) else "right"
            rows.append((r, pair_id, choice))
        rows += [(r, pid, _check_answer(kind, exp, fail_rate, rng)) for pid, kind, exp in checks]
    df = pd.DataFrame(rows, columns=["rater_id", "pair_id", "choice"])
    df.insert(0, "rater", [f"rater{r:02d}" for r in df.rater_id])
    df["reason"] = ""
    df["submitted_at"] = pd.date_range(t0, periods=len(df), freq="10s").strftime("%Y-%m-%dT%H:%M:%S+00:00")
    df["first_choice"] = df["choice"]
    df["corrections"] = 0
    df["seconds"] = float("nan")  # no page was served
    df["revoked"] = False
    df["revoked_at"] = ""
    df["simulated"] = True  # marks a rehearsal: `human analyze` never lets it reach the study report
    return df[[*RESPONSE_COLUMNS, "simulated"]]
