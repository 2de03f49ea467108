"""``pcpo-eval human analyze``: the analysis of a human study folder and its section of the study report.

1. read the design (``design.json``, ``pairs.parquet``) and the responses (the database, or a
   Parquet export / simulation given with ``--responses``);
2. analyse them (:func:`pcpo_eval.human.analysis.analyze`) and add example pairs (prompt, both
   images, which checkpoint was on which side, the votes) for the report;
3. write ``HUMAN/analysis.json`` (private: it names the raters); when the design's study folder holds a
   ``results.json``, copy the analysis to ``STUDY/human.json`` (the study keeps it when its stats stage
   re-runs), add it to ``results.json`` and re-render ``report.html`` with its human-study section. The
   study's copies name raters ``rater <id>`` only (:func:`deidentified`): they are shared files.

**Rehearsals.** Responses from ``human simulate`` carry a ``simulated`` column. Their analysis is
a rehearsal: it goes to ``HUMAN/rehearsal/analysis.json`` only, is marked ``"simulated": true``,
and every verdict and console line starts with ``SIMULATED``; the study's ``human.json``,
``results.json`` and report are never touched, and the real ``HUMAN/analysis.json`` neither.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.human import ANALYSIS_FILE, HumanLayout, design_comparison_seeds
from pcpo_eval.io import append_jsonl, atomic_write_json, to_jsonable

EXAMPLES_PER_COMPARISON = 3
#: The most Bradley-Terry bootstrap resamples ``human analyze`` takes (a billion ran out of memory).
MAX_BOOTSTRAP = 100_000


SIMULATED = "SIMULATED"


def is_simulated(df: pd.DataFrame) -> bool:
    """Responses written by ``human simulate`` (its ``simulated`` column is true)."""
    return "simulated" in df.columns and bool(df["simulated"].fillna(False).astype(bool).any())


def read_responses(folder: Path, responses: Path | None, database_url: str | None) -> tuple[pd.DataFrame, str]:
    """The responses to analyse and where they came from."""
    if responses is not None:
        if not Path(responses).is_file():
            where = "is a folder" if Path(responses).is_dir() else "not found"
            raise UserError(f"--responses {responses} {where}; give a Parquet file written by `pcpo-eval human "
                            "export` or `human simulate`")
        try:
            df = pd.read_parquet(responses)
        except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
            raise UserError(f"--responses {responses} is not a readable Parquet file ({type(exc).__name__}); "
                            "export it again with `pcpo-eval human export`") from None
        return df, str(responses)  # its columns and values are checked by analyze()
    from pcpo_eval.human.db import check_pair_set, database_errors, export_responses, require_stored, upgrade
    from pcpo_eval.human.design import read_design

    url = database_url or HumanLayout(folder).database_url
    require_stored(url, folder, "analyse a file with --responses")
    with database_errors(url):
        upgrade(url)
        check_pair_set(url, read_design(folder)[1])  # another design's database: its answers match no pair here
        return export_responses(url), "database"


def examples(pairs: pd.DataFrame, responses: pd.DataFrame, root: Path, per: int = EXAMPLES_PER_COMPARISON
             ) -> list[dict[str, Any]]:
    """The most-rated main pairs of each comparison, with their images and votes. Image paths are relative to
    the design folder ``root`` (as ``design.json``'s, so the folder can move; they were absolute: a moved study
    re-rendered its report without them)."""
    main = pairs[pairs["kind"] == "main"]
    votes = responses.groupby(["pair_id", "choice"]).size().unstack(fill_value=0)
    out = []
    for comparison, g in main.groupby("comparison", sort=False):
        g = g.assign(n=g["pair_id"].map(votes.sum(axis=1)).fillna(0)).sort_values(["n", "position"],
                                                                                     ascending=[False, True])
        for _, r in g.head(per).iterrows():
            v = votes.loc[r["pair_id"]] if r["pair_id"] in votes.index else {}
            out.append({"comparison": comparison, "prompt": r["prompt"], "seed": int(r["seed"]),
                        "left_method": r["left_method"], "right_method": r["right_method"],
                        "left_image": _relative(HumanLayout(root).image(r["left_image"]), root),
                        "right_image": _relative(HumanLayout(root).image(r["right_image"]), root),
                        "votes": {c: int(v.get(c, 0)) for c in ("left", "right", "tie")}})
    return out


def _relative(path: Path, start: Path) -> str:
    """``path`` relative to the folder ``start`` (``..`` allowed), POSIX-style as results.json's other paths."""
    return Path(os.path.relpath(Path(path).resolve(), Path(start).resolve())).as_posix()


