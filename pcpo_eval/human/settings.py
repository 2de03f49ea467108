"""What the rating app needs from a design folder or a serving bundle (one home for both readings).

A design folder's ``design.json`` holds the design's ``blinding_secret`` (every blinding draw of
:mod:`pcpo_eval.human.design` comes from it, so it *is* the unblinding). The app uses two secrets
derived from it, never the secret itself where it can help it:

* the **key secret** (:func:`derive_key_secret`): HMAC(blinding secret, ``"pcpo-eval human app
  keys"``), which keys image URLs, answer keys and undo keys (:mod:`pcpo_eval.human.app`);
* the **order secret**: what keys each rater's order inside their block
  (:func:`pcpo_eval.human.db.assignment`). Designs written with ``assignment: stratified-keyed``
  (:data:`ASSIGNMENT_KEYED`, every design made now) use HMAC(blinding secret, ``"pcpo-eval human
  order"``) (:func:`derive_order_secret`); designs written with ``assignment: stratified`` used the
  blinding secret itself and keep it (a study in progress keeps its raters' orders), and designs
  made before blinding secrets existed order by the public ``rng_seed``.

A serving bundle (``bundle.json``, :mod:`pcpo_eval.human.bundle`) carries only the two derived
secrets: HMAC is one-way, so its holder can serve the study but cannot regenerate a single blinding
draw. Both readings give the same :class:`Settings`, hence the same URLs, keys and orders.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.human import HumanLayout, design_comparison_seeds

#: How the app cuts raters' blocks and orders them, as recorded in design.json ``assignment``:
#: stratified by kind (:func:`pcpo_eval.human.db.assignment`), ordered under the blinding secret itself.
ASSIGNMENT_STRATIFIED = "stratified"
#: As :data:`ASSIGNMENT_STRATIFIED`, ordered under :func:`derive_order_secret` (what a design written now records).
ASSIGNMENT_KEYED = "stratified-keyed"
_HEX_SECRET = re.compile(r"(?:[0-9a-f]{2}){16,64}")


def derive_key_secret(secret: bytes) -> bytes:
    """The secret of the app's served keys (image URLs, answer and undo keys): HMAC-SHA256 of the
    design's blinding secret, so keys survive a restart and a bundle can serve them."""
    return hmac.new(secret, b"pcpo-eval human app keys", hashlib.sha256).digest()


def derive_order_secret(secret: bytes) -> bytes:
    """The secret each rater's order is keyed by (designs with ``assignment: stratified-keyed``)."""
    return hmac.new(secret, b"pcpo-eval human order", hashlib.sha256).digest()


@dataclass(frozen=True)
class Settings:
    """The serving settings: the public ``rng_seed``, the pairs per rater (None: all), what keys each
    rater's order (a secret, or the public ``rng_seed`` for designs made before secrets existed) and
    the secret of the served keys (None: such a design; the app then makes one per process)."""

    rng_seed: int
    per_rater: int | None
    order_seed: int | bytes
    key_secret: bytes | None = None

    @property
    def legacy(self) -> bool:
        """A design made before blinding secrets: sides and order from ``rng_seed``, blocks unstratified."""
        return self.key_secret is None


def parse_secret(value: Any, where: Path, name: str, hint: str) -> bytes | None:
    """A hex secret of at least 128 bits from a settings file (None when absent); else a UserError."""
    if value is None:
        return None
    if not isinstance(value, str) or not _HEX_SECRET.fullmatch(value):
        raise UserError(f"{where}: {name} must be at least 32 hex digits; {hint}")
    return bytes.fromhex(value)


def _read_object(path: Path, hint: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is unreadable ({exc.__class__.__name__}); {hint}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object; {hint}")
    return data


def _common(data: dict[str, Any], where: Path, hint: str) -> tuple[int, int | None]:
    """``rng_seed`` and ``per_rater`` (checked) of a design.json or bundle.json mapping."""
    seed, per_rater = data.get("rng_seed"), data.get("per_rater")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UserError(f"{where} lacks an integer rng_seed; {hint}")
    if per_rater is not None and (isinstance(per_rater, bool) or not isinstance(per_rater, int) or per_rater < 1):
        raise UserError(f"{where}: per_rater must be a positive integer or null; {hint}")
    design_comparison_seeds(data, where)  # served alike; a bad value is a damaged file
    return seed, per_rater


def design_settings(design: dict[str, Any], where: Path, hint: str = "rerun `pcpo-eval human design`") -> Settings:
    """The :class:`Settings` of a ``design.json`` mapping (``where``: its path, for messages)."""
    seed, per_rater = _common(design, where, hint)
    secret = parse_secret(design.get("blinding_secret"), where, "blinding_secret", hint)
    if secret is None:
        return Settings(seed, per_rater, seed)
    assignment = design.get("assignment", ASSIGNMENT_STRATIFIED)
    if assignment not in (ASSIGNMENT_STRATIFIED, ASSIGNMENT_KEYED):
        raise UserError(f"{where}: assignment {assignment!r} must be {ASSIGNMENT_STRATIFIED} or {ASSIGNMENT_KEYED}; "
                        f"{hint}")
    order = derive_order_secret(secret) if assignment == ASSIGNMENT_KEYED else secret
    return Settings(seed, per_rater, order, derive_key_secret(secret))


def bundle_settings(bundle: dict[str, Any], where: Path,
                    hint: str = "rebuild it with `pcpo-eval human bundle`") -> Settings:
    """The :class:`Settings` of a ``bundle.json`` mapping (:mod:`pcpo_eval.human.bundle`)."""
    seed, per_rater = _common(bundle, where, hint)
    keys = [parse_secret(bundle.get(k), where, k, hint) for k in ("key_secret", "order_secret")]
    if keys[0] is None or keys[1] is None:
        raise UserError(f"{where} lacks key_secret or order_secret; {hint}")
    return Settings(seed, per_rater, keys[1], keys[0])


def read_settings(layout: HumanLayout) -> Settings:
    """The serving settings of a design folder (``design.json``) or a serving bundle (``bundle.json``);
    a missing or bad value is a UserError."""
    if layout.design.is_file():
        return design_settings(_read_object(layout.design, "rerun `pcpo-eval human design`"), layout.design)
    if layout.bundle.is_file():
        return bundle_settings(_read_object(layout.bundle, "rebuild it with `pcpo-eval human bundle`"), layout.bundle)
    raise UserError(f"{layout.design} is missing; rerun `pcpo-eval human design` (or give a serving bundle's folder, "
                    "made by `pcpo-eval human bundle`)")
