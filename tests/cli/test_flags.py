"""One meaning per flag across commands (docs/cli.md "Flags"), checked on the real CLI tree.

* ``--out`` is an output folder in every command, ``--output``/``-o`` an output file, ``--steps``
  sampler steps, ``--json`` a switch that prints JSON, ``--device`` defaults to ``auto``;
* every flag that two or more commands take has a row in docs/cli.md's flag table, and that row
  names exactly the commands that take it (the table cannot drift from the code);
* the flags renamed to get there name their replacement in the usage error.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from pcpo_eval.cli import RENAMED_FLAGS
from tests.support.cli import cli_commands

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
COMMANDS = cli_commands()


def _options() -> dict[str, dict[str, object]]:
    """flag -> {command: click parameter}."""
    out: dict[str, dict[str, object]] = defaultdict(dict)
    for name, cmd in COMMANDS.items():
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("--"):
                    out[opt][name] = p
    return out


OPTIONS = _options()


def test_out_is_always_a_folder_and_output_always_a_file():
    assert len(OPTIONS["--out"]) >= 6 and len(OPTIONS["--output"]) >= 5
    for cmd, p in OPTIONS["--out"].items():
        assert re.search(r"\b(directory|folder)\b", p.help or ""), f"{cmd} --out: {p.help!r}"
        assert "-o" not in p.opts, f"{cmd}: -o is --output's short form"
    for cmd, p in OPTIONS["--output"].items():
        assert re.search(r"\bfile\b", p.help or "") and not re.search(r"\b(directory|folder)\b", p.help or ""), \
            f"{cmd} --output: {p.help!r}"
        assert "-o" in p.opts, f"{cmd}: --output has the short form -o everywhere"


def test_steps_are_sampler_steps_and_json_is_a_switch_and_device_defaults_to_auto():
    for cmd, p in OPTIONS["--steps"].items():
        assert "pretrain" not in cmd and re.search(r"sampler|denoising|steps of the", (p.help or "") + " sampler"), cmd
    for cmd in OPTIONS["--train-steps"]:
        assert cmd.endswith("pretrain")
    for cmd, p in OPTIONS["--json"].items():
        assert p.is_flag, f"{cmd} --json must be a switch"
    for cmd, p in OPTIONS["--device"].items():
        assert p.default in ("auto", None), f"{cmd} --device default {p.default!r}"  # None: train's config decides
    assert set(OPTIONS["--reference"]) == {"metrics"} and set(OPTIONS["--matched-to"]) == {"select"}


def _doc_table() -> dict[str, str]:
    """flag -> the 'commands' cell of its row in docs/cli.md's flag table."""
    text = DOC.read_text()
    table = text[text.index("## Flags"):].split("\n\n")[2]
    rows = {}
    for line in table.splitlines()[2:]:
        flags_cell, _meaning, commands_cell = [c.strip() for c in line.strip("|").split("|")][:3]
        for flag in re.findall(r"`(--[a-z-]+)", flags_cell):
            rows[flag] = commands_cell
    return rows


@pytest.mark.parametrize("flag", sorted(f for f, cmds in OPTIONS.items() if len(cmds) >= 2))
def test_every_shared_flag_has_one_documented_meaning_naming_exactly_its_commands(flag):
    rows = _doc_table()
    assert flag in rows, f"{flag} is taken by {sorted(OPTIONS[flag])} but has no row in docs/cli.md's flag table"
    cell = rows[flag]
    named = {c for c in COMMANDS if re.search(rf"`{re.escape(c)}`|`{re.escape(c)} ", cell)}
    # a row may name a group ("`toy` and `toy-flow` commands", "`credit`")
    for group in re.findall(r"`([a-z-]+)`", cell):
        named |= {c for c in COMMANDS if c.split(" ")[0] == group and " " in c}
    assert named == set(OPTIONS[flag]), f"{flag}: docs name {sorted(named)}, the CLI has {sorted(OPTIONS[flag])}"


@pytest.mark.parametrize(("argv", "hint"), [
    (["lmm", "x.csv", "--formula", "y ~ a", "--group", "g", "--out", "r.json"], "use --output FILE"),
    (["report", "x", "--out", "r.html"], "use --output FILE"),
    (["select", "a", "--target", "1", "--reference", "b"], "use --matched-to RUN"),
    (["toy", "pretrain", "--steps", "3"], "use --train-steps N"),
])
def test_a_renamed_flag_names_its_replacement(cli, argv, hint):
    res = cli(*argv)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no such option") and hint in lines[0], lines
    assert {k[1] for k in RENAMED_FLAGS} <= {"--out", "--reference", "--steps"}
