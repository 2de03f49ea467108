"""The human preference study: pair design, the rating web app, and its analysis.

The paper's strongest claim about image quality is a human study: checkpoints that bracket a
matched reward (e.g. PCPO at epoch 120 against DDPO at 180 and 240), 45 prompts x 10 seeds, about
300 responses. This stage runs one over a finished study, in four steps::

    pcpo-eval human design STUDY --config FILE --out HUMAN   # 1. pairs.parquet + anonymised images
    pcpo-eval human raters HUMAN --add alice --add bob --base-url https://rate.example.org
                                                             #    one private link per rater
    pcpo-eval human serve HUMAN                              # 2. the rating web app (uvicorn + SQLite)
    pcpo-eval human analyze HUMAN                            # 3. analysis.json + the report section

Modules (one job each):

* :mod:`~pcpo_eval.human.design`   -- which checkpoints meet, prompts x seeds, sides, order, attention checks
* :mod:`~pcpo_eval.human.db`       -- the database schema (SQLAlchemy) and its Alembic migrations
* :mod:`~pcpo_eval.human.settings` -- what the app needs from a design or a bundle (derived secrets)
* :mod:`~pcpo_eval.human.bundle`   -- the serving bundle: what the app needs, nothing that unblinds
* :mod:`~pcpo_eval.human.app`      -- the FastAPI app a rater sees (no method names anywhere in it)
* :mod:`~pcpo_eval.human.report`   -- ``human analyze``: the analysis files and the study report section
* :mod:`~pcpo_eval.human.analysis` -- ``human analyze``'s sections: checks, win rates, Bradley-Terry, agreement
* :mod:`~pcpo_eval.human.glmm`     -- the mixed logistic model of one comparison (on :mod:`pcpo_eval.stats.glmer`)
* :mod:`~pcpo_eval.human.tables`   -- the pairs and responses tables: required columns, validation
* :mod:`~pcpo_eval.human.simulate` -- simulated raters with planted preferences (rehearsals, tests)

The general statistics (exact binomial intervals and tests, Bradley-Terry, Krippendorff's alpha)
live in :mod:`pcpo_eval.stats.pairwise`.

The folder ``HUMAN/`` (one home for its layout: :class:`HumanLayout`)::

    HUMAN/design.json        every setting of the design (study, comparisons, prompts, seeds, rng seed)
    HUMAN/pairs.parquet      one row per pair (columns: PAIR_COLUMNS)
    HUMAN/images/<tok>.png   every image shown, re-encoded without metadata under an opaque name
    HUMAN/human.db           the SQLite database (default; PostgreSQL by URL instead)
    HUMAN/responses.parquet  the admin export (columns: RESPONSE_COLUMNS)
    HUMAN/analysis.json      the analysis (read by the study report)
    HUMAN/server.json        the address raters open (``--base-url``, remembered)
    HUMAN/rehearsal/         the analysis of simulated responses (never the study report)

A serving bundle (``pcpo-eval human bundle HUMAN --out SERVE``, :mod:`~pcpo_eval.human.bundle`) is
the same layout less everything that unblinds: ``SERVE/bundle.json`` instead of ``design.json``,
``pairs.parquet`` with the served columns only, ``images/``; the app, ``raters`` and ``export`` run
on it as on ``HUMAN``.

Pairs table (``pairs.parquet``): ``pair_id`` (opaque 16-hex token, the only id a rater sees),
``position`` (0.. the design's randomised order), ``comparison`` (e.g. ``"pcpo@120 vs ddpo@180"``),
``kind`` (``main`` | ``identical`` | ``degraded``: the attention checks), ``prompt_id``,
``prompt``, ``seed``, ``left_method`` / ``right_method`` (checkpoint labels such as ``pcpo@120``),
``left_image`` / ``right_image`` (image tokens: file ``images/<token>.png``), ``expected``
(attention checks: ``tie`` for identical images, the undegraded side ``left``/``right`` for a
degraded one; empty for ``main``).

Responses (database and export): ``rater`` (the rater's display name), ``rater_id`` (integer),
``pair_id``, ``choice`` (``left`` | ``right`` | ``tie``), ``reason`` (optional free text, at
most 500 characters), ``submitted_at`` (UTC ISO 8601), ``first_choice`` (the first answer, never
changed), ``corrections`` (undo / re-answer rows), ``seconds`` (from the app serving the pair's
page to the standing answer; NaN when not recorded, e.g. simulated). One response per (rater, pair): a second
submit of the same pair is answered with the stored response and changes nothing; after an undo
the re-answer is stored as a correction and becomes the standing ``choice``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PAIR_COLUMNS = ("pair_id", "position", "comparison", "kind", "prompt_id", "prompt", "seed", "left_method",
                "right_method", "left_image", "right_image", "expected")
RESPONSE_COLUMNS = ("rater", "rater_id", "pair_id", "choice", "reason", "submitted_at", "first_choice", "corrections",
                    "seconds", "revoked", "revoked_at")
CHOICES = ("left", "right", "tie")
KINDS = ("main", "identical", "degraded")
MAX_REASON = 500
ALPHA = 0.05  # significance level of the analysis' verdicts (and 1 - the level of its CIs)
#: ``comparison_seeds`` of a design: ``distinct`` (the default: comparison k on seeds k*S .. k*S+S-1, so no
#: image is shown in two comparisons) or ``shared`` (every comparison on seeds 0 .. S-1).
COMPARISON_SEEDS = ("distinct", "shared")
#: What a design.json written before ``comparison_seeds`` existed used.
LEGACY_COMPARISON_SEEDS = "shared"

# The file names of ``HUMAN/`` (spelled here only: tests/repo/test_file_names.py); :class:`HumanLayout` gives the paths.
#: every setting of the design; written last, so a folder with it is a finished design
DESIGN_FILE = "design.json"
#: one row per pair (PAIR_COLUMNS)
PAIRS_FILE = "pairs.parquet"
#: the default SQLite database
DATABASE_FILE = "human.db"
#: the files SQLite keeps beside a database (write-ahead log, shared memory, rollback journal): answers acknowledged
#: to raters may live only in the ``-wal`` file until a checkpoint, so nothing may overwrite them either
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
#: the admin export of the responses (RESPONSE_COLUMNS)
RESPONSES_FILE = "responses.parquet"
#: the analysis (also in ``HUMAN/rehearsal/`` for simulated responses)
ANALYSIS_FILE = "analysis.json"
#: one line per ``human analyze`` of real answers: when, final or interim, how many answers and raters
LOOKS_FILE = "looks.jsonl"
#: the remembered public address of the app
SERVER_FILE = "server.json"
#: a serving bundle's settings (``pcpo-eval human bundle``: the derived secrets, no blinding secret)
BUNDLE_FILE = "bundle.json"
#: the blinding secret of a design being rendered (private, mode 0600; removed once ``design.json`` holds
#: it): an interrupted ``human design`` resumes on the same secret seeds
PENDING_SECRET_FILE = ".design_secret"


def shown_png(pixels: np.ndarray) -> bytes:
    """The bytes of a shown image: an uncompressed PNG (zlib level 0) of uint8 RGB ``pixels`` (H, W, 3),
    no metadata chunk.

    Blinding: a compressed PNG's size, and the lengths of its chunks that any PNG viewer shows, follow
    how well its pixels compress, so one arm's images (smoother, or carrying an invisible +-1 dither)
    would be the smaller or the larger file of every pair. Stored (level-0) deflate blocks make every
    length a function of the width and height alone: the two images of a pair (same grid, checked by the
    design) have the same length and the same chunk layout, byte for byte apart from the pixels
    (``tests/human/test_image_format.py``). The design writes its images so and the app serves them so."""
    from PIL import Image

    arr = np.ascontiguousarray(pixels, dtype=np.uint8)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected uint8 (H, W, 3) pixels, got shape {arr.shape}")
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="PNG", compress_level=0)
    return buf.getvalue()


@dataclass(frozen=True)
class HumanLayout:
    """The paths of one human-study folder."""

    root: Path

    @property
    def design(self) -> Path:
        return self.root / DESIGN_FILE

    @property
    def pairs(self) -> Path:
        return self.root / PAIRS_FILE

    @property
    def bundle(self) -> Path:
        """A serving bundle's settings (present instead of ``design.json``: :mod:`pcpo_eval.human.bundle`)."""
        return self.root / BUNDLE_FILE

    @property
    def images(self) -> Path:
        return self.root / "images"

    def image(self, token: str) -> Path:
        return self.images / f"{token}.png"

    @property
    def pending_secret(self) -> Path:
        """The secret of a design still rendering (:data:`PENDING_SECRET_FILE`)."""
        return self.root / PENDING_SECRET_FILE

    @property
    def database(self) -> Path:
        return self.root / DATABASE_FILE

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.database}"

    @property
    def responses(self) -> Path:
        return self.root / RESPONSES_FILE

    @property
    def analysis(self) -> Path:
        return self.root / ANALYSIS_FILE

    @property
    def looks(self) -> Path:
        """The log of analyses run on the study's answers (:data:`LOOKS_FILE`; interim looks and the final)."""
        return self.root / LOOKS_FILE

    def read_looks(self) -> list[dict]:
        """The analyses logged so far (:attr:`looks`; a damaged line is an error, :func:`pcpo_eval.io.read_jsonl`)."""
        from pcpo_eval.io import read_jsonl

        return read_jsonl(self.looks, "human study's log of analyses")

    def closed_at(self) -> str | None:
        """When a ``human analyze --final`` closed the study: its logged look in :attr:`looks`, else the written
        :attr:`analysis`'s own record (a deleted or cut ``looks.jsonl`` reopened a closed study before); None while
        it is open. A closed study's report labels the shown images by checkpoint, so the app serves no more
        pairs and no rater is added or given a new link (a rater who saw the report could tell the sides apart)."""
        import json

        finals = [x for x in self.read_looks() if x.get("final")]
        if finals:
            return str(finals[-1].get("at"))
        try:
            written = json.loads(self.analysis.read_text()) if self.analysis.is_file() else {}
        except (OSError, ValueError):
            return None
        final = isinstance(written, dict) and isinstance(written.get("looks"), dict) and written["looks"].get("final")
        return "recorded in analysis.json" if final else None

    def require_open(self, action: str) -> None:
        """One :class:`~pcpo_eval.errors.UserError` when the study is closed (:meth:`closed_at`) and ``action``
        (e.g. "serve pairs", "add raters") would show its pairs to a rater again."""
        from pcpo_eval.errors import UserError

        closed = self.closed_at()
        if closed:
            raise UserError(f"{self.root} was closed by a `human analyze --final` ({closed}), whose report labels the "
                            f"shown images by checkpoint, so it cannot {action}; for more answers design a new "
                            "study (`human design ... --out NEW`)")

    @property
    def server(self) -> Path:
        """The remembered public address of the app (``human raters/serve --base-url``)."""
        return self.root / SERVER_FILE

    def remembered_base_url(self) -> str | None:
        """The address :attr:`server` remembers (None: none, or an unreadable file)."""
        import json

        try:
            saved = json.loads(self.server.read_text()).get("base_url")
        except (OSError, ValueError, AttributeError):
            return None
        return saved if isinstance(saved, str) else None

    @property
    def rehearsal(self) -> Path:
        """Where the analysis of simulated responses goes (never the study's report)."""
        return self.root / "rehearsal"

    def data_paths(self, responses: bool = True) -> list[Path]:
        """What an output of ``human simulate`` / ``export`` must never overwrite (:func:`pcpo_eval.io.check_not_an_input`):
        the design or bundle, the pairs, the images, the database, the analysis, the address, and (unless
        ``responses`` is False: ``export`` rewrites its own default) the exported responses. The database's
        SQLite files (:data:`SQLITE_SIDECARS`) too: an export written over ``human.db-wal`` lost every answer
        a server had not yet checkpointed (17 of 17 after a crash)."""
        return [self.design, self.bundle, self.pairs, self.images, self.database,
                *(self.database.with_name(self.database.name + x) for x in SQLITE_SIDECARS), self.analysis, self.looks,
                self.server, self.root / "sets", *([self.responses] if responses else [])]


def design_comparison_seeds(design: dict, where: Path | str) -> str:
    """``comparison_seeds`` of a ``design.json`` mapping (absent: a design written before the setting,
    :data:`LEGACY_COMPARISON_SEEDS`); any other value is a one-line UserError."""
    from pcpo_eval.errors import UserError

    value = design.get("comparison_seeds", LEGACY_COMPARISON_SEEDS)
    if value not in COMPARISON_SEEDS:
        raise UserError(f"{where}: comparison_seeds {value!r} must be distinct or shared; rerun "
                        "`pcpo-eval human design`")
    return str(value)
