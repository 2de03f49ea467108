"""Helpers of the CLI tests (tests/cli/): the real command tree, and the check that a rejected command
printed one ``error:`` line, exited 2 and changed nothing.

``rejected(cli, box, *args)`` runs ``pcpo-eval ARGS`` through the ``cli`` fixture (tests/conftest.py)
and compares a :func:`snapshot` of ``box`` (the fixture of tests/cli/conftest.py) before and after.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOY_CFG = ROOT / "train" / "configs" / "toy_pcpo.yaml"
RESUME_OVERRIDES = ["epochs=2", "lora_rank=2", "lora_alpha=2"]


@functools.cache
def cli_commands() -> dict:
    """The one walk over the real CLI tree: ``"human raters"`` -> its click command."""
    import typer.main

    from pcpo_eval.cli import app

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), cmd

    return dict(walk(typer.main.get_command(app), []))


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (hidden ones too): kind, permission bits and content hash."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            out[str(p.relative_to(root))] = (p.is_dir(), st.st_mode & 0o7777, digest)
    return out


def assert_rejected(res, box: Path, before: dict, *needles: str, may_add: str | None = None) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    after = snapshot(box)
    if may_add is not None:
        after = {k: v for k, v in after.items() if k in before or not k.startswith(may_add)}
    assert after == before, "a rejected command changed the folder"
    return lines[0]


def rejected(cli, box: Path, *args, needles=(), may_add: str | None = None) -> str:
    """Run ``pcpo-eval ARGS``; assert one error line and an unchanged ``box``.

    ``may_add``: a folder (relative to ``box``) where new entries are allowed -- the feature
    cache of an image set, filled for the prompts measured before the bad image was met.
    """
    before = snapshot(box)
    return assert_rejected(cli(*args), box, before, *needles, may_add=may_add)
