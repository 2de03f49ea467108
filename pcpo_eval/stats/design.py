"""Input validation and design matrices for the LMM (formula -> y, X, random-effects blocks).

Every problem in user data is raised as a one-line :class:`~pcpo_eval.errors.UserError` naming the
column or problem: a formula naming missing columns, a non-numeric or constant response, NaNs in
used columns, a grouping with one level.

Coding (stated in every result): ``treatment`` is patsy's default (the first level is the
reference: a pandas Categorical's ``categories`` order, else sorted values; term names
``a[T.level]``; :func:`reference_levels_of` reads it back from the built design); with an interaction the main-effect coefficient is the
effect at the *reference level of the other factor*. ``sum`` wraps each bare categorical column
in ``C(col, Sum)`` (deviation coding, term names ``C(a, Sum)[S.level]``; main effects are then
averaged over the other factor's levels). Factors the user already wrapped (``C(a, ...)``) and
numeric columns are left as written: a 0/1 numeric column is a covariate, not a factor.
"""

from __future__ import annotations

import ast
import builtins
import re
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.stats.lmm_core import REBlock

CODINGS = ("treatment", "sum")

#: Functions a formula may call besides patsy's builtins (C, I, Q, center, standardize, Sum, ...).
_FORMULA_ENV = {"np": np, "log": np.log, "exp": np.exp, "sqrt": np.sqrt, "abs": np.abs}


@dataclass(frozen=True)
class Design:
    """Everything one LMM fit needs, validated."""

    response: str
    y: np.ndarray
    X: np.ndarray
    fixed_names: tuple[str, ...]
    blocks: tuple[REBlock, ...]
    reference_levels: dict[str, str]
    used_columns: tuple[str, ...]


#: one coded factor of a fixed-effect term's name: ``algorithm[T.PCPO]``, ``C(algorithm)[T.PCPO]``,
#: ``C(algorithm, Sum)[S.DDPO]`` (treatment or sum coding, :func:`_apply_coding`); group 1 or 2 is the column
_TERM_FACTOR = re.compile(r"^(?:(\w+)|C\(\s*(\w+)\s*(?:,[^\[]*)?\))\[[TS]\.")


def term_factors(term: str) -> tuple[str, ...]:
    """The data columns whose coded levels make up a fixed-effect term, in order: ``algorithm[T.PCPO]`` and
    ``C(algorithm, Sum)[S.DDPO]`` -> ``("algorithm",)``; ``algorithm[T.PCPO]:batch[T.16]`` -> ``("algorithm",
    "batch")``; a numeric covariate or the intercept -> ``()``. The one reading of term names by factor, so
    sum coding's names are not missed where only ``algorithm[`` was looked for."""
    out = []
    for part in term.split(":"):
        m = _TERM_FACTOR.match(part.strip())
        if m:
            out.append(m.group(1) or m.group(2))
    return tuple(out)


def _is_categorical(s: pd.Series) -> bool:
    return not pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s)


#: the column of a per-image / per-prompt table that names the training run (:mod:`pcpo_eval.study.image_metrics`)
RUN_COLUMN = "run"
#: the columns that name a prompt in such tables
PROMPT_COLUMNS = ("prompt", "prompt_id")
#: the column that names an image (one initial noise, shared by every run) in per-image tables
IMAGE_COLUMN = "image"


