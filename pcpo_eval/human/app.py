"""The rating web app: one private link per rater, one pair at a time, no method names anywhere.

A rater is known only by the secret token in their link (``/r/<token>``). The app reads from
``pairs.parquet`` the columns ``pair_id``, ``position``, ``prompt`` and the two opaque image
tokens (loaded into the database at start) and ``kind`` (kept in memory only, to give every rater
their share of attention checks: :func:`pcpo_eval.human.db.assignment`); method names and
comparisons never enter the process, and nothing it serves names a pair id, image token or kind.
Routes (all under ``--root-path`` when one is set):

* ``GET|HEAD /``                      -- a neutral page (ask the study organiser for your link);
* ``GET|HEAD /r/{token}``             -- the rater's current pair (or a thank-you page);
* ``POST /r/{token}/answer``          -- store the answer to the current pair (idempotent: the first
  answer wins), 303 back;
* ``POST /r/{token}/undo``            -- withdraw the rater's last answer (kept, recorded as a correction);
* ``GET|HEAD /r/{token}/img/{key}.png`` -- one side of one of the rater's pairs;
* ``GET /static/...``                 -- the stylesheet.

**Answers only to the pair shown.** The page carries no pair id, only an answer key
``ISSUED.HMAC(key secret, rater, pair, ISSUED)`` (``ISSUED``: when the page was served, in ms).
An answer is stored only when its key names the rater's current pair (the one the page showed,
which after an undo is the undone pair); the key of the pair just answered is accepted as a
resubmit that changes nothing; anything else (another rater's pair, a pair not yet shown, a
forged key) is one and the same 400 page. The seconds from ``ISSUED`` to the answer are stored with it.
The undo button carries ``HMAC(key secret, rater, pair)`` likewise.

**Blinding.** An image URL is ``HMAC(key secret, rater, pair, side)`` (key secret: derived from the
design's ``blinding_secret``, so URLs and answer keys survive a restart; older designs: one made
when the process starts): one image shown in two
pairs (PCPO's, in both bracket comparisons of a design on shared seeds; a main pair's image reused by
an attention check) gets two unrelated URLs, and two raters never share one. Designs on distinct
seeds (``comparison_seeds``, the default) show no image in two comparisons at all
(``tests/human/test_comparison_seeds.py``); the app serves both kinds alike. Images are sent with ``Cache-Control: no-store`` and no ``Last-Modified`` or ``ETag`` (file
times follow the order images were written, which followed the checkpoints). Both images of a pair
are served uncompressed (:func:`served_png`), so their lengths (``Content-Length``, a PNG viewer's chunk
lengths) are set by the grid alone and do not tell how each compresses.
What the app cannot hide is the content itself (the pixels): ``tests/human/test_blinding.py``.

**Hardening.** Bodies are read by the guard and refused beyond :data:`MAX_BODY` bytes whatever
the headers say (chunked too); a POST whose ``Origin`` (or, without one, ``Referer``) is another
site is refused; tokens never reach the log (one line per failure, paths redacted, SQL
parameters hidden); a database failure answers the rater with a retry page (their answer was not
stored, and the page says so) instead of a bare 500.

Each rater sees at most ``per_rater`` pairs (design.json), stratified by kind, in a deterministic
order keyed by the design's ``blinding_secret`` and the rater id (:func:`pcpo_eval.human.db.assignment`;
designs made before that secret existed: by ``rng_seed``, unstratified, as they were made), so a
rater resumes where they left off. Every response carries ``nosniff``, a self-only Content-Security-Policy,
``same-origin`` referrers and ``frame-ancestors 'none'``; an error is a neutral page, never a traceback.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import logging
import re
import secrets
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
from fastapi import FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from PIL import Image
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pcpo_eval.errors import UserError
from pcpo_eval.human import CHOICES, KINDS, MAX_REASON, HumanLayout, db, shown_png
from pcpo_eval.human.settings import Settings, read_settings

HERE = Path(__file__).parent
LOG = logging.getLogger("pcpo_eval.human.app")
MAX_BODY = 64 * 1024
CSP = ("default-src 'self'; img-src 'self'; style-src 'self'; script-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
#: ``same-origin``: a browser then sends this site's ``Origin`` on its own form posts (with
#: ``no-referrer`` it sends ``Origin: null``) and no referrer, so no token, to any other site.
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", CSP.encode()),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)
#: Bidirectional-text overrides are stripped from reasons along with control characters.
BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
STATUS_TEXT = {
    400: ("Not accepted", "This answer is not for the pair your link shows now, so it was not saved. "
                          "Go back to your current pair."),
    403: ("Not accepted", "This answer was sent from another site and was not saved. Open your link again."),
    404: ("Page not found", "This page does not exist. Ask the study organiser for your link."),
    405: ("Not allowed", "This page cannot be used that way."),
    410: ("Study closed", "This study is closed and takes no more answers. Thank you for taking part."),
    413: ("Too large", "The request was too large."),
    422: ("Not accepted", "The answer was incomplete."),
    503: ("Please try again", "The study could not save or load your answers just now. Nothing you saved "
                              "before is lost; your last answer may not have been saved. Wait a moment, then "
                              "go back to your pair and answer it again if it is still shown."),
}
#: A rater token as ``secrets.token_urlsafe(24)`` writes it (redacted from every log line).
_TOKEN_IN_TEXT = re.compile(r"[A-Za-z0-9_-]{32}")
_KEY_RE = re.compile(r"^[0-9a-f]{32}$")
_ANSWER_KEY_RE = re.compile(r"^(\d{1,15})\.([0-9a-f]{32})$")


def redact(text: str) -> str:
    """``text`` with anything shaped like a rater token (and every ``/r/<x>`` path segment) hidden."""
    return _TOKEN_IN_TEXT.sub("<token>", re.sub(r"/r/[^/\s]+", "/r/<token>", str(text)))


def normalize_root_path(root_path: str | None) -> str:
    """``--root-path`` as ``/prefix`` without a trailing slash ("" for none); a bad one is a UserError."""
    rp = (root_path or "").strip()
    if rp in ("", "/"):
        return ""
    if not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+/?", rp):
        raise UserError(f"--root-path {root_path!r}: write a path such as /rate or /studies/toy "
                        "(letters, digits, . _ ~ - between slashes)")
    return rp.rstrip("/")


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of ``url`` (lower case), None if it has none."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


@dataclass
class _State:
    """What every request needs: the database URL, the pairs (rater-visible columns), the settings."""

    layout: HumanLayout
    url: str
    settings: Settings
    order: list[str]
    pairs: dict[str, dict[str, Any]]
    templates: Environment
    kinds: dict[str, str] | None = None
    root_path: str = ""
    origins: frozenset[str] = frozenset()
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _assignments: dict[int, list[str]] = field(default_factory=dict)
    _keys: dict[int, dict[str, tuple[str, str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: tuple[Any, bool] | None = None  #: (the files' stat keys, closed): :meth:`closed`'s cache

    def assignment(self, rater_id: int) -> list[str]:
        """The pair ids of rater ``rater_id`` in display order (cached)."""
        with self._lock:
            if rater_id not in self._assignments:
                self._assignments[rater_id] = db.assignment(self.order, self.settings.order_seed, rater_id,
                                                            self.settings.per_rater, self.kinds)
            return self._assignments[rater_id]

    def _mac(self, text: str) -> str:
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()[:32]

    def answer_key(self, rater_id: int, pair_id: str, issued_ms: int | None = None) -> str:
        """The page's answer key: ``ISSUED.HMAC(rater, pair, ISSUED)`` (ISSUED: now, in ms)."""
        issued = time.time_ns() // 1_000_000 if issued_ms is None else issued_ms
        return f"{issued}.{self._mac(f'answer:{rater_id}:{pair_id}:{issued}')}"

    def answer_pair(self, rater_id: int, key: str, candidates: Iterable[str | None]) -> tuple[str, float] | None:
        """(pair, seconds since the page was served) that ``key`` names among ``candidates`` (the pairs an answer
        may be for: the one shown, the one just answered), or None."""
        m = _ANSWER_KEY_RE.match(key)
        if m is None:
            return None
        issued = int(m.group(1))
        for pair_id in candidates:
            if pair_id is not None and hmac.compare_digest(self.answer_key(rater_id, pair_id, issued), key):
                return pair_id, max(0.0, round(time.time() - issued / 1000, 3))
        return None

    def undo_key(self, rater_id: int, pair_id: str) -> str:
        """The undo button's key of one pair for one rater: HMAC, 128 bits, hex."""
        return self._mac(f"undo:{rater_id}:{pair_id}")

    def undo_pair(self, rater_id: int, key: str) -> str | None:
        """The rater's pair whose undo key is ``key`` (None: none)."""
        return next((p for p in self.assignment(rater_id)
                     if hmac.compare_digest(self.undo_key(rater_id, p), key)), None)

    def image_key(self, rater_id: int, pair_id: str, side: str) -> str:
        """The opaque name of one side of one pair for one rater: HMAC-SHA256, 128 bits, hex."""
        msg = f"{rater_id}:{pair_id}:{side}".encode()
        return hmac.new(self.secret, msg, hashlib.sha256).hexdigest()[:32]

    def image_of(self, rater_id: int, key: str) -> tuple[str, str] | None:
        """(the image token behind ``key`` for this rater, the token of the other side of its pair); None:
        not one of their pairs' images."""
        order = self.assignment(rater_id)
        with self._lock:
            keys = self._keys.get(rater_id)
        if keys is None:
            keys = {self.image_key(rater_id, p, side): (self.pairs[p][f"{side}_image"], self.pairs[p][f"{other}_image"])
                    for p in order for side, other in (("left", "right"), ("right", "left"))}
            with self._lock:
                self._keys[rater_id] = keys
        return keys.get(key)

    def page(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """Render ``template`` (autoescaped) as an HTML response."""
        html = self.templates.get_template(template).render(base=self.root_path, **context)
        return HTMLResponse(html, status_code=status)

    def message(self, status: int, message: str | None = None, back: str | None = None) -> HTMLResponse:
        """A neutral message page for ``status``."""
        title, default = STATUS_TEXT.get(status, ("Something went wrong", "Please try again later."))
        return self.page("message.html", status, title=title, message=message or default, back=back)

    def rater_home(self, token: str) -> str:
        return f"{self.root_path}/r/{token}"

    def closed(self) -> bool:
        """Whether a ``human analyze --final`` closed the study (:meth:`HumanLayout.closed_at`): its report labels
        the shown images by checkpoint, so a rater must be shown no more pairs. A damaged log of analyses counts
        as closed (serve nothing rather than risk it). Read on every rater request: the analysis runs in another
        process while the app serves; parsed again only when one of its two files changed (an interim
        ``analysis.json`` was parsed on every request)."""
        key = tuple(_stat_key(p) for p in (self.layout.looks, self.layout.analysis))
        with self._lock:
            if self._closed is not None and self._closed[0] == key:
                return self._closed[1]
        try:
            closed = self.layout.closed_at() is not None
        except UserError:
            closed = True
        with self._lock:
            self._closed = (key, closed)
        return closed


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of ``path``; None when absent: what tells a changed file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _load_state(root: Path, database_url: str | None, root_path: str, base_url: str | None) -> _State:
    layout = HumanLayout(Path(root))
    if not layout.pairs.is_file():
        raise UserError(f"{layout.pairs} is missing; run `pcpo-eval human design` first")
    layout.require_open("serve pairs")
    settings = read_settings(layout)
    url = database_url or layout.database_url
    with db.database_errors(url):
        db.upgrade(url)
        db.load_pairs(url, pd.read_parquet(layout.pairs, columns=list(db.DB_PAIR_COLUMNS)))
        frame = db.pairs_frame(url)
    db.check_writable(url)
    pairs = {r["pair_id"]: r for r in frame.to_dict("records")}
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True, undefined=StrictUndefined)
    # the address raters open: --base-url, else the one `human raters --base-url` remembered (it was ignored, so
    # behind a proxy that forwards its own Host every answer was refused as "sent from another site")
    public = base_url if base_url is not None else layout.remembered_base_url()
    origins = frozenset(o for o in [origin_of(public)] if o) if public else frozenset()
    return _State(layout, url, settings, list(frame["pair_id"]), pairs, env, _kinds(layout, settings, pairs),
                  root_path, origins, _key_secret(settings))


