"""Every option's help text reaches ``--help`` whole, for every command.

Rich (typer's help renderer) swallows ``[lowercase...]`` / ``[@...]`` as a markup tag unless the
bracket is escaped (``\\[``), and crops a word longer than its column with an ellipsis (a list
joined with bare commas is one word); either way the reader loses part of the help. Markup is
checked on a wide terminal for every command; ``metrics`` must list every metric at 80 columns.
"""

from __future__ import annotations

import re

import pytest

from tests.support.cli import cli_commands

LEAVES = [(name.split(), cmd) for name, cmd in cli_commands().items()]


def _squash(text: str) -> str:
    """Drop the box-drawing borders and all whitespace (wrapping and folding only move those)."""
    return re.sub(r"[\s│╭╮╰╯─]", "", text)


def _help(cli, monkeypatch, path, columns: int):
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    return cli(*path, "--help")


@pytest.mark.parametrize("path,cmd", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_help_shows_every_option_whole(cli, monkeypatch, path, cmd):
    res = _help(cli, monkeypatch, path, 200)
    assert res.returncode == 0, res.stderr
    shown = _squash(res.stdout)
    assert "…" not in res.stdout, f"pcpo-eval {' '.join(path)} --help crops a word:\n{res.stdout}"
    for param in cmd.params:
        text = getattr(param, "help", None)
        if not text or getattr(param, "hidden", False):
            continue
        expected = _squash(text.replace("\\[", "["))
        assert expected in shown, (f"pcpo-eval {' '.join(path)} --help: {param.name}'s help {text!r} is not shown "
                                   f"whole (escape a '[' that starts with a lowercase letter or '@'):\n{res.stdout}")


def test_metrics_help_lists_every_metric_at_80_columns(cli, monkeypatch):
    from pcpo_eval.metrics.base import METRICS

    res = _help(cli, monkeypatch, ["metrics"], 80)
    assert res.returncode == 0, res.stderr
    words = set(re.findall(r"[a-z0-9_]+", res.stdout))
    assert "…" not in res.stdout, res.stdout
    assert not [m for m in METRICS if m not in words], res.stdout