def replication_warnings(data: pd.DataFrame, formula: str, groups: list[str], slopes: bool = False) -> list[str]:
    """What makes the test of a categorical fixed factor in ``formula`` not a test across replicates:

    * a :data:`RUN_COLUMN` nested in the factor that is not a grouping: the rows of one run (its images or
      prompts) are then independent replicates to the model, and within-run noise counts as evidence (A/A
      tables of 30 prompts, 3 runs per arm: p < 0.05 in 68 of 100, ``benchmarks/bench_lmm_replication.py``);
    * a grouping with one level in some level of the factor (one run per arm): the factor is confounded
      with that grouping, and its p tests nothing about the factor;
    * no grouping nested in the factor with at least 2 levels in each of its levels (a run column named
      anything), nor one crossed with it other than prompts and images (runs scored at two epochs: a
      within-run factor): the rows (prompts, images) are then the only replicates, so the p is about these
      runs / checkpoints and leaves out the variation between training runs a method comparison must
      count. Before, per-prompt tables of one run per arm (or three, in a column named ``seed``) gave A/A
      pairs p < 0.05 in 90 and 68 of 100 with no warning (the same benchmark);
    * no prompt shared between the factor's levels: the difference is between prompt sets as well;
    * only groupings crossed with the factor (other than prompts and images) and several rows in each of
      their cells, without a random slope (``slopes``): each cell's own effect (a run's, when the group
      names seeds both arms share) is left in the residual, so its rows count as replicates. Before, a seed
      column shared by both arms silenced the warning: a review's A/A per-prompt LPIPS of the toy world gave
      p = 0.0051 with ``--group seed`` where the runs grouped gave 0.234 (the same holds for a within-run
      factor without a slope; ``tests/cli/test_stats_comparability.py``).
    A grouped column that names the same units as the run column (a seed column unique per run) is the
    run grouping (no warning that the runs are ungrouped). A study adds ``(1|run)`` and refuses one run per arm itself (:data:`pcpo_eval.study.image_metrics.ONE_RUN_LMM`)."""
    _, _, rhs = parse_formula(formula, list(data.columns))
    out = []
    for f in (c for c in rhs if _is_categorical(data[c]) and data[c].nunique() > 1):
        nested = {g: bool((data.groupby(g)[f].nunique() == 1).all()) for g in
                  dict.fromkeys([*groups, RUN_COLUMN, *PROMPT_COLUMNS]) if g in data.columns and g != f}
        same_as_run = RUN_COLUMN in data.columns and any(
            g != RUN_COLUMN and bool((data.groupby(g)[RUN_COLUMN].nunique() == 1).all())
            and bool((data.groupby(RUN_COLUMN)[g].nunique() == 1).all()) for g in groups if g in data.columns)
        if nested.get(RUN_COLUMN) and RUN_COLUMN not in groups and not same_as_run:
            out.append(f"the table's {RUN_COLUMN} column is nested in {f} (each {RUN_COLUMN} in one level) but is "
                       f"not a --group: the rows of one {RUN_COLUMN} are not independent replicates, so the test of "
                       f"{f} counts within-{RUN_COLUMN} noise as evidence; add --group {RUN_COLUMN}")
        replicated = False
        for g in groups:
            per_level = data.groupby(f)[g].nunique() if nested.get(g) else None
            if per_level is not None and (per_level < 2).any():
                out.append(f"--group {g} has one level in {f} {per_level.idxmin()!s}: the {f} effect is confounded "
                           f"with {g} (one {g} per level), so its p is no test of {f}; give at least 2 {g}s per level")
            replicated = replicated or (per_level is not None and bool((per_level >= 2).all()))
        run_unsaid = not (nested.get(RUN_COLUMN) and RUN_COLUMN not in groups and not same_as_run)
        # a grouping crossed with the factor that is no prompt or image (runs scored at two epochs: a
        # within-run factor, tested against the runs) replicates it too
        within = [g for g in groups if g not in (*PROMPT_COLUMNS, IMAGE_COLUMN) and g != f and not nested.get(g)
                  and data[g].nunique() > 1]
        cells = {g: int(data.groupby([g, f]).size().median()) for g in within}
        if not replicated and run_unsaid and within and not slopes and all(n > 1 for n in cells.values()):
            g = within[0]
            out.append(f"--group {g} is crossed with {f} (each {g} in several levels) and each {g} x {f} cell holds "
                       f"{cells[g]} rows: the cells' own effects (a run's, if {g} names seeds both levels share) are "
                       f"left in the residual, so those rows count as replicates of {f}; group the runs (a column "
                       f"naming each run, or each {g} x {f} cell, and --group it)"
                       + (f" or, with {g} the only group, add a random slope: --re-formula \"~{f}\""
                          if len(groups) == 1 else ""))
        if not replicated and run_unsaid and not within and not any(nested.get(g) for g in groups):
            out.append(f"no --group is nested in {f} (a run or seed column, each value in one level of {f}): the "
                       f"rows are the only replicates, so the p compares these runs' images, not {f} across "
                       f"training runs, whose run-to-run variation it leaves out (A/A tables of one run per level: "
                       f"p < 0.05 in 90 of 100); add a column naming each row's run and --group it, with at "
                       f"least 2 runs per level")
        shared = [g for g in PROMPT_COLUMNS if g in nested]
        if shared and all(nested[g] for g in shared):
            out.append(f"no {shared[0]} is shared between the levels of {f}: the difference is between prompt sets "
                       f"as well as {f}; score every level on one prompt list")
    return out


