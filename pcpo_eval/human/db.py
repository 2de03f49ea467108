"""The rating database: SQLAlchemy models, Alembic migrations and the admin helpers.

Tables (the migrations ``0001_initial``, ``0002_revoke_and_corrections``, ``0003_answer_seconds`` and
``0004_revocation_history`` create them):

* ``raters``    -- ``id``, ``name`` (unique), ``token`` (``secrets.token_urlsafe(24)``, unique: the
  secret in a rater's link), ``created_at``;
* ``pairs``     -- ``pair_id`` (primary key), ``position``, ``prompt``, ``left_image``, ``right_image``:
  the only columns of ``pairs.parquet`` a rater may see. Method names, comparisons and kinds stay
  in ``pairs.parquet`` on the server and never enter the database;
* ``responses`` -- ``id``, ``rater_id``, ``pair_id``, ``choice``, ``reason``, ``submitted_at``, with
  ``UNIQUE(rater_id, pair_id)``: the first answer wins, a resubmit returns it unchanged;
* ``corrections`` (migration ``0002``, which also adds ``raters.revoked_at``) -- an undo of the
  rater's last answer (``choice`` NULL) and the re-answer after it, numbered by ``seq`` with
  ``UNIQUE(rater_id, pair_id, seq)``; ``responses`` is never updated, so no first answer is lost;
* ``seconds`` (migration ``0003``, on ``responses`` and ``corrections``) -- seconds from the app
  serving the pair's page to the answer (NULL when not known);
* ``revocations`` (migration ``0004``) -- ``rater_id``, ``revoked_at``, ``reinstated_at``: every
  revocation of a rater's link and the rotate that ended it (NULL while revoked), so that a rotate
  keeps the record that answers were given on a revoked link (``raters.revoked_at`` is the state now).

SQLite is the default (``sqlite:///HUMAN/human.db``), in WAL mode with a 60 s busy timeout and
``synchronous=FULL``, so concurrent writers wait instead of failing and an answer acknowledged to
a rater survives a SIGKILL. Every statement is dialect-neutral SQLAlchemy, so a PostgreSQL URL
works too (with its driver installed). The migrations run programmatically (:func:`upgrade`); no
``alembic.ini`` is needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
from sqlalchemy import (
    CheckConstraint,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from pcpo_eval.errors import UserError
from pcpo_eval.human import CHOICES, KINDS, MAX_REASON, RESPONSE_COLUMNS, SQLITE_SIDECARS
from pcpo_eval.io import atomic_write_parquet

MIGRATIONS = Path(__file__).parent / "migrations"
#: The columns of ``pairs.parquet`` copied into the database (nothing that names a method).
DB_PAIR_COLUMNS = ("pair_id", "position", "prompt", "left_image", "right_image")
TOKEN_RE = re.compile(r"^[0-9a-f]{16,64}$")
MAX_NAME = 100
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of the rating database (constraint names fixed by :data:`NAMING`)."""

    metadata = MetaData(naming_convention=NAMING)


class Rater(Base):
    """One rater: a display name and the secret token of their link."""

    __tablename__ = "raters"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME), unique=True, nullable=False)
    token: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Revocation(Base):
    """One revocation of a rater's link: since ``revoked_at`` until the rotate at ``reinstated_at``
    (NULL: still revoked)."""

    __tablename__ = "revocations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rater_id: Mapped[int] = mapped_column(ForeignKey("raters.id"), nullable=False)
    revoked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    reinstated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Pair(Base):
    """One pair as a rater sees it: opaque id, prompt and two opaque image tokens."""

    __tablename__ = "pairs"
    pair_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, nullable=False)
    prompt: Mapped[str] = mapped_column(Text, nullable=False)
    left_image: Mapped[str] = mapped_column(String(64), nullable=False)
    right_image: Mapped[str] = mapped_column(String(64), nullable=False)


