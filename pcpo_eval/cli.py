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
    "pcpo_eval.weights.commands",
    "pcpo_eval.credit.commands",
    "pcpo_eval.train.commands",
    "pcpo_eval.generate.commands",
    "pcpo_eval.metrics.commands",
    "pcpo_eval.stats.commands",
    "pcpo_eval.study.commands",
    "pcpo_eval.toylab.commands",
    "pcpo_eval.toylab.flow_commands",
]

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


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