def check_factor_levels(data: pd.DataFrame, formula: str) -> None:
    """``pcpo-eval lmm``: refuse a categorical column of the formula with one value in every row (it drops out of
    the design, and the command fitted the intercept alone, exit 0; a review). Not :func:`build_design`'s rule:
    a study may declare a factor of one level (``batch: [256]``) beside the compared one."""
    _, _, rhs = parse_formula(formula, [str(c) for c in data.columns])
    for c in rhs:
        if c in data.columns and _is_categorical(data[c]) and data[c].nunique(dropna=False) == 1:
            raise UserError(f"column {c!r} of the formula has one value ({data[c].iloc[0]!s}) in every row: there is "
                            f"nothing to compare; give a table with at least two levels of {c}, or drop {c} from the "
                            "formula")


def per_prompt_metric_warnings(data: pd.DataFrame, responses: list[str]) -> list[str]:
    """For a ``per_prompt.parquet`` table (its ``n_images`` column): each response that is a catalogue metric
    undefined or uninformative per prompt at the table's fewest images per prompt
    (:func:`pcpo_eval.metrics.base.per_prompt_problem`, the study's rule). Before, ``lmm --response fd_toy``
    on 4 images per prompt in 128-d (a degenerate fit the study refuses) was fitted without a word, and
    ``is_toy``, 1.0 in every row, likewise."""
    from pcpo_eval.metrics.base import METRICS, per_prompt_problem

    if "n_images" not in data.columns or not pd.api.types.is_numeric_dtype(data["n_images"]) or data.empty:
        return []
    n = int(data["n_images"].min())
    out = []
    for r in dict.fromkeys(responses):
        if r in METRICS and n >= 1 and (problem := per_prompt_problem(r, n)) is not None:
            out.append(f"{r} per prompt at {n} images per prompt: {problem}")
    return out


#: Python builtins a formula term may call (patsy evaluates each term as Python: nothing else is allowed)
_SAFE_BUILTINS = {"abs", "round", "min", "max", "pow", "float", "int", "str", "bool", "True", "False", "None"}
#: syntax a formula term may use: names, calls, constants, arithmetic, comparisons, np.<function>
_SAFE_NODES = (ast.Expression, ast.Name, ast.Load, ast.Call, ast.Constant, ast.keyword, ast.BinOp, ast.UnaryOp,
               ast.operator, ast.unaryop, ast.Compare, ast.cmpop, ast.Attribute, ast.Tuple, ast.List)


def _names_in(code: str) -> set[str]:
    """The names a formula term reads, after checking it is only data columns, arithmetic and the
    allowed functions: patsy evaluates terms as Python, so ``__import__('os').system(...)`` in a
    (shared) study spec would run."""
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as exc:
        raise UserError(f"cannot parse formula term {code!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        bad = (type(node).__name__ if not isinstance(node, _SAFE_NODES) else
               f"'{node.attr}'" if isinstance(node, ast.Attribute) and not (
                   isinstance(node.value, ast.Name) and node.value.id == "np" and not node.attr.startswith("_")) else
               f"'{node.id}'" if isinstance(node, ast.Name) and node.id.startswith("_") else None)
        if bad:
            raise UserError(f"formula term {code!r} uses {bad}, which a formula may not; use data columns, "
                            "arithmetic and C, I, Q, log, exp, sqrt, abs or np.<function>")
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _known_names() -> set[str]:
    import patsy.builtins

    return set(patsy.builtins.__all__) | set(_FORMULA_ENV) | (_SAFE_BUILTINS & set(dir(builtins)))