def _key_secret(settings: Settings) -> bytes:
    """The secret of served keys (image URLs, answer and undo keys): derived from the design's
    blinding secret (:func:`pcpo_eval.human.settings.derive_key_secret`), so keys survive a restart
    and a serving bundle gives the same ones; a per-process random one for designs without a secret."""
    return settings.key_secret if settings.key_secret is not None else secrets.token_bytes(32)


def _kinds(layout: HumanLayout, settings: Settings, pairs: dict[str, Any]) -> dict[str, str] | None:
    """pair id -> kind, for the stratified assignment of designs with a blinding secret (kept in
    memory, never served); None for older designs, whose blocks stay as they were cut (a warning)."""
    if settings.legacy:
        LOG.warning("%s predates blinding secrets: its sides and order follow the public rng_seed and raters' "
                    "blocks are not stratified; make a new design (`pcpo-eval human design`) for a new study",
                    layout.design)
        return None
    frame = pd.read_parquet(layout.pairs, columns=["pair_id", "kind"])
    kinds = dict(zip(frame["pair_id"].astype(str), frame["kind"].astype(str), strict=True))
    bad = sorted({k for k in kinds.values() if k not in KINDS})
    if bad or set(kinds) != set(pairs):
        raise UserError(f"{layout.pairs} has unknown kinds {bad} or other pairs than the database; "
                        "rerun `pcpo-eval human design`")
    return kinds


