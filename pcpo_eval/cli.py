"""The ``pcpo-eval`` command line: a thin Typer shell over the library API.

Each area of the package owns its commands in a ``commands.py`` module exposing
``register(app: typer.Typer) -> None``; this file only assembles them, adds ``--version`` and
turns every error caused by the user into ONE line ``error: <problem>; <fix>`` on stderr with exit
code 2 (no traceback, no boxed help), see docs/cli.md#errors:

* :class:`pcpo_eval.errors.UserError` raised by the library;
* usage errors of the command line itself (unknown option or command, missing argument, a value
  that does not parse), which Typer 0.29 (it vendors Click) raises as ``typer.TyperException``;
* a path the operating system refuses (missing, not a directory, permission denied), which no
  library check caught first.

Heavy imports (torch, diffusers, statsmodels) happen inside the commands, so ``--help`` is fast.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from typing import Any, NoReturn

import typer
from typer._click.exceptions import NoArgsIsHelpError  # typer pinned in pyproject.toml

from pcpo_eval import __version__
from pcpo_eval.errors import UserError

PROG = "pcpo-eval"

app = typer.Typer(
    name=PROG,
    help="Train, render, measure and test PCPO against DDPO / DanceGRPO / Flow-GRPO.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

#: Modules that contribute commands, in the order the data flows through the package.
COMMAND_MODULES = [
    "pcpo_eval.weights.commands",
    "pcpo_eval.credit.commands",
    "pcpo_eval.rewards.commands",
    "pcpo_eval.train.commands",
    "pcpo_eval.generate.commands",
    "pcpo_eval.metrics.commands",
    "pcpo_eval.stats.commands",
    "pcpo_eval.study.commands",
    "pcpo_eval.human.commands",
    "pcpo_eval.toylab.commands",
    "pcpo_eval.toylab.flow_commands",
]

#: OS errors about a path the user named; anything else (a full disk, a bug) keeps its traceback.
PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG} {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """Train, render, measure and test PCPO against DDPO / DanceGRPO / Flow-GRPO."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of blanks folded into single spaces."""
    return " ".join(text.split())


#: (command, old flag) -> the flag that replaced it (docs/cli.md "Flags": one meaning per flag)
RENAMED_FLAGS: dict[tuple[str, str], str] = {
    **{(c, "--out"): "--output FILE (--out is always a folder)" for c in ("features", "lmm", "speedup", "select", "report")},
    ("select", "--reference"): "--matched-to RUN (--reference is the reference image set of metrics)",
    ("pretrain", "--steps"): "--train-steps N (--steps is always sampler steps)",
}


def usage_error_line(exc: typer.TyperException) -> str:
    """``<problem>; <fix>`` for a command-line usage error (the fix names ``--help``, the commands,
    or the new name of a renamed flag)."""
    ctx: Any = getattr(exc, "ctx", None)
    problem = one_line(exc.format_message()).rstrip(".")
    problem = problem[:1].lower() + problem[1:]
    if ctx is None:  # click raises "option requires an argument" without one: the command line names it
        return f"{problem}; see `{_argv_command_path()} --help`"
    renamed = RENAMED_FLAGS.get((ctx.command.name or "", getattr(exc, "option_name", None) or ""))
    if renamed:
        return f"{problem.split(' (Possible')[0]}; use {renamed}"
    if hasattr(ctx.command, "list_commands"):  # a group: the command name was unknown or missing
        return f"{problem}; choose one of: {', '.join(ctx.command.list_commands(ctx))}"
    return f"{problem}; see `{ctx.command_path} --help`"


def _argv_command_path() -> str:
    """``pcpo-eval <group> <command>`` as far as ``sys.argv`` names known commands (``pcpo-eval`` if none)."""
    cmd: Any = typer.main.get_command(app)
    path = [PROG]
    for arg in sys.argv[1:]:
        sub = getattr(cmd, "commands", {}).get(arg)
        if sub is None:
            break
        cmd = sub
        path.append(arg)
    return " ".join(path)


def path_error_line(exc: OSError) -> str:
    """``<problem>; <fix>`` for an OS error about a path (e.g. ``--out`` under a plain file)."""
    where = f": {exc.filename}" if exc.filename else ""
    return f"{(exc.strerror or type(exc).__name__).lower()}{where}; check the path exists and is writable/readable by you"


def interrupted_line() -> str:
    """What Ctrl-C prints: the work is resumable (results are written atomically, finished work is
    skipped on a re-run); ``train`` continues with ``--resume``."""
    cmd = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    how = ("re-run the same command with --resume to continue from the latest checkpoint (a run stopped before its "
           "first checkpoint: without --resume, to start it again)" if cmd == "train"
           else "re-run the same command to continue (finished work is skipped)")
    return f"interrupted (Ctrl-C); what was written is complete and the state is resumable: {how}"


