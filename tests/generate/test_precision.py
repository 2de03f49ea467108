"""`generate --precision`: an unknown name is one error line before any model loads; the set records it."""

from __future__ import annotations

import json


def test_unknown_precision_is_refused_before_work(cli, tmp_path):
    out = tmp_path / "set"
    r = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--out", str(out), "--precision", "fp64")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "error: unknown --precision 'fp64'; choose auto, fp32, tf32, bf16, fp16"
    assert not out.exists()


def test_precision_recorded_in_set_json(cli, tmp_path):
    out = tmp_path / "set"
    r = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--max-prompts", "2", "--steps", "2",
            "--out", str(out), "--precision", "bf16", "--device", "cpu", "--no-progress")
    assert r.returncode == 0, r.stderr
    settings = json.loads((out / "set.json").read_text())["settings"]
    assert settings["precision"] == "bf16" and settings["batch_invariance"] == "bitwise"
    r = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--max-prompts", "2", "--steps", "2",
            "--out", str(out), "--precision", "fp32", "--device", "cpu", "--no-progress")
    assert r.returncode == 2 and "precision='bf16'" in r.stderr  # another precision is another set