def parse_formula(formula: str, columns: list[str]) -> tuple[object, str, list[str]]:
    """Parse ``formula`` with patsy; return (ModelDesc, response column, columns used on the RHS).

    Raises a UserError naming any variable that is not a column of the data.
    """
    import patsy

    if "~" not in formula:
        raise UserError(f"formula {formula!r} has no '~'; write it as 'y ~ a * b'")
    try:
        desc = patsy.ModelDesc.from_formula(formula)
    except patsy.PatsyError as exc:
        raise UserError(f"cannot parse formula {formula!r}: {str(exc).splitlines()[0]}") from None
    lhs_codes = [f.code for t in desc.lhs_termlist for f in t.factors]
    if len(lhs_codes) != 1:
        raise UserError(f"formula {formula!r} must have exactly one response on the left of '~'")
    known = _known_names()
    cols = set(columns)
    used: list[str] = []
    for code in lhs_codes + [f.code for t in desc.rhs_termlist for f in t.factors]:
        for name in sorted(_names_in(code)):
            if name in cols:
                if name not in used:
                    used.append(name)
            elif name not in known:
                raise UserError(
                    f"formula names column {name!r} that is not in the data (columns: {', '.join(columns)})"
                )
    response = lhs_codes[0]
    if response not in cols:
        raise UserError(f"response {response!r} must be a column of the data (columns: {', '.join(columns)})")
    rhs_used = [c for c in used if c != response]
    return desc, response, rhs_used


def _apply_coding(desc: object, data: pd.DataFrame, coding: str) -> object:
    """Return a ModelDesc whose bare categorical factors use ``coding`` (see module docstring)."""
    import patsy

    if coding not in CODINGS:
        raise UserError(f"unknown coding {coding!r}; valid: {', '.join(CODINGS)}")
    if coding == "treatment":
        return desc
    terms = []
    for term in desc.rhs_termlist:
        factors = []
        for f in term.factors:
            code = f.code
            if code in data.columns and _is_categorical(data[code]):
                f = patsy.EvalFactor(f"C({code}, Sum)")
            factors.append(f)
        terms.append(patsy.Term(factors))
    return patsy.ModelDesc(desc.lhs_termlist, terms)


SUM_TO_ZERO = "(sum-to-zero)"
FULL_DUMMY = "(none: one column per level)"


def _contrast_reference(categories: tuple, matrix: np.ndarray) -> str:
    """Reference label of one factor from the contrast matrix patsy used (rows = levels).

    Treatment coding: the level whose row is all zeros (its coefficient is absorbed by the
    intercept). Sum coding: :data:`SUM_TO_ZERO` (the last level's row is all -1). Full-rank dummy
    coding (no intercept): :data:`FULL_DUMMY`. Any other contrast is named ``(custom contrast)``.
    """
    k, m = matrix.shape
    if m == k:
        return FULL_DUMMY
    zero_rows = np.flatnonzero(np.all(matrix == 0.0, axis=1))
    if m == k - 1 and zero_rows.size == 1:
        rest = np.delete(matrix, zero_rows[0], axis=0)
        if np.array_equal(rest, np.eye(m)):
            return str(categories[zero_rows[0]])
    if m == k - 1 and np.array_equal(matrix[:-1], np.eye(m)) and np.all(matrix[-1] == -1.0):
        return SUM_TO_ZERO
    return "(custom contrast)"


def reference_levels_of(design_info: object, columns: list[str]) -> dict[str, str]:
    """Reference level of every categorical factor, read from the fitted patsy design itself.

    patsy orders levels by the pandas Categorical's ``categories`` (ordered or not), by sorted
    value otherwise (numerically for a numeric column wrapped in ``C()``), and honours
    ``Treatment(reference=...)`` / ``levels=``; reading the contrast matrices it actually used
    (rather than re-sorting the values) keeps the report in step with the coefficients. A factor
    is keyed by its data column when it uses exactly one (``batch``, ``C(batch)``,
    ``C(batch, Sum)``), else by its formula code. The coding of a factor's first term that
    drops a level (its main effect, normally) is reported.
    """
    cols = set(columns)
    label_of: dict[object, str] = {}  # factor -> label, in first-seen order
    for subterms in design_info.term_codings.values():
        for sub in subterms:
            for factor, cm in sub.contrast_matrices.items():
                cats = tuple(design_info.factor_infos[factor].categories)
                label = _contrast_reference(cats, np.asarray(cm.matrix, dtype=np.float64))
                if label_of.get(factor, FULL_DUMMY) == FULL_DUMMY:
                    label_of[factor] = label
    out: dict[str, str] = {}
    for factor, label in label_of.items():
        named = _names_in(factor.code) & cols
        key = next(iter(named)) if len(named) == 1 else factor.code
        out[factor.code if key in out else key] = label
    return out


