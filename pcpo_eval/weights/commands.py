"""``pcpo-eval weights``: where every backend looks, what it found, how to get the rest."""

from __future__ import annotations

import json

import typer

from pcpo_eval.weights.backends import BACKENDS
from pcpo_eval.weights.locate import format_table, status


def weights_cmd(
    names: list[str] = typer.Argument(None, help="Backends to check (default: all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List every weights backend: where it looks, whether it found the weights, how to get them."""
    selected = names or list(BACKENDS)
    rows = [status(n) for n in selected]
    if as_json:
        typer.echo(json.dumps({"backends": [r.to_dict() for r in rows]}, indent=2))
    else:
        typer.echo(format_table(rows))


def register(app: typer.Typer) -> None:
    """Add ``weights`` to the ``pcpo-eval`` app."""
    app.command("weights")(weights_cmd)
