"""The human study's two tables as the analysis reads them: required columns, validation, comparison labels.

Columns and conventions: :mod:`pcpo_eval.human`. Both :mod:`pcpo_eval.human.analysis` and
:mod:`pcpo_eval.human.simulate` read the pairs table through :func:`validate_pairs`; bad input is a
:class:`~pcpo_eval.errors.UserError` that says how to fix the file.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.human import CHOICES, KINDS, PAIR_COLUMNS, RESPONSE_COLUMNS

#: The columns the analysis reads (a subset of PAIR_COLUMNS / RESPONSE_COLUMNS).
NEEDED_PAIR_COLUMNS = (
    "pair_id", "comparison", "kind", "prompt_id", "left_method", "right_method", "expected"
)
NEEDED_RESPONSE_COLUMNS = ("rater_id", "pair_id", "choice")


def parse_comparison(label: str) -> tuple[str, str]:
    """``"pcpo@120 vs ddpo@180"`` -> ("pcpo@120", "ddpo@180") (A = the method named first)."""
    parts = str(label).split(" vs ")
    if len(parts) != 2 or not all(p.strip() for p in parts) or parts[0].strip() == parts[1].strip():
        raise UserError(
            f"comparison {label!r} is not of the form 'A vs B' with two different methods; fix pairs.parquet"
        )
    return parts[0].strip(), parts[1].strip()


def _require_columns(df: pd.DataFrame, needed: tuple[str, ...], what: str, full: tuple[str, ...]) -> None:
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise UserError(f"{what} lacks column(s) {', '.join(missing)}; it needs {', '.join(full)}")


def validate_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """A checked copy of the pairs table (``pair_id`` as str, ``expected`` filled); UserError if bad."""
    _require_columns(pairs, NEEDED_PAIR_COLUMNS, "the pairs table", PAIR_COLUMNS)
    pairs = pairs.copy()
    pairs["pair_id"] = pairs["pair_id"].astype(str)
    if pairs.pair_id.duplicated().any():
        dup = pairs.pair_id[pairs.pair_id.duplicated()].iloc[0]
        raise UserError(f"pair_id {dup!r} occurs twice in the pairs table; every pair needs its own id")
    bad = sorted(set(pairs.kind) - set(KINDS))
    if bad:
        raise UserError(f"unknown pair kind(s) {bad}; valid kinds: {', '.join(KINDS)}")
    pairs["expected"] = pairs["expected"].fillna("").astype(str)
    for row in pairs[pairs.kind == "main"].itertuples():
        a, b = parse_comparison(row.comparison)
        if {row.left_method, row.right_method} != {a, b}:
            raise UserError(f"pair {row.pair_id}: sides {row.left_method!r}/{row.right_method!r} are not the "
                            f"methods of {row.comparison!r}; fix pairs.parquet")
    ok = {"identical": {"tie"}, "degraded": {"left", "right"}}
    for kind, allowed in ok.items():
        wrong = pairs[(pairs.kind == kind) & ~pairs.expected.isin(allowed)]
        if len(wrong):
            raise UserError(f"{kind} pair {wrong.pair_id.iloc[0]} has expected={wrong.expected.iloc[0]!r}; "
                            f"expected must be {' or '.join(sorted(allowed))}")
    return pairs


def validate_responses(responses: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """A checked copy of the responses (``pair_id`` as str, a ``rater`` column); UserError if bad."""
    _require_columns(responses, NEEDED_RESPONSE_COLUMNS, "the responses table", RESPONSE_COLUMNS)
    r = responses.copy()
    if len(r) == 0:
        raise UserError("there are no responses to analyze; collect ratings first (pcpo-eval human serve)")
    r["pair_id"] = r["pair_id"].astype(str)
    if r["rater_id"].isna().any():
        raise UserError(f"{int(r['rater_id'].isna().sum())} response(s) have no rater_id; every response needs the "
                        "rater who gave it: export the responses again (pcpo-eval human export)")
    if "rater" not in r.columns:
        r["rater"] = r["rater_id"].astype(str)
    unknown = sorted(set(r.pair_id) - set(pairs.pair_id))
    if unknown:
        raise UserError(f"{len(unknown)} response(s) name unknown pair_id(s), e.g. {unknown[0]!r}; "
                        "analyze the responses with the pairs table of the same study")
    bad = sorted(set(map(str, r.choice)) - set(CHOICES))
    if bad:
        raise UserError(f"unknown choice(s) {bad}; valid choices: {', '.join(CHOICES)}")
    _check_times(r)
    dup = r.duplicated(["rater_id", "pair_id"])
    if dup.any():
        d = r[dup].iloc[0]
        raise UserError(
            f"rater {d.rater_id} answered pair {d.pair_id} twice; keep one response per (rater, pair)"
        )
    return r


def _check_times(r: pd.DataFrame) -> None:
    """``submitted_at`` (when present) is an ISO 8601 time and ``seconds`` a time from page to answer (>= 0, or
    NaN: not recorded). Before, ``submitted_at='yesterday'`` was read as no time, so an answer stored after its
    rater's revocation was kept, and negative seconds entered the median that flags fast raters."""
    if "submitted_at" in r.columns:
        raw = r["submitted_at"].map(lambda x: "" if x is None or (isinstance(x, float) and np.isnan(x)) else str(x))
        at = pd.to_datetime(raw.where(raw.str.strip() != ""), utc=True, errors="coerce", format="ISO8601")
        bad = at.isna()
        if bad.any():
            what = f"submitted_at {raw[bad].iloc[0]!r}" if raw[bad].iloc[0].strip() else "an empty submitted_at"
            raise UserError(f"{what} of rater {r.rater_id[bad].iloc[0]} is no ISO 8601 time; export the responses "
                            "again (pcpo-eval human export)")
    if "seconds" in r.columns:
        sec = pd.to_numeric(r["seconds"], errors="coerce")
        bad = (r["seconds"].notna() & sec.isna()) | (sec < 0) | np.isinf(sec)
        if bad.any():
            raise UserError(f"seconds {str(r['seconds'][bad].iloc[0])!r} of rater {r.rater_id[bad].iloc[0]} is no time from "
                            "page to answer (a number >= 0, or empty); export the responses again (pcpo-eval human export)")