#: what a MemoryError prints (results are written atomically, so what exists is complete)
OUT_OF_MEMORY = ("out of memory; lower the batch size (--batch-size, --micro-batch, or sample_batch_size / "
                 "train_batch_size of a train config) or free memory; what was written is complete, re-run to continue")


def _fail(line: str, code: int = 2) -> NoReturn:
    """``error: <line>`` on stderr, printed once under a launcher (rank 0); every rank exits ``code``."""
    if os.environ.get("RANK", "0") in ("", "0"):
        typer.echo(f"error: {line}", err=True)
    sys.exit(code)


def error_text(exc: UserError) -> str:
    """The error's text on one line; a :class:`ProblemList` lists its items there as ``(1) ...; (2) ...``
    (the contract: one ``error:`` line, however many problems; a script reads the first line)."""
    return one_line(str(exc))


def repeated_option(argv: list[str], root: Any = None) -> str | None:
    """The first single-valued option of the command ``argv`` names that it gives more than once (None: none).
    Click lets the last one win silently: ``train CFG --out a --out b`` trained into ``b``, exit 0, while a
    repeated ``KEY=VALUE`` override was refused. Options that take a list (``--target a --target b``) may repeat.
    ``root``: the app's click command (built here when None)."""
    import typer.main
    from typer._click import Context

    cmd: Any = typer.main.get_command(app) if root is None else root
    i = 0
    while hasattr(cmd, "commands") and i < len(argv):  # walk the command groups to the command itself
        if argv[i].startswith("-"):
            i += 1
            continue
        sub = cmd.get_command(Context(cmd), argv[i])
        if sub is None:
            return None  # an unknown command: click's own usage error says so
        cmd, i = sub, i + 1
    single = {name: p for p in getattr(cmd, "params", []) if getattr(p, "opts", None) and p.param_type_name == "option"
              and not p.multiple and not getattr(p, "count", False) for name in (*p.opts, *p.secondary_opts)}
    seen: dict[int, list[str]] = {}
    for tok in argv[i:]:
        if tok == "--":
            break
        name = tok.split("=", 1)[0] if tok.startswith("--") else tok
        if name in single:
            seen.setdefault(id(single[name]), []).append(name)
            names = list(dict.fromkeys(seen[id(single[name])]))
            if len(seen[id(single[name])]) > 1:
                return (f"{names[0]} given more than once; give it once (the last one would silently win)"
                        if len(names) == 1 else f"{' and '.join(names)} both given; give one of them")
    return None


def main() -> None:
    """Console-script entry point: run the app, mapping user and usage errors to one line + exit code 2."""
    import typer.main

    command = typer.main.get_command(app)  # what app() runs; built once for the check and the run
    if (problem := repeated_option(sys.argv[1:], command)) is not None:
        _fail(problem, 2)
    try:
        rv = command(standalone_mode=False)
    except UserError as exc:
        _fail(error_text(exc), exc.exit_code)
    except NoArgsIsHelpError as exc:  # a bare group (`pcpo-eval`, `pcpo-eval credit`): show its help
        typer.echo(exc.format_message())
        sys.exit(0)
    except typer.TyperException as exc:
        _fail(usage_error_line(exc), 2)
    except PATH_ERRORS as exc:
        _fail(path_error_line(exc), 2)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):  # the disk, not the program
            where = f" writing {exc.filename}" if exc.filename else ""
            _fail(f"{(exc.strerror or 'no space left').lower()}{where}; free space (or choose a folder on another "
                  "disk) and re-run the same command: what was written is complete and finished work is kept", 2)
        if exc.errno != errno.ENAMETOOLONG:
            raise
        name = str(exc.filename or "")
        short = name if len(name) <= 60 else name[:30] + "..." + name[-20:]
        _fail(f"file name too long: {short!r}; each name in a path may have at most 255 bytes (usually): "
              "choose a shorter name", 2)
    except KeyboardInterrupt:
        _fail(interrupted_line(), 130)
    except MemoryError:  # e.g. a huge batch size on the CPU
        _fail(OUT_OF_MEMORY, 2)
    except typer.Abort as exc:  # before RuntimeError: click's Abort is one (it also wraps an EOFError)
        if isinstance(exc.__cause__, KeyboardInterrupt):  # older click / typer turn Ctrl-C into Abort
            _fail(interrupted_line(), 130)
        if isinstance(exc.__cause__ or exc.__context__, EOFError):  # e.g. torch.load of an empty file
            _fail("a file ended before its data did (empty or cut short); the paths in the command and in its "
                  "weight variables name the candidates: replace the file and re-run", 2)
        _fail("aborted; nothing else to do", 1)
    except RuntimeError as exc:
        if type(exc).__name__ != "OutOfMemoryError":  # torch.OutOfMemoryError (CUDA), a RuntimeError
            raise
        _fail(f"out of GPU memory; {OUT_OF_MEMORY.split('; ', 1)[1]}", 2)
    if rv == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into Exit(130), returned here; no command exits 130
        _fail(interrupted_line(), 130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
