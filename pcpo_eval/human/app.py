"""The rating web app: one private link per rater, one pair at a time, no method names anywhere.

A rater is known only by the secret token in their link (``/r/<token>``). The app reads from
``pairs.parquet`` only the rater-visible columns (``pair_id``, ``position``, ``prompt`` and the two
opaque image tokens) and loads them into the database at start; method names, comparisons and
kinds never enter the process. Routes:

* ``GET /``                   -- a neutral page (ask the study organiser for your link);
* ``GET /r/{token}``          -- the rater's next unanswered pair (or a thank-you page);
* ``POST /r/{token}/answer``  -- store one answer (idempotent: the first answer wins), 303 back;
* ``GET /img/{token}.png``    -- an image of some pair (hex tokens only), ``Cache-Control: private``;
* ``GET /static/...``         -- the stylesheet.

Each rater sees at most ``per_rater`` pairs (design.json), in a deterministic order seeded by
(``rng_seed``, rater id) (:func:`pcpo_eval.human.db.assignment`), so a rater resumes where they
left off. Every response carries ``nosniff``, a self-only Content-Security-Policy, ``no-referrer``
and ``frame-ancestors 'none'``; an error is a neutral page, never a traceback.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from fastapi import FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.exceptions import HTTPException as StarletteHTTPException

from pcpo_eval.errors import UserError
from pcpo_eval.human import CHOICES, MAX_REASON, HumanLayout, db

HERE = Path(__file__).parent
LOG = logging.getLogger("pcpo_eval.human.app")
MAX_BODY = 64 * 1024
CSP = ("default-src 'self'; img-src 'self'; style-src 'self'; script-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", CSP.encode()),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
#: Bidirectional-text overrides are stripped from reasons along with control characters.
BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
STATUS_TEXT = {
    400: ("Not accepted", "This answer does not belong to your link. Go back to your current pair."),
    404: ("Page not found", "This page does not exist. Ask the study organiser for your link."),
    405: ("Not allowed", "This page cannot be used that way."),
    413: ("Too large", "The request was too large."),
    422: ("Not accepted", "The answer was incomplete."),
}


@dataclass(frozen=True)
class Settings:
    """The design settings the app needs: the order seed and the pairs per rater (None: all)."""

    rng_seed: int
    per_rater: int | None


def read_settings(layout: HumanLayout) -> Settings:
    """``rng_seed`` and ``per_rater`` from ``design.json``; a missing or bad value is a UserError."""
    hint = "rerun `pcpo-eval human design`"
    if not layout.design.is_file():
        raise UserError(f"{layout.design} is missing; {hint}")
    try:
        design = json.loads(layout.design.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{layout.design} is unreadable ({exc.__class__.__name__}); {hint}") from None
    if not isinstance(design, dict):
        raise UserError(f"{layout.design} is not a JSON object; {hint}")
    seed, per_rater = design.get("rng_seed"), design.get("per_rater")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UserError(f"{layout.design} lacks an integer rng_seed; {hint}")
    if per_rater is not None and (isinstance(per_rater, bool) or not isinstance(per_rater, int) or per_rater < 1):
        raise UserError(f"{layout.design}: per_rater must be a positive integer or null; {hint}")
    return Settings(seed, per_rater)


@dataclass
class _State:
    """What every request needs: the database URL, the pairs (rater-visible columns), the settings."""

    layout: HumanLayout
    url: str
    settings: Settings
    order: list[str]
    pairs: dict[str, dict[str, Any]]
    images: frozenset[str]
    templates: Environment
    _assignments: dict[int, list[str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def assignment(self, rater_id: int) -> list[str]:
        """The pair ids of rater ``rater_id`` in display order (cached)."""
        with self._lock:
            if rater_id not in self._assignments:
                self._assignments[rater_id] = db.assignment(self.order, self.settings.rng_seed, rater_id,
                                                            self.settings.per_rater)
            return self._assignments[rater_id]

    def page(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """Render ``template`` (autoescaped) as an HTML response."""
        return HTMLResponse(self.templates.get_template(template).render(**context), status_code=status)

    def message(self, status: int, message: str | None = None, back: str | None = None) -> HTMLResponse:
        """A neutral message page for ``status``."""
        title, default = STATUS_TEXT.get(status, ("Something went wrong", "Please try again later."))
        return self.page("message.html", status, title=title, message=message or default, back=back)


def _load_state(root: Path, database_url: str | None) -> _State:
    layout = HumanLayout(Path(root))
    if not layout.pairs.is_file():
        raise UserError(f"{layout.pairs} is missing; run `pcpo-eval human design` first")
    settings = read_settings(layout)
    url = database_url or layout.database_url
    db.upgrade(url)
    db.load_pairs(url, pd.read_parquet(layout.pairs, columns=list(db.DB_PAIR_COLUMNS)))
    frame = db.pairs_frame(url)
    pairs = {r["pair_id"]: r for r in frame.to_dict("records")}
    images = frozenset(frame["left_image"]) | frozenset(frame["right_image"])
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True, undefined=StrictUndefined)
    return _State(layout, url, settings, list(frame["pair_id"]), pairs, images, env)


def clean_reason(raw: str) -> str:
    """A reason without control characters (newlines and tabs kept) or bidi overrides, stripped."""
    text = raw.replace("\r\n", "\n").replace("\r", "\n")
    text = "".join(ch for ch in text if ch in "\n\t" or not (ord(ch) < 32 or 127 <= ord(ch) < 160 or ch in BIDI))
    return text.strip()


class _Guard:
    """ASGI middleware: security headers on every response, body size limit, no tracebacks to clients."""

    def __init__(self, app: Any, render_error: Callable[[], Response]) -> None:
        self.app = app
        self.render_error = render_error

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > MAX_BODY:
            await self._send_plain(scope, receive, send, 413)
            return
        started = False

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"server"]
                if not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers + list(SECURITY_HEADERS)
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            LOG.exception("error while serving %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await self.render_error()(scope, receive, send_with_headers)

    async def _send_plain(self, scope: Any, receive: Any, send: Any, status: int) -> None:
        response = Response(STATUS_TEXT[status][1], status_code=status, media_type="text/plain")
        response.headers.update({k.decode(): v.decode() for k, v in SECURITY_HEADERS})
        await response(scope, receive, send)


def _rater_routes(app: FastAPI, state: _State) -> None:
    """``/r/{token}`` (the next pair) and ``/r/{token}/answer`` (store one answer)."""

    @app.get("/r/{token}", response_class=HTMLResponse)
    def next_pair(token: str) -> HTMLResponse:
        rater = db.rater_by_token(state.url, token)
        if rater is None:
            return state.message(404, "This link is not valid. Ask the study organiser for your link.")
        order = state.assignment(rater.id)
        done = db.answered(state.url, rater.id)
        remaining = [p for p in order if p not in done]
        if not remaining:
            return state.page("done.html", n=len(order))
        pair = state.pairs[remaining[0]]
        return state.page("pair.html", token=token, pair_id=pair["pair_id"], prompt=pair["prompt"],
                          left_image=pair["left_image"], right_image=pair["right_image"],
                          k=len(order) - len(remaining) + 1, n=len(order), max_reason=MAX_REASON)

    @app.post("/r/{token}/answer")
    def answer(token: str, pair_id: Annotated[str, Form()] = "", choice: Annotated[str, Form()] = "",
               reason: Annotated[str, Form()] = "") -> Response:
        rater = db.rater_by_token(state.url, token)
        if rater is None:
            return state.message(404, "This link is not valid. Ask the study organiser for your link.")
        back = f"/r/{token}"
        if choice not in CHOICES:
            return state.message(422, "Choose Left, Right or Tie (about equal).", back)
        text = clean_reason(reason)
        if len(text) > MAX_REASON:
            return state.message(422, f"The reason is too long: at most {MAX_REASON} characters.", back)
        if pair_id not in set(state.assignment(rater.id)):
            return state.message(400, back=back)
        db.submit(state.url, rater.id, pair_id, choice, text)
        return RedirectResponse(back, status_code=303)


def _public_routes(app: FastAPI, state: _State) -> None:
    """``/`` (a neutral page), ``/img/{token}.png`` and the error pages."""

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        return state.page("message.html", title="Image preference study", back=None,
                          message="To take part, ask the study organiser for your personal link.")

    @app.get("/img/{image_token}.png")
    def image(image_token: str) -> Response:
        path = state.layout.image(image_token)
        if not db.TOKEN_RE.match(image_token) or image_token not in state.images or not path.is_file():
            return state.message(404)
        return FileResponse(path, media_type="image/png", headers={"Cache-Control": "private, max-age=86400"})

    @app.exception_handler(StarletteHTTPException)
    def http_error(_request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        return state.message(exc.status_code)

    @app.exception_handler(RequestValidationError)
    def invalid(_request: Request, _exc: RequestValidationError) -> HTMLResponse:
        return state.message(422)


def create_app(root: Path, database_url: str | None = None) -> FastAPI:
    """The rating app over the study folder ``root`` (database: ``database_url`` or ``root/human.db``).

    Migrates the database to the newest schema and loads the pairs (idempotent) before serving.
    """
    state = _load_state(Path(root), database_url)
    app = FastAPI(title="Image preference study", docs_url=None, redoc_url=None, openapi_url=None, debug=False)
    app.state.human = state
    _rater_routes(app, state)
    _public_routes(app, state)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_middleware(_Guard, render_error=lambda: state.message(500))
    return app


def serve(root: Path, host: str = "127.0.0.1", port: int = 8000, database_url: str | None = None) -> None:
    """Serve the rating app of ``root`` with uvicorn at ``http://host:port/`` until interrupted."""
    import uvicorn

    app = create_app(Path(root), database_url)
    print(f"Rating app of {root} at http://{host}:{port}/ (rater links: `pcpo-eval human raters {root}`); "
          "Ctrl-C stops it", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, server_header=False)