def as_patsy_categoricals(data: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``data`` with each non-numeric (or bool) column of ``columns`` as a pandas Categorical.

    patsy reads the levels and integer codes of a Categorical in one vectorized step but walks
    any other column value by value (about 40 s for a 1M-row string column). The categories are
    the values sorted with patsy's own key, so levels, reference levels and term names are those
    patsy would have chosen; a column that already is a Categorical keeps its own order.
    """
    from patsy.util import SortAnythingKey

    out = {}
    for c in columns:
        s = data[c]
        if _is_categorical(s) and not isinstance(s.dtype, pd.CategoricalDtype):
            codes, uniques = pd.factorize(s)
            order = sorted(range(len(uniques)), key=lambda i: SortAnythingKey(uniques[i]))  # noqa: B023
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(len(order))
            out[c] = pd.Categorical.from_codes(rank[codes], categories=uniques.take(order))
    return data.assign(**out) if out else data


def check_columns(data: pd.DataFrame, columns: list[str]) -> None:
    """NaNs in any used column are an error (no silent row dropping)."""
    for c in columns:
        n_bad = int(data[c].isna().sum())
        if n_bad:
            raise UserError(f"column {c!r} has {n_bad} missing/NaN values; drop or fill those rows first")


def _response_values(data: pd.DataFrame, response: str) -> np.ndarray:
    """The response column as float64, or one UserError: not numeric, not finite, squares that overflow (the
    fit's sums of squares would be inf: a NaN table, exit 0), or constant."""
    yv = data[response]
    if not pd.api.types.is_numeric_dtype(yv) or pd.api.types.is_bool_dtype(yv):
        raise UserError(f"response column {response!r} is not numeric (dtype {yv.dtype}); choose a numeric column as the response, or fix its values")
    y = yv.to_numpy(dtype=np.float64)
    if not np.all(np.isfinite(y)):
        raise UserError(f"response column {response!r} has infinite values; drop or fix those rows")
    with np.errstate(over="ignore", invalid="ignore"):
        squares_overflow = not np.isfinite(np.sum(np.square(y - y.mean())))
    if squares_overflow:  # the fit's sums of squares would be inf: a NaN table, exit 0
        raise UserError(f"response column {response!r} has values up to {float(np.max(np.abs(y))):.3g}, whose squares "
                        "overflow float64; rescale it (e.g. divide by a power of ten) and fit again")
    if np.ptp(y) == 0.0:
        raise UserError(f"response column {response!r} is constant ({float(y[0]):g}); nothing to model: "
                        "choose a response that varies")
    return y


def build_design(
    data: pd.DataFrame,
    formula: str,
    groups: list[str],
    coding: str = "treatment",
    re_formula: str | None = None,
) -> Design:
    """Validate ``data`` and build y, X and the random-effects blocks for one fit."""
    import patsy

    if not isinstance(data, pd.DataFrame) or len(data) == 0:
        raise UserError("the data table is empty; give a table with one row per observation (a header and rows)")
    columns = [str(c) for c in data.columns]
    desc, response, rhs_used = parse_formula(formula, columns)
    desc = _apply_coding(desc, data, coding)
    if not groups:
        raise UserError("give at least one grouping column (--group), e.g. the prompt id")
    for g in groups:
        if g not in data.columns:
            raise UserError(f"grouping column {g!r} is not in the data (columns: {', '.join(columns)})")
    if len(set(groups)) != len(groups):
        raise UserError(f"grouping columns repeated: {groups}; name each --group column once")
    re_used: list[str] = []
    if re_formula is not None:
        if len(groups) != 1:
            raise UserError("random slopes (--re-formula) are supported with a single --group only")
        re_rhs = re_formula.split("~", 1)[-1]
        re_desc_probe = parse_formula(f"{response} ~ {re_rhs}", columns)
        re_used = re_desc_probe[2]
    used = [response] + rhs_used + [c for c in re_used if c not in rhs_used] + list(groups)
    check_columns(data, used)

    y = _response_values(data, response)
    for g in groups:  # lme4's check: a random intercept per observation is confounded with the residual
        n_levels = int(data[g].nunique(dropna=False))
        if n_levels >= len(data):
            raise UserError(f"grouping column {g!r} has {n_levels} levels for {len(data)} rows: each group needs more "
                            "than one observation (its variance is not told apart from the residual's); group by a "
                            "column with repeated values, e.g. the prompt")

    env = patsy.EvalEnvironment([_FORMULA_ENV])
    data = as_patsy_categoricals(data, [c for c in used if c not in groups])
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():  # a transform's NaN is refused below, in one line
            warnings.simplefilter("ignore", RuntimeWarning)
            Xdf = patsy.dmatrix(
                patsy.ModelDesc([], desc.rhs_termlist),
                data,
                eval_env=env,
                return_type="dataframe",
                NA_action="raise",
            )
    except patsy.PatsyError as exc:
        raise UserError(f"cannot build the design of {formula!r}: {str(exc).splitlines()[0]}; check that every "
                        "column it names has no missing values and every transform (log, sqrt) is defined on "
                        "them") from None
    X = Xdf.to_numpy(dtype=np.float64)
    if X.shape[1] == 0:
        raise UserError(f"formula {formula!r} has no fixed effects")
    rank = np.linalg.matrix_rank(X)
    if rank < X.shape[1]:
        raise UserError(
            f"fixed-effects design of {formula!r} is rank deficient ({rank} < {X.shape[1]} columns): "
            "some terms are collinear or a factor combination has no rows"
        )

    reference_levels = reference_levels_of(Xdf.design_info, columns)
    blocks = tuple(random_effect_block(data, g, re_formula, env) for g in groups)
    fixed_names = tuple("(Intercept)" if n == "Intercept" else n for n in Xdf.columns)
    return Design(response, y, X, fixed_names, blocks, reference_levels, tuple(used))


def random_effect_block(data: pd.DataFrame, group: str, re_formula: str | None, env: object) -> REBlock:
    """The term ``(1|group)``, or ``(re_formula|group)`` for random slopes (levels sorted)."""
    import patsy

    codes, uniques = pd.factorize(data[group], sort=True)
    if len(uniques) < 2:
        raise UserError(
            f"grouping column {group!r} has only one level ({uniques[0]!r}); a random effect needs >= 2"
        )
    if re_formula is None:
        return REBlock(group, codes.astype(np.int64), len(uniques), np.ones((len(data), 1)), ("(Intercept)",))
    re_rhs = re_formula.split("~", 1)[-1]
    zdf = patsy.dmatrix(re_rhs, data, eval_env=env, return_type="dataframe", NA_action="raise")
    if zdf.shape[1] == 0:
        raise UserError(f"random-effects formula {re_formula!r} has no terms")
    names = tuple("(Intercept)" if n == "Intercept" else n for n in zdf.columns)
    return REBlock(group, codes.astype(np.int64), len(uniques), zdf.to_numpy(dtype=np.float64), names)


def read_table(path: str) -> pd.DataFrame:
    """Read a CSV or Parquet table; anything else is a UserError."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise UserError(f"data file {path} is a folder, not a table; give a .csv or .parquet file in it"
                        if p.is_dir() else f"data file {path} does not exist; check the path (a .csv or .parquet table)")
    suffix = p.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(p)
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(p)
    except Exception as exc:  # malformed file: one line, no traceback
        raise UserError(f"cannot read {path}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}; give a readable .csv or .parquet table") from None
    raise UserError(f"data file {path} must be .csv or .parquet")