def rebase_examples(res: dict[str, Any], src: Path, dst: Path) -> dict[str, Any]:
    """``res`` with its example pairs' image paths relative to folder ``dst`` instead of ``src`` (a path that is
    already absolute, from an older analysis, stays as it is)."""
    def move(p: str) -> str:
        return p if Path(p).is_absolute() else _relative(Path(src) / p, dst)

    return {**res, "examples": [{**e, "left_image": move(e["left_image"]), "right_image": move(e["right_image"])}
                                for e in res.get("examples", [])]}


def deidentified(res: dict[str, Any]) -> Any:
    """``res`` with every rater's name replaced by ``rater <id>`` (its database id). The study's ``human.json``,
    ``results.json`` and report are shared files: they showed each rater's name (an e-mail address, say) beside
    the attention checks they failed, while the export that holds the names is written private."""
    if isinstance(res, dict):
        out = {k: deidentified(v) for k, v in res.items()}
        if "rater_id" in res and "rater" in res:
            out["rater"] = f"rater {res['rater_id']}"
        return out
    if isinstance(res, list):
        return [deidentified(v) for v in res]
    return res


def analyzed_responses(pairs: pd.DataFrame, responses: pd.DataFrame, res: dict[str, Any],
                       exclude_revoked: bool) -> pd.DataFrame:
    """The responses the analysis kept: without answers dropped for a revocation and without raters the
    attention checks excluded. The report's example pairs count these votes (before: every response,
    so an excluded rater's votes were shown beside a verdict that left them out)."""
    from pcpo_eval.human.analysis import revocations, validate_responses

    kept, _ = revocations(validate_responses(responses, pairs), exclude_revoked)
    gone = {e["rater_id"] for e in res["attention_checks"]["excluded"]}
    return kept[~kept.rater_id.isin(gone)]


#: What the analysis says in place of its example pairs before the study is closed (``--final``).
EXAMPLES_WITHHELD = ("example pairs (the shown images, labelled by checkpoint) are added with `human analyze --final` "
                     "once no rater will be shown more pairs: a report shared before then would unblind the pairs "
                     "still to be rated")


def analyze_folder(folder: str | Path, responses: str | Path | None = None, database_url: str | None = None,
                   bootstrap: int = 1000, log: Callable[[str], None] = print,
                   exclude_revoked: bool = False, final: bool = False) -> dict[str, Any]:
    """Analyse a human study folder (see the module docstring); returns the analysis.

    ``final``: the study is closed, so the analysis (and the study report) may show example pairs: the
    shown images with the checkpoint of each side. Before, an interim analysis put them into the study's
    ``report.html`` while raters were still being shown those images (12 labelled, 2 still due to a rater
    who had not started)."""
    from pcpo_eval.human.analysis import analyze
    from pcpo_eval.human.design import read_design

    folder = Path(folder)
    if not 0 <= bootstrap <= MAX_BOOTSTRAP:
        raise UserError(f"--bootstrap {bootstrap}; use a whole number from 0 (no Bradley-Terry intervals) to "
                        f"{MAX_BOOTSTRAP:,} (1,000 gives intervals to about a hundredth)")
    design, pairs = read_design(folder)
    df, source = read_responses(folder, Path(responses) if responses else None, database_url)
    res = analyze(pairs, df, bootstrap=bootstrap, seed=int(design.get("rng_seed", 0)),
                  exclude_revoked=exclude_revoked)
    used = analyzed_responses(pairs, df, res, exclude_revoked)
    res = to_jsonable({**res, "source": source, "design": {k: design.get(k) for k in (
        "study", "comparisons", "checkpoints", "selection", "n_pairs", "n_main", "n_prompts", "rng_seed",
        "per_rater", "seeds", "max_prompts", "identical", "degraded", "created")}
        # how sides and order were drawn (the secret itself stays in design.json), and the seed layout
        | {"blinding": "secret" if design.get("blinding_secret") else "rng_seed",
           "comparison_seeds": design_comparison_seeds(design, HumanLayout(folder).design)},
        **({"examples": examples(pairs, used, folder)} if final else
           {"examples": [], "examples_withheld": EXAMPLES_WITHHELD})})
    lay = HumanLayout(folder)
    if is_simulated(df):
        res = _label_simulated(res)
        lay.rehearsal.mkdir(exist_ok=True)
        out = lay.rehearsal / ANALYSIS_FILE
        atomic_write_json(out, res)
        log(f"{SIMULATED} rehearsal (responses from `human simulate`): wrote {out}; the study's report, human.json "
            f"and results.json and {lay.analysis} are untouched")
        for line in summary_lines(res):
            log(line)
        return res
    study = _study_results(design, folder)  # read and checked before anything is written
    res, look = _mark_look(res, lay, final)
    atomic_write_json(lay.analysis, res, private=True)  # raters' names, as the export
    log(f"wrote {lay.analysis}" + ("" if final else f" ({EXAMPLES_WITHHELD})"))
    for line in summary_lines(res):
        log(line)
    _into_study(study, res, log, folder)
    append_jsonl(lay.looks, look)  # last: an analysis that failed on the way is no look
    if final:
        log(closing_note(lay, source, database_url, design.get("per_rater")))
    return res