class Response(Base):
    """One answer of one rater to one pair (unique per rater and pair)."""

    __tablename__ = "responses"
    __table_args__ = (
        UniqueConstraint("rater_id", "pair_id"),
        CheckConstraint("choice IN ('left', 'right', 'tie')", name="choice"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rater_id: Mapped[int] = mapped_column(ForeignKey("raters.id"), nullable=False)
    pair_id: Mapped[str] = mapped_column(ForeignKey("pairs.pair_id"), nullable=False)
    choice: Mapped[str] = mapped_column(String(8), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False, default="")
    submitted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True)


class Correction(Base):
    """An undo (``choice`` NULL) or a re-answer after an undo of one (rater, pair); ``seq`` 1, 2, ..."""

    __tablename__ = "corrections"
    __table_args__ = (
        UniqueConstraint("rater_id", "pair_id", "seq"),
        CheckConstraint("choice IS NULL OR choice IN ('left', 'right', 'tie')", name="choice"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rater_id: Mapped[int] = mapped_column(ForeignKey("raters.id"), nullable=False)
    pair_id: Mapped[str] = mapped_column(ForeignKey("pairs.pair_id"), nullable=False)
    seq: Mapped[int] = mapped_column(Integer, nullable=False)
    choice: Mapped[str | None] = mapped_column(String(8), nullable=True)
    reason: Mapped[str] = mapped_column(Text, nullable=False, default="")
    submitted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True)


@dataclass(frozen=True)
class RaterInfo:
    """A rater as the app needs it."""

    id: int
    name: str


@dataclass(frozen=True)
class StoredResponse:
    """A stored answer, and whether this submit created it (False: it was already there)."""

    choice: str
    reason: str
    created: bool


# ---- engines and migrations --------------------------------------------------------------------

_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout = 60000")
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = FULL")
    cur.execute("PRAGMA foreign_keys = ON")
    cur.close()


def _check_url(url: str) -> None:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(f"database URL {url!r} is malformed; use e.g. sqlite:///HUMAN/human.db "
                        "or postgresql+psycopg://user@host/db") from None
    db = parsed.database
    if parsed.get_backend_name() == "sqlite" and db not in (None, "", ":memory:") and not db.startswith("file:"):
        parent = Path(db).parent
        if not parent.is_dir():
            raise UserError(f"database folder {parent} does not exist; create it or pass another database URL")


def sqlite_files(url: str) -> list[Path]:
    """The files of the SQLite database at ``url`` (the database and :data:`~pcpo_eval.human.SQLITE_SIDECARS`);
    none for another database or an in-memory one: what no output may overwrite."""
    f = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
    if not f or f.startswith("file:") or f == ":memory:":
        return []
    return [Path(f), *(Path(f + x) for x in SQLITE_SIDECARS)]


def require_stored(url: str, folder: str | Path, alternative: str) -> None:
    """A UserError when ``url`` is a SQLite file that does not exist: a command that only reads answers
    (``analyze``, ``export``) would create an empty database and find none. Before, ``human export`` on a
    folder whose answers were collected elsewhere (or with a mistyped ``--database-url``) replaced a good
    ``responses.parquet`` with 0 rows, exit 0. ``alternative``: the other way to go on, for the message."""
    f = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
    if f and not f.startswith("file:") and not Path(f).is_file():
        raise UserError(f"{folder} has no database at {f}; serve the study (`pcpo-eval human serve {folder}`) and "
                        f"collect answers first, give its database with --database-url, or {alternative}")


def shown_url(url: str) -> str:
    """``url`` with its password hidden (for messages)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<malformed URL>"


def _db_problem(url: str, exc: BaseException) -> str:
    """One line naming what is wrong with the database at ``url`` and the fix."""
    where = shown_url(url)
    if isinstance(exc, ImportError):
        driver = getattr(exc, "name", None) or str(exc).split()[-1].strip("'\"")
        return (f"database {where}: its driver {driver!r} is not installed; install it (PostgreSQL: "
                "pip install -e '.[postgres]') or use the default SQLite database")
    orig = getattr(exc, "orig", None) or exc
    text = " ".join(str(orig).split())[:200]
    low = text.lower()
    if "readonly" in low or "read-only" in low or "read only" in low:
        return (f"database {where} is read-only ({text}); make the file and its folder writable by this user "
                "or pass a writable --database-url")
    if "file is not a database" in low or "not a database" in low:
        return f"{where} is not a SQLite database ({text}); move that file away or pass another --database-url"
    if "unable to open database file" in low:
        return f"cannot open database {where} ({text}); check the path and its permissions"
    if isinstance(exc, NoSuchModuleError):
        return f"database URL {where} names an unknown database type; use sqlite:///... or postgresql+psycopg://..."
    if url.startswith("sqlite"):  # a local file: no server to reach
        return (f"SQLite database {where} failed ({type(orig).__name__}: {text or 'no message'}); the file may be "
                "damaged or cut short: restore it from a copy (human export keeps the answers), or pass another "
                "--database-url")
    return (f"database {where} failed ({type(orig).__name__}: {text or 'no message'}); check that it is running "
            "and reachable, or pass another --database-url")


@contextmanager
def database_errors(url: str) -> Iterator[None]:
    """Turn any database failure (unreachable server, missing driver, read-only or foreign file) into
    one :class:`UserError` line naming the database (password hidden) and the fix."""
    try:
        yield
    except UserError:
        raise
    except (SQLAlchemyError, ImportError) as exc:
        raise UserError(_db_problem(url, exc)) from None


def check_writable(url: str) -> None:
    """Fail now (UserError) unless the database at ``url`` is reachable and accepts writes.

    Writes the schema version onto itself in a transaction that is rolled back: a read-only SQLite
    file (or a PostgreSQL user without write rights) fails here instead of at the first answer.
    """
    with database_errors(url), get_engine(url).connect() as conn:
        trans = conn.begin()
        try:
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = version_num")
        finally:
            trans.rollback()


def _create_private(db: str | None) -> None:
    """Create a new SQLite file ``db`` with mode 0600 before SQLite opens it: it holds every rater's token
    (their credential), and SQLite gives its ``-wal`` and ``-shm`` files the database file's mode. An existing
    file keeps its mode (``human serve`` warns when others may read it: :func:`pcpo_eval.human.app.serve`)."""
    if db in (None, "", ":memory:") or db.startswith("file:"):
        return
    with contextlib.suppress(FileExistsError, OSError):  # OSError: the folder check (_check_url) says it
        os.close(os.open(db, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def get_engine(url: str) -> Engine:
    """The process-wide engine of ``url`` (SQLite: WAL, busy timeout, foreign keys on)."""
    with _ENGINES_LOCK:
        if url in _ENGINES:
            return _ENGINES[url]
        _check_url(url)
        if make_url(url).get_backend_name() == "sqlite":
            _create_private(make_url(url).database)
            engine = create_engine(url, connect_args={"timeout": 60, "check_same_thread": False},
                                   pool_size=8, max_overflow=16, hide_parameters=True)
            event.listen(engine, "connect", _sqlite_pragmas)
        else:
            engine = create_engine(url, pool_pre_ping=True, hide_parameters=True)  # tokens never in errors
        _ENGINES[url] = engine
        return engine


def dispose(url: str) -> None:
    """Close the pooled connections of ``url`` (tests; a server shutting down)."""
    with _ENGINES_LOCK:
        engine = _ENGINES.pop(url, None)
    if engine is not None:
        engine.dispose()


def alembic_config(url: str) -> Any:
    """An Alembic ``Config`` pointing at the packaged migrations (no ``alembic.ini``)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str) -> None:
    """Migrate the database at ``url`` to the newest schema (a no-op when it is already there)."""
    from alembic import command

    cfg = alembic_config(url)
    with get_engine(url).begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def schema_diff(url: str) -> list[Any]:
    """Alembic's differences between the database at ``url`` and the models (empty: in sync)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with get_engine(url).connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))


# ---- pairs -------------------------------------------------------------------------------------


def _pair_records(pairs_df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rater-visible columns of ``pairs_df`` as validated records."""
    missing = [c for c in DB_PAIR_COLUMNS if c not in pairs_df.columns]
    if missing:
        raise UserError(f"pairs table lacks column(s) {', '.join(missing)}; rerun `pcpo-eval human design`")
    records = [{"pair_id": str(r.pair_id), "position": int(r.position), "prompt": str(r.prompt),
                "left_image": str(r.left_image), "right_image": str(r.right_image)}
               for r in pairs_df[list(DB_PAIR_COLUMNS)].itertuples(index=False)]
    bad = [r["pair_id"] for r in records
           if not all(TOKEN_RE.match(r[k]) for k in ("pair_id", "left_image", "right_image"))]
    if bad:
        raise UserError(f"pairs table has non-hex pair or image tokens (e.g. {bad[0]!r}); "
                        "rerun `pcpo-eval human design`")
    if len({r["pair_id"] for r in records}) != len(records):
        raise UserError("pairs table has duplicated pair_id values; rerun `pcpo-eval human design`")
    return records


def _other_pairs(have: set, wanted: set) -> str:
    return (f"the database already holds a different pair set ({len(have)} pairs, not these {len(wanted)}); use a new "
            "database for a new design (move human.db away or pass another database URL)")


def check_pair_set(url: str, pairs_df: pd.DataFrame) -> None:
    """UserError when the database holds the pairs of another design (read only; an empty one passes):
    answers to other pairs analysed against these read as "no responses"."""
    have = _stored_pairs(get_engine(url))
    wanted = {tuple(r[c] for c in DB_PAIR_COLUMNS) for r in _pair_records(pairs_df)}
    if have and have != wanted:
        raise UserError(_other_pairs(have, wanted))


def load_pairs(url: str, pairs_df: pd.DataFrame) -> int:
    """Copy the rater-visible columns of ``pairs_df`` into the database; returns the number of pairs.

    Idempotent: loading the same pairs again changes nothing. A database that already holds a
    different pair set is refused (a new design needs a new database).
    """
    records = _pair_records(pairs_df)
    wanted = {tuple(r[c] for c in DB_PAIR_COLUMNS) for r in records}
    engine = get_engine(url)
    for _attempt in range(2):
        have = _stored_pairs(engine)
        if have == wanted:
            return len(wanted)
        if have:
            raise UserError(_other_pairs(have, wanted))
        try:
            with Session(engine) as session, session.begin():
                session.add_all(Pair(**r) for r in records)
        except IntegrityError:
            continue  # another process loaded the pairs at the same time: compare again
    return len(wanted)


def _stored_pairs(engine: Engine) -> set[tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(select(*(getattr(Pair, c) for c in DB_PAIR_COLUMNS))).all()
    return {tuple(row) for row in rows}


def pairs_frame(url: str) -> pd.DataFrame:
    """The pairs stored in the database (columns: DB_PAIR_COLUMNS), in ``position`` order."""
    with get_engine(url).connect() as conn:
        rows = conn.execute(select(*(getattr(Pair, c) for c in DB_PAIR_COLUMNS))
                            .order_by(Pair.position, Pair.pair_id)).all()
    return pd.DataFrame([tuple(r) for r in rows], columns=list(DB_PAIR_COLUMNS))


def block_counts(n_main: int, n_identical: int, n_degraded: int, per_rater: int | None) -> tuple[int, int, int]:
    """(main, identical, degraded) pairs in one rater's block of ``per_rater`` pairs.

    Each kind of check gets its share of the block, rounded, but at least one when the design has
    any (so every rater meets a degraded check and can be screened); the main pairs fill the rest.
    ``per_rater`` None or at least the design: every pair.
    """
    n = n_main + n_identical + n_degraded
    if per_rater is None or per_rater >= n:
        return n_main, n_identical, n_degraded

    def share(k: int) -> int:
        return 0 if k == 0 else min(k, max(1, round(per_rater * k / n)))

    k_d = min(share(n_degraded), per_rater)
    k_i = min(share(n_identical), per_rater - k_d)
    m = min(n_main, per_rater - k_d - k_i)
    while m + k_i + k_d < per_rater:  # few main pairs: the checks fill the block
        if k_d < n_degraded:
            k_d += 1
        if k_i < n_identical and m + k_i + k_d < per_rater:
            k_i += 1
    return m, k_i, k_d


def _order_key(seed: int | bytes, rater_id: int, pair_id: str) -> bytes:
    """Sort key of one pair in one rater's order: HMAC-SHA256 under a secret, or (legacy designs)
    SHA-256 of the public ``rng_seed``."""
    msg = f"{rater_id}:{pair_id}".encode()
    if isinstance(seed, bytes):
        return hmac.new(seed, b"order:" + msg, hashlib.sha256).digest()
    return hashlib.sha256(f"{seed}:".encode() + msg).digest()


def _window(pool: Sequence[str], start: int, count: int) -> list[str]:
    """``count`` consecutive items of ``pool`` from ``start``, cyclically."""
    return [pool[(start + i) % len(pool)] for i in range(count)] if pool else []


def assignment(pair_ids: Sequence[str], seed: int | bytes, rater_id: int, per_rater: int | None,
               kinds: Mapping[str, str] | None = None) -> list[str]:
    """The pairs of rater ``rater_id`` in the order they are shown (deterministic, resumable).

    ``pair_ids`` is the design's order (by ``position``). ``per_rater`` None (or the whole design):
    every pair. Otherwise, with ``kinds`` (pair id -> main / identical / degraded; designs with a
    blinding secret), the block is stratified: :func:`block_counts` main, identical and degraded
    pairs, each a cyclic run of its kind's pairs in design order starting at ``(r - 1) * count``,
    so consecutive raters cover each kind evenly, every rater meets the checks, and (the design
    lays main pairs out so: :func:`pcpo_eval.human.design.main_layout`) no rater gets two
    comparisons of one prompt and seed. Without ``kinds`` (legacy designs) the block is the cyclic
    run of ``per_rater`` pairs from ``(r - 1) * per_rater``. The order inside the block is sorted
    by :func:`_order_key` of ``seed`` (the design's secret; legacy: ``rng_seed``).
    """
    n = len(pair_ids)
    if per_rater is None or per_rater >= n:
        block = list(pair_ids)
    elif kinds is None:
        block = _window(pair_ids, ((rater_id - 1) * per_rater) % n if n else 0, per_rater)
    else:
        pools = {k: [p for p in pair_ids if kinds[p] == k] for k in KINDS}
        counts = block_counts(len(pools["main"]), len(pools["identical"]), len(pools["degraded"]), per_rater)
        block = []
        for kind, count in zip(KINDS, counts, strict=True):
            pool = pools[kind]
            block += _window(pool, ((rater_id - 1) * count) % len(pool) if pool else 0, count)
    return sorted(block, key=lambda p: _order_key(seed, rater_id, p))


# ---- raters ------------------------------------------------------------------------------------


def _clean_name(name: str) -> str:
    clean = str(name).strip()
    if not clean or len(clean) > MAX_NAME or any(ord(ch) < 32 or ord(ch) == 127 for ch in clean):
        raise UserError(f"rater name {name!r} is invalid; use 1 to {MAX_NAME} printable characters")
    return clean


def add_raters(url: str, names: Iterable[str]) -> list[tuple[str, str]]:
    """Create one rater per name; returns (name, token) pairs. A name already present is refused."""
    clean = [_clean_name(n) for n in names]
    dupes = sorted({n for n in clean if clean.count(n) > 1})
    if dupes:
        raise UserError(f"rater name(s) {', '.join(dupes)} given twice; give each name once")
    engine = get_engine(url)
    with engine.connect() as conn:
        taken = sorted(conn.execute(select(Rater.name).where(Rater.name.in_(clean))).scalars())
    if taken:
        raise UserError(f"rater name(s) {', '.join(taken)} already exist; choose other names "
                        "(list links with `pcpo-eval human raters HUMAN`)")
    out = [(n, secrets.token_urlsafe(24)) for n in clean]
    now = datetime.now(UTC)
    try:
        with Session(engine) as session, session.begin():
            session.add_all(Rater(name=n, token=t, created_at=now) for n, t in out)
    except IntegrityError:
        raise UserError(f"rater name(s) {', '.join(clean)} were added meanwhile by another process; "
                        "choose other names") from None
    return out


def rater_links(url: str, base_url: str) -> list[tuple[str, str]]:
    """(name, private link) of every rater, in creation order; ``base_url`` e.g. ``http://host:8000``.

    A revoked rater's link is ``revoked`` (it no longer opens anything)."""
    base = base_url.rstrip("/")
    with get_engine(url).connect() as conn:
        rows = conn.execute(select(Rater.name, Rater.token, Rater.revoked_at).order_by(Rater.id)).all()
    return [(name, "revoked" if revoked is not None else f"{base}/r/{token}") for name, token, revoked in rows]


def _rater_id(conn: Any, name: str) -> int:
    rid = conn.execute(select(Rater.id).where(Rater.name == name)).scalar()
    if rid is None:
        names = ", ".join(conn.execute(select(Rater.name).order_by(Rater.id)).scalars()) or "none yet"
        raise UserError(f"no rater named {name!r}; raters: {names}")
    return int(rid)


def rotate(url: str, name: str) -> str:
    """Give rater ``name`` a new secret token (their old link stops working at once); returns it.

    A revoked rater is reinstated with the new token; their revocation stays on record
    (``revocations.reinstated_at`` closes it), so the export still marks the answers stored while the
    link was revoked. Their answers stay theirs."""
    token = secrets.token_urlsafe(24)
    now = datetime.now(UTC)
    with Session(get_engine(url)) as session, session.begin():
        rid = _rater_id(session, name)
        session.execute(Revocation.__table__.update()
                        .where(Revocation.rater_id == rid, Revocation.reinstated_at.is_(None))
                        .values(reinstated_at=now))
        session.execute(Rater.__table__.update().where(Rater.id == rid).values(token=token, revoked_at=None))
    return token


def revoke(url: str, name: str) -> None:
    """Revoke rater ``name``'s link: it is refused from now on (answers already given are kept). The
    revocation is recorded in ``revocations``; revoking a revoked rater again keeps the first time."""
    now = datetime.now(UTC)
    with Session(get_engine(url)) as session, session.begin():
        rid = _rater_id(session, name)
        since = session.execute(select(Rater.revoked_at).where(Rater.id == rid)).scalar()
        if since is None:
            session.add(Revocation(rater_id=rid, revoked_at=now))
        session.execute(Rater.__table__.update().where(Rater.id == rid)
                        .values(token=secrets.token_urlsafe(24), revoked_at=since or now))


def rater_by_token(url: str, token: str) -> RaterInfo | None:
    """The rater whose secret token is ``token`` (None: no such rater)."""
    if not token or len(token) > 64:
        return None
    with get_engine(url).connect() as conn:
        row = conn.execute(select(Rater.id, Rater.name)
                           .where(Rater.token == token, Rater.revoked_at.is_(None))).first()
    return None if row is None else RaterInfo(int(row.id), str(row.name))


# ---- responses ---------------------------------------------------------------------------------


def _state(conn: Any, rater_id: int) -> tuple[dict[str, datetime], set[str]]:
    """(answered pair -> time of its standing answer, pairs with a pending undo) of one rater."""
    first = dict(conn.execute(select(Response.pair_id, Response.submitted_at)
                              .where(Response.rater_id == rater_id)).all())
    latest: dict[str, tuple[int, str | None, datetime]] = {}
    for pair_id, seq, choice, at in conn.execute(select(Correction.pair_id, Correction.seq, Correction.choice,
                                                        Correction.submitted_at)
                                                 .where(Correction.rater_id == rater_id)):
        if pair_id not in latest or seq > latest[pair_id][0]:
            latest[pair_id] = (seq, choice, at)
    pending = {p for p, (_, choice, _) in latest.items() if choice is None}
    times = {p: latest[p][2] if p in latest else t for p, t in first.items() if p not in pending}
    return times, pending


def answered(url: str, rater_id: int) -> set[str]:
    """The pair ids rater ``rater_id`` has a standing answer to (an undone answer is not one)."""
    with get_engine(url).connect() as conn:
        return set(_state(conn, rater_id)[0])


def rater_state(url: str, rater_id: int) -> tuple[set[str], str | None, set[str]]:
    """(pairs with a standing answer, the pair answered last if it may be undone, pairs with a pending undo).

    The last answer may be undone unless an undo is already pending (one step back at a time)."""
    with get_engine(url).connect() as conn:
        times, pending = _state(conn, rater_id)
    if pending or not times:
        return set(times), None, pending
    return set(times), max(times, key=lambda p: (_aware(times[p]), p)), pending


def rater_status(url: str, rater_id: int) -> tuple[set[str], str | None]:
    """(pairs with a standing answer, the pair answered last if it may be undone, else None): :func:`rater_state`."""
    done, last, _ = rater_state(url, rater_id)
    return done, last


def last_answer(url: str, rater_id: int) -> str | None:
    """The pair the rater answered last, if it may be undone (:func:`rater_status`)."""
    return rater_status(url, rater_id)[1]


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _next_seq(conn: Any, rater_id: int, pair_id: str) -> tuple[int, str | None]:
    """(next correction seq, choice of the latest correction or 'answer' when there is none)."""
    row = conn.execute(select(Correction.seq, Correction.choice)
                       .where(Correction.rater_id == rater_id, Correction.pair_id == pair_id)
                       .order_by(Correction.seq.desc())).first()
    return (1, "answer") if row is None else (int(row.seq) + 1, row.choice)


def undo(url: str, rater_id: int, pair_id: str) -> bool:
    """Withdraw the rater's last answer (``pair_id`` must be it) so that the pair is asked again.

    Recorded as a correction row with no choice; the first answer stays in ``responses``. Returns
    False (nothing changed) when ``pair_id`` is not the last answer, e.g. a second click on Undo.
    """
    if last_answer(url, rater_id) != pair_id:
        return False
    engine = get_engine(url)
    try:
        with engine.begin() as conn:
            seq, _ = _next_seq(conn, rater_id, pair_id)
            conn.execute(Correction.__table__.insert().values(rater_id=rater_id, pair_id=pair_id, seq=seq, choice=None,
                                                              reason="", submitted_at=datetime.now(UTC)))
    except IntegrityError:
        return False  # a simultaneous undo of the same answer was stored first
    return True


def submit(url: str, rater_id: int, pair_id: str, choice: str, reason: str = "",
           seconds: float | None = None) -> StoredResponse:
    """Store one answer; a second submit of the same (rater, pair) returns the standing one unchanged.

    The caller validates ``choice``, ``reason`` and that ``pair_id`` is in the rater's assignment.
    The INSERT is the transaction's first statement, so SQLite's busy timeout applies to it. After
    an undo (:func:`undo`) the next submit of that pair is stored as a correction (the first answer
    stays in ``responses``); the one after that is again a resubmit that changes nothing.
    ``seconds``: time from serving the pair's page to this answer, stored with the row it creates.
    """
    if choice not in CHOICES or len(reason) > MAX_REASON:
        raise UserError(f"choice must be one of {', '.join(CHOICES)} and the reason at most {MAX_REASON} characters")
    engine = get_engine(url)
    now = datetime.now(UTC)
    try:
        with engine.begin() as conn:
            conn.execute(Response.__table__.insert().values(
                rater_id=rater_id, pair_id=pair_id, choice=choice, reason=reason, submitted_at=now,
                seconds=seconds))
        return StoredResponse(choice, reason, True)
    except IntegrityError:
        pass
    for _attempt in range(3):
        with engine.connect() as conn:
            row = conn.execute(select(Response.choice, Response.reason)
                               .where(Response.rater_id == rater_id, Response.pair_id == pair_id)).first()
            if row is None:  # the IntegrityError was not the unique constraint: an unknown rater or pair
                raise UserError(f"pair {pair_id} or rater {rater_id} is not in the database; reload the pairs")
            seq, latest = _next_seq(conn, rater_id, pair_id)
            if latest is not None:  # no pending undo: the standing answer wins
                if latest == "answer":
                    return StoredResponse(str(row.choice), str(row.reason), False)
                standing = conn.execute(select(Correction.choice, Correction.reason).where(
                    Correction.rater_id == rater_id, Correction.pair_id == pair_id, Correction.seq == seq - 1)).one()
                return StoredResponse(str(standing.choice), str(standing.reason), False)
        try:
            with engine.begin() as conn:
                conn.execute(Correction.__table__.insert().values(rater_id=rater_id, pair_id=pair_id, seq=seq,
                                                                  choice=choice, reason=reason, submitted_at=now,
                                                                  seconds=seconds))
            return StoredResponse(choice, reason, True)
        except IntegrityError:
            continue  # a simultaneous re-answer was stored first: read it
    raise UserError(f"could not store the answer of rater {rater_id} to pair {pair_id}; try again")


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:  # SQLite stores naive UTC
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _iso_utc(value: datetime) -> str:
    return _utc(value).isoformat()


def export_responses(url: str) -> pd.DataFrame:
    """Every standing answer joined with its rater's name (columns: exactly RESPONSE_COLUMNS).

    ``choice`` / ``reason`` / ``submitted_at`` are the standing answer (the last re-answer after an
    undo, else the first answer); ``first_choice`` is the first answer, never changed, and
    ``corrections`` the number of undo and re-answer rows of that pair. A pair whose answer was
    undone and not yet answered again is left out (the rater withdrew it). ``seconds``: from serving
    the page to the standing answer (NaN when not recorded). ``revoked_at`` (UTC, ISO 8601): when the
    link the answer was given on was revoked (``human raters --revoke``), the first revocation of the
    rater not ended by a rotate before the answer; "" when none (an answer on a link never revoked, or
    given after the rotate that reinstated the rater). ``revoked``: ``revoked_at`` is set. ``human
    analyze`` drops answers stored at or after it (on a revoked link), and with ``--exclude-revoked``
    every answer with it. A rotate keeps the record (:class:`Revocation`).
    """
    query = (select(Rater.name, Response.rater_id, Response.pair_id, Response.choice, Response.reason,
                    Response.submitted_at, Response.seconds)
             .join(Rater, Rater.id == Response.rater_id).order_by(Response.id))
    with get_engine(url).connect() as conn:
        rows = conn.execute(query).all()
        corr = conn.execute(select(Correction.rater_id, Correction.pair_id, Correction.seq, Correction.choice,
                                   Correction.reason, Correction.submitted_at, Correction.seconds)
                            .order_by(Correction.rater_id, Correction.pair_id, Correction.seq)).all()
        revs = conn.execute(select(Revocation.rater_id, Revocation.revoked_at, Revocation.reinstated_at)
                            .order_by(Revocation.revoked_at)).all()
    spans: dict[int, list[tuple[datetime, datetime | None]]] = {}
    for rid, start, end in revs:
        spans.setdefault(int(rid), []).append((_utc(start), None if end is None else _utc(end)))

    def revoked_at(rid: int, at: datetime) -> str:
        """The first revocation of the rater not ended before ``at`` ("" when none)."""
        t = _utc(at)
        return next((_iso_utc(s) for s, e in spans.get(rid, []) if e is None or e > t), "")

    latest: dict[tuple[int, str], Any] = {}
    counts: dict[tuple[int, str], int] = {}
    for c in corr:
        key = (int(c.rater_id), str(c.pair_id))
        latest[key] = c  # ordered by seq: the last one stands
        counts[key] = counts.get(key, 0) + 1
    out = []
    for name, rid, pid, choice, reason, at, secs in rows:
        key = (int(rid), str(pid))
        c = latest.get(key)
        if c is not None and c.choice is None:
            continue  # undone, not answered again yet
        now = (c.choice, c.reason, c.submitted_at, c.seconds) if c is not None else (choice, reason, at, secs)
        out.append((str(name), int(rid), str(pid), str(now[0]), str(now[1] or ""), _iso_utc(now[2]), str(choice),
                    counts.get(key, 0), float("nan") if now[3] is None else float(now[3]),
                    revoked_at(int(rid), now[2])))
    df = pd.DataFrame({
        "rater": pd.Series([r[0] for r in out], dtype=str),
        "rater_id": pd.Series([r[1] for r in out], dtype="int64"),
        "pair_id": pd.Series([r[2] for r in out], dtype=str),
        "choice": pd.Series([r[3] for r in out], dtype=str),
        "reason": pd.Series([r[4] for r in out], dtype=str),
        "submitted_at": pd.Series([r[5] for r in out], dtype=str),
        "first_choice": pd.Series([r[6] for r in out], dtype=str),
        "corrections": pd.Series([r[7] for r in out], dtype="int64"),
        "seconds": pd.Series([r[8] for r in out], dtype="float64"),
        "revoked": pd.Series([r[9] != "" for r in out], dtype=bool),
        "revoked_at": pd.Series([r[9] for r in out], dtype=str),
    })
    return df[list(RESPONSE_COLUMNS)]


def export_parquet(url: str, path: str | Path) -> pd.DataFrame:
    """Write :func:`export_responses` to ``path`` atomically; returns the frame written. A database without
    answers never replaces an export that holds some (a UserError: those answers may exist nowhere else)."""
    df = export_responses(url)
    if df.empty and Path(path).is_file():
        try:
            held = pq.ParquetFile(path).metadata.num_rows
        except Exception:  # pyarrow raises several types for a file that is not Parquet: not an export to keep
            held = 0
        if held:
            raise UserError(f"the database {shown_url(url)} holds no answers but {path} holds {held}; nothing was "
                            "written: give the database that collected them with --database-url, or another --output")
    atomic_write_parquet(path, df, private=True)  # raters' names
    return df


def progress(url: str, per_rater: int | None = None) -> pd.DataFrame:
    """Per rater: ``rater``, ``rater_id``, ``answered`` (standing answers), ``total`` (``per_rater``
    from design.json), ``revoked`` (bool)."""
    engine = get_engine(url)
    with engine.connect() as conn:
        n_pairs = int(conn.execute(select(func.count()).select_from(Pair)).scalar_one())
        counts = dict(conn.execute(select(Response.rater_id, func.count())
                                   .group_by(Response.rater_id)).all())
        raters = conn.execute(select(Rater.id, Rater.name, Rater.revoked_at).order_by(Rater.id)).all()
        pending = {int(r.id): len(_state(conn, int(r.id))[1]) for r in raters}
    total = n_pairs if per_rater is None else min(int(per_rater), n_pairs)
    return pd.DataFrame({
        "rater": pd.Series([str(r.name) for r in raters], dtype=str),
        "rater_id": pd.Series([int(r.id) for r in raters], dtype="int64"),
        "answered": pd.Series([int(counts.get(r.id, 0)) - pending[int(r.id)] for r in raters], dtype="int64"),
        "total": pd.Series([total] * len(raters), dtype="int64"),
        "revoked": pd.Series([r.revoked_at is not None for r in raters], dtype=bool),
    })
