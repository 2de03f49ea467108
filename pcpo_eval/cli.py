"""The ``pcpo-eval`` command line: a thin Typer shell over the library API.

Each area of the package owns its commands in a ``commands.py`` module exposing
``register(app: typer.Typer) -> None``; this file only assembles them and turns
:class:`pcpo_eval.errors.UserError` into one line on stderr with exit code 2.
Heavy imports (torch, diffusers, statsmodels) happen inside the commands, so ``--help`` is fast.
"""

from __future__ import annotations

import importlib
import sys

import click
import typer

from pcpo_eval.errors import UserError

app = typer.Typer(
    name="pcpo-eval",
    help="Train, render, measure and test PCPO against DDPO / DanceGRPO / Flow-GRPO.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Modules that contribute commands, in the order the data flows through the package.
COMMAND_MODULES = [
    "pcpo_eval.credit_commands",
    "pcpo_eval.toy.commands",
    "pcpo_eval.toy.flow_commands",
    "pcpo_eval.train_commands",
    "pcpo_eval.generate_commands",
    "pcpo_eval.metrics.commands",
    "pcpo_eval.weights",
    "pcpo_eval.stats.commands",
    "pcpo_eval.report.commands",
]

for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as _exc:  # area not built yet in this checkout
        if _exc.name != _name and not _name.startswith(str(_exc.name)):
            raise
        continue
    _module.register(app)


def main() -> None:
    """Console-script entry point: run the app, mapping user errors to exit code 2."""
    try:
        rv = app(standalone_mode=False)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