def closing_note(lay: HumanLayout, source: str, database_url: str | None, per_rater: int | None) -> str:
    """What a ``--final`` analysis closed: the app of this folder now answers every rater link with "study closed"
    and ``human raters --add/--rotate`` and ``human serve`` refuse (:meth:`HumanLayout.require_open`), since the
    report labels the shown images by checkpoint. Names the raters with open links and unanswered pairs; for
    answers read from a file, says that an app serving elsewhere (a bundle) does not know and must be stopped.
    Before, the app kept serving after ``--final`` and a rater added then was shown 4 of 12 pairs whose images
    the shared report labelled."""
    head = f"closed {lay.root}: its report labels the shown images by checkpoint"
    if source != "database":
        return (f"{head}; the answers came from {source}: stop any app still serving this study's pairs (a serving "
                "bundle does not know the study is closed) before you share the report")
    from pcpo_eval.human.db import database_errors, progress

    url = database_url or lay.database_url
    with database_errors(url):
        prog = progress(url, per_rater=per_rater)
    open_ = prog[~prog["revoked"] & (prog["answered"] < prog["total"])]
    who = ", ".join(f"{r.rater} {r.answered} of {r.total}" for r in open_.itertuples())
    left = (f"; {len(open_)} rater(s) with open links had unanswered pairs ({who}), which they are no longer shown"
            if len(open_) else "")
    return f"{head}, so the app shows every rater link as closed{left}"


#: what repeated looks do (``benchmarks/bench_human.py --part looks``, RESULTS.md)
PEEKING = ("deciding when to stop from interim looks raises the chance of a preference where there is none above "
           "alpha: in simulated A/A studies with an analysis after each rater from the 5th to the 15th, some look "
           "said \"Raters preferred\" in 11% of studies, the last look alone in 7% (benchmarks/RESULTS.md); fix "
           "the number of raters before the study and read the --final analysis")


def _mark_look(res: dict[str, Any], lay: HumanLayout, final: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """This analysis marked as a look, and its ``looks.jsonl`` entry (appended by the caller once everything
    is written: a failed analysis is no look and closes nothing). An interim look (without ``--final``) is
    not a verdict (each sentence says so and no comparison is ``significant``; the provisional flag is kept
    as ``significant_interim``); the final analysis says how many looks came before it. A look counts once
    per set of answers (a re-analysis of the same answers, such as ``--json`` to read them again, adds no
    chance). Before, every ``human analyze`` wrote its verdicts into the study report, unmarked."""
    from datetime import UTC, datetime

    looks = lay.read_looks()
    counts = res.get("counts") or {}
    entry = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "final": bool(final),
             "answers": counts.get("main_responses_used"), "raters": counts.get("raters")}
    data = (entry["answers"], entry["raters"])
    finals = [x for x in looks if x.get("final")]
    closed = lay.closed_at()
    if closed and not final:
        raise UserError(f"{lay.root} was closed by a --final analysis ({closed}); an interim look now "
                        "would replace its verdict in the study report: analyse it with --final again")
    seen = list(dict.fromkeys((x.get("answers"), x.get("raters")) for x in looks if not x.get("final")))
    if final:
        n, before = len([d for d in seen if d != data]), len(finals)
        were = "analysis was" if n == 1 else "analyses were"
        again = f"; {before} earlier final analysis(es) of the study" if before else ""
        note = (f"{n} interim {were} run on earlier answers before this final one{again}: {PEEKING}" if n
                else f"no interim analysis of earlier answers was run before this final one{again}")
        return {**res, "looks": {"final": True, "interim_before": n, "finals_before": before, "note": note}}, entry
    k = len(seen) + (data not in seen)
    label = f"Interim look {k} (answers so far; not the study's verdict)"
    comps = [{**c, "significant": False, "significant_interim": bool(c.get("significant")),
              "verdict": f"{label}: {c['verdict']}" if c.get("verdict") else label} for c in res.get("comparisons", [])]
    return {**res, "comparisons": comps, "interim": True,
            "looks": {"final": False, "look": k, "note": f"{label}. The verdict is the `human analyze --final` "
                      f"analysis once every planned rater has answered; {PEEKING}"}}, entry