def clean_reason(raw: str) -> str:
    """A reason without control characters (newlines and tabs kept) or bidi overrides, stripped."""
    text = raw.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or not (ord(ch) < 32 or 127 <= ord(ch) < 160 or ch in BIDI))
    return text.strip()


class _Guard:
    """ASGI middleware around the app (see the module docstring).

    1. ``--root-path``: requests arrive with or without the prefix (a proxy may strip it);
    2. the body is read here, at most :data:`MAX_BODY` bytes whatever ``Content-Length`` or chunking
       says (413 beyond), and replayed to the app;
    3. a POST from another origin (``Origin``, else ``Referer``) is refused (403);
    4. security headers on every response, ``no-store`` unless a route set its own cache policy;
    5. no traceback to clients, one redacted log line per failure.
    """

    def __init__(self, app: Any, state: _State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = self._rooted(scope)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > MAX_BODY:
            await self._send_plain(scope, receive, send, 413)
            return
        body, ok = await self._read_body(receive)
        if not ok:
            await self._send_plain(scope, receive, send, 413)
            return
        if scope["method"] not in ("GET", "HEAD") and not self._same_origin(scope, headers):
            await self.state.message(403)(scope, receive, self._with_headers(send, [False]))
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        started = [False]
        wrapped = self._with_headers(send, started)
        try:
            await self.app(scope, replay, wrapped)
        except Exception as exc:
            LOG.error("error while serving %s %s: %s", scope.get("method"), redact(scope.get("path", "")),
                      redact(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"))
            if not started[0]:
                await self.state.message(500)(scope, replay, wrapped)

    def _rooted(self, scope: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        rp = self.state.root_path
        if not rp:
            return scope
        path = scope.get("path", "/")
        if not (path == rp or path.startswith(rp + "/")):
            path = rp + path  # the proxy stripped the prefix
        return {**scope, "path": path, "root_path": rp}

    @staticmethod
    async def _read_body(receive: Callable[[], Awaitable[Any]]) -> tuple[bytes, bool]:
        """The whole request body, counted as it is read; (body, False) once it exceeds MAX_BODY."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                return b"", False
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        return b"".join(chunks), True

    def _same_origin(self, scope: MutableMapping[str, Any], headers: dict[bytes, bytes]) -> bool:
        """No ``Origin``/``Referer`` (not a browser), or one naming this site (its Host or --base-url)."""
        host = headers.get(b"host", b"").decode("latin-1").lower()
        # either scheme: a proxy that terminates TLS forwards https pages' posts over http
        allowed = set(self.state.origins) | ({f"http://{host}", f"https://{host}"} if host else set())
        origin = headers.get(b"origin")
        if origin is not None:
            return origin.decode("latin-1").lower() in allowed  # "null" (a sandboxed or hidden origin) is not
        referer = headers.get(b"referer")
        if referer is not None:
            return origin_of(referer.decode("latin-1")) in allowed
        return True

    @staticmethod
    def _with_headers(send: Callable[[Any], Awaitable[None]], started: list[bool]) -> Callable[[Any], Awaitable[None]]:
        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() not in (b"server", b"last-modified", b"etag")]
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers + list(SECURITY_HEADERS)
            await send(message)

        return send_with_headers

    async def _send_plain(self, scope: Any, receive: Any, send: Any, status: int) -> None:
        response = Response(STATUS_TEXT[status][1], status_code=status, media_type="text/plain",
                            headers={"connection": "close"})
        await response(scope, receive, self._with_headers(send, [False]))


def _rater_routes(app: FastAPI, state: _State) -> None:
    """``/r/{token}`` (the next pair), its answers, undo and images."""
    invalid = "This link is not valid. Ask the study organiser for your link."

    @app.api_route("/r/{token}", methods=["GET", "HEAD"], response_class=HTMLResponse)
    def next_pair(token: str) -> HTMLResponse:
        rater = db.rater_by_token(state.url, token)
        if rater is None:
            return state.message(404, invalid)
        if state.closed():
            return state.message(410)
        order = state.assignment(rater.id)
        current, last, done = _current(state, rater.id)
        undo = {"key": state.undo_key(rater.id, last)} if last is not None else None
        if current is None:
            return state.page("done.html", n=len(order), token=token, undo=undo)
        pair = state.pairs[current]
        return state.page("pair.html", token=token, answer_key=state.answer_key(rater.id, current),
                          prompt=pair["prompt"], left_key=state.image_key(rater.id, current, "left"),
                          right_key=state.image_key(rater.id, current, "right"),
                          k=len(done & set(order)) + 1, n=len(order), max_reason=MAX_REASON, undo=undo)

    @app.post("/r/{token}/answer")
    def answer(token: str, key: Annotated[str, Form()] = "", choice: Annotated[str, Form()] = "",
               reason: Annotated[str, Form()] = "") -> Response:
        rater = db.rater_by_token(state.url, token)
        if rater is None:
            return state.message(404, invalid)
        if state.closed():
            return state.message(410)
        back = state.rater_home(token)
        if choice not in CHOICES:
            return state.message(422, "Choose Left, Right or Tie (about equal).", back)
        text = clean_reason(reason)
        if len(text) > MAX_REASON:
            return state.message(422, f"The reason is too long: at most {MAX_REASON} characters.", back)
        current, last, _ = _current(state, rater.id)
        found = state.answer_pair(rater.id, key, (current, last))
        if found is None:
            return state.message(400, back=back)  # not this rater's, not shown yet, or forged: one answer
        db.submit(state.url, rater.id, found[0], choice, text, found[1] if found[0] == current else None)
        return RedirectResponse(back, status_code=303)

    @app.post("/r/{token}/undo")
    def undo(token: str, undo_key: Annotated[str, Form()] = "") -> Response:
        rater = db.rater_by_token(state.url, token)
        if rater is None:
            return state.message(404, invalid)
        if state.closed():
            return state.message(410)
        back = state.rater_home(token)
        pair_id = state.undo_pair(rater.id, undo_key)
        if pair_id is None:
            return state.message(400, back=back)
        db.undo(state.url, rater.id, pair_id)  # False (a second click, an older answer): nothing to do
        return RedirectResponse(back, status_code=303)

    @app.api_route("/r/{token}/img/{key}.png", methods=["GET", "HEAD"])
    def image(token: str, key: str) -> Response:
        rater = db.rater_by_token(state.url, token) if _KEY_RE.match(key) and not state.closed() else None
        tokens = state.image_of(rater.id, key) if rater is not None else None
        paths = [state.layout.image(t) for t in tokens or () if db.TOKEN_RE.match(t)]
        if len(paths) != 2 or not all(p.is_file() for p in paths):
            return state.message(404)
        return Response(served_png(paths[0]), media_type="image/png", headers={"Cache-Control": "no-store"})


def served_png(path: Path) -> bytes:
    """The bytes the app sends for the image file ``path``: its pixels as :func:`pcpo_eval.human.shown_png`.

    Blinding: a design's files are already in that form (this gives their bytes back); a file written
    another way (a design made before, or edited) is re-encoded, so the two images of a pair always have
    one length and one chunk layout, whatever the pixels (``Content-Length``, the network panel, a PNG
    viewer's chunk lengths). Before, compressed files were padded to one length with a private chunk,
    whose own length then told the compressed sizes apart: the smaller file was PCPO's in 123 of 143
    toy pairs served."""
    data = path.read_bytes()
    with Image.open(io.BytesIO(data)) as im:
        pixels = np.asarray(im.convert("RGB"))
    return shown_png(pixels)


def _current(state: _State, rater_id: int) -> tuple[str | None, str | None, set[str]]:
    """(the pair the rater is shown now, their last answer if it may be undone, their answered pairs).

    The pair shown is one whose undo is pending, else the first unanswered pair of their order
    (None: all answered)."""
    order = state.assignment(rater_id)
    done, last, pending = db.rater_state(state.url, rater_id)
    current = next((p for p in order if p in pending), None)
    if current is None:
        current = next((p for p in order if p not in done), None)
    return current, last, done


def _public_routes(app: FastAPI, state: _State) -> None:
    """``/`` (a neutral page) and the error pages (a database failure: the retry page)."""

    @app.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse)
    def index() -> HTMLResponse:
        return state.page("message.html", title="Image preference study", back=None,
                          message="To take part, ask the study organiser for your personal link.")

    @app.exception_handler(StarletteHTTPException)
    def http_error(_request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        return state.message(exc.status_code)

    @app.exception_handler(RequestValidationError)
    def invalid(_request: Request, _exc: RequestValidationError) -> HTMLResponse:
        return state.message(422)

    @app.exception_handler(SQLAlchemyError)
    def database_down(request: Request, exc: SQLAlchemyError) -> HTMLResponse:
        orig = getattr(exc, "orig", None) or exc
        LOG.error("database error on %s %s: %s", request.method, redact(request.url.path),
                  redact(f"{type(orig).__name__}: {' '.join(str(orig).split())[:200]}"))
        m = re.match(r"^/r/([^/]+)", request.scope.get("path", "").removeprefix(state.root_path))
        page = state.message(503, back=state.rater_home(m.group(1)) if m else None)
        page.headers["Retry-After"] = "5"
        return page


def create_app(root: Path, database_url: str | None = None, root_path: str = "",
               base_url: str | None = None) -> FastAPI:
    """The rating app over the design folder or serving bundle ``root`` (database: ``database_url`` or
    ``root/human.db``).

    Migrates the database to the newest schema, loads the pairs (idempotent) and checks that the
    database accepts writes (a read-only or unreachable one is a UserError now, not a 500 per answer).
    ``root_path``: the prefix a reverse proxy serves the app under; ``base_url``: the public address
    raters open (its origin is accepted on answers besides the request's Host; default: the address
    ``HUMAN/server.json`` remembers from ``human raters --base-url``).
    """
    state = _load_state(Path(root), database_url, normalize_root_path(root_path), base_url)
    app = FastAPI(title="Image preference study", docs_url=None, redoc_url=None, openapi_url=None, debug=False)
    app.state.human = state
    _rater_routes(app, state)
    _public_routes(app, state)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_middleware(_Guard, state=state)
    return app


def serve(root: Path, host: str = "127.0.0.1", port: int = 8000, database_url: str | None = None,
          root_path: str = "", base_url: str | None = None) -> None:
    """Serve the rating app of ``root`` with uvicorn at ``http://host:port/`` until interrupted."""
    import uvicorn

    app = create_app(Path(root), database_url, root_path, base_url)
    for line in readable_secrets(HumanLayout(Path(root)), database_url):
        print(line, file=sys.stderr, flush=True)
    rp = normalize_root_path(root_path)
    print(f"Rating app of {root} at http://{host}:{port}{rp}/ (rater links: `pcpo-eval human raters {root}`); "
          "Ctrl-C stops it", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, server_header=False,
                date_header=False)


def readable_secrets(layout: HumanLayout, database_url: str | None = None) -> list[str]:
    """One warning per file of ``layout`` that holds a secret and that other users may read (group or world
    bits): the design (blinding secret), the pairs (the unblinding), a bundle's derived secrets, the SQLite
    database (raters' tokens, their credentials). Files written now are mode 0600; older ones are not."""
    files = [layout.design, layout.pairs if layout.design.is_file() else None, layout.bundle]
    if layout.design.is_file():  # a design folder: its sets/ are named after the checkpoints
        files.append(layout.root)
    if database_url is None:
        files.append(layout.database)
    out = []
    for f in (f for f in files if f is not None and f.exists()):
        mode = f.stat().st_mode & 0o777
        if mode & 0o077:
            out.append(f"warning: {f} holds secrets and other users of this machine may read it (mode {mode:04o}); "
                       f"run `chmod {'700' if f.is_dir() else '600'} {f}`")
    return out