def _label_simulated(res: dict[str, Any]) -> dict[str, Any]:
    """Mark a rehearsal's analysis SIMULATED: a flag, a label and every verdict sentence."""
    comps = [{**c, "verdict": f"{SIMULATED}: {c['verdict']}" if c.get("verdict") else SIMULATED}
             for c in res.get("comparisons", [])]
    return {"simulated": True, "label": f"{SIMULATED} responses (human simulate): a rehearsal, not a result",
            **res, "comparisons": comps, "source": f"{SIMULATED}: {res.get('source')}"}


def summary_lines(res: dict[str, Any]) -> list[str]:
    """One line per comparison (its verdict sentence) for the console, one naming the raters the
    attention checks could not screen (no degraded check answered), one naming the revoked raters and
    what was done with their answers, and one naming the raters who answered implausibly fast, if any."""
    lines = [f"  {c.get('verdict') or c.get('comparison')}" for c in res.get("comparisons", [])]
    unscreened = (res.get("attention_checks") or {}).get("unscreened") or []
    if unscreened:
        lines.append(f"  unscreened (no degraded check answered, kept): {', '.join(r['rater'] for r in unscreened)}")
    rev = res.get("revoked") or {}
    if rev.get("raters"):
        how = ("every answer dropped (--exclude-revoked)" if rev.get("exclude_revoked") else
               "answers before the revocation kept (--exclude-revoked drops them)")
        lines.append(f"  revoked raters, {how}: " + ", ".join(
            f"{r['rater']} (revoked {r['revoked_at']}, {r['answers']} answers, {r['dropped']} dropped)"
            for r in rev["raters"]))
    fast = (res.get("attention_checks") or {}).get("fast") or []
    if fast:
        lines.append("  fast (median answer within 1 s of the page, kept): "
                     + ", ".join(f"{r['rater']} ({r['median_seconds']:.2f} s)" for r in fast))
    return lines


def _study_results(design: dict[str, Any], folder: Path) -> tuple[Any, dict[str, Any]] | None:
    """The design's study folder and its ``results.json``, read and checked before the analysis writes
    anything (before, a damaged results.json was a traceback after human.json was rewritten); None when the
    study has no results (yet)."""
    from pcpo_eval.human.design import study_path
    from pcpo_eval.report.html import read_results
    from pcpo_eval.studydir import StudyLayout

    study = study_path(design, folder)
    lay = StudyLayout(study) if study else None
    if lay is None or not lay.results_file.is_file():
        return None
    return lay, read_results(lay.out)


def _into_study(study: tuple[Any, dict[str, Any]] | None, res: dict[str, Any], log: Callable[[str], None],
                folder: Path) -> None:
    """Copy the analysis into the study folder (:func:`_study_results`) and re-render its report."""
    from pcpo_eval.report.html import write_report
    from pcpo_eval.studydir import write_results

    if study is None:
        log("the design's study folder has no results.json: no report section written (run its stats stage)")
        return
    lay, results = study
    res = rebase_examples(deidentified(res), folder, lay.out)  # shared files: no names; paths from the study
    atomic_write_json(lay.human_file, res)
    results["human"] = res
    write_results(lay.out, results)
    log(f"wrote {write_report(lay.out)} with the human study section")
