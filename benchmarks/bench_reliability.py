"""Benchmark: the reliability battery of issue 30, re-measurable by anyone.

Each case is data (:data:`CASES`): the command line, the setup of its folder (named builders below,
plus optional CLI commands run first), what is expected (``error``: exit 2 with one ``error:`` line,
or ``ok``: exit 0) and an optional check of the result. Every case runs ``python -m pcpo_eval`` in a
fresh temporary folder; the sha256 of every file that existed before the command is compared after.
Each outcome is one of:

* ``clean``: as expected (one ``error:`` line and exit 2, or exit 0 and the check holds);
* ``traceback``: a Python traceback, or an exit code other than 0, 2 and 130;
* ``accepted``: bad input that exited 0 (or a check that failed after exit 0): silently wrong;
* ``damaged``: a file that existed before the command was changed or removed (counted first);
* ``unclear``: the right exit code but not exactly one ``error:`` line (or a needle missing).

    .venv/bin/python benchmarks/bench_reliability.py [--only NAME_SUBSTRING] [--verbose]

Prints a markdown section (the counts and one row per case that is not clean) for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pcpo_eval.io import scratch_dir

ROOT = Path(__file__).resolve().parents[1]
TOY_CFG = ROOT / "train" / "configs" / "toy_pcpo.yaml"
GEN = ["--model", "toy", "--prompts", "toy", "--max-prompts", "2", "--seeds", "2", "--steps", "2", "--no-progress"]


@dataclass
class Case:
    name: str
    argv: list[str]  #: after ``python -m pcpo_eval``; ``{d}`` is the case's folder
    expect: str = "error"  #: error | ok
    setup: list[str] = field(default_factory=list)  #: builder names (:data:`BUILDERS`), run in order
    pre: list[list[str]] = field(default_factory=list)  #: CLI commands run before the snapshot
    needle: str = ""  #: must appear in the error line
    env: dict[str, str] = field(default_factory=dict)
    patch: str = ""  #: Python run before the CLI (a fault injected where no input can cause it)
    check: str = ""  #: a check name (:data:`CHECKS`) for expect == "ok"


# ------------------------------------------------------------------------------------------ builders

def _write(d: Path, name: str, data: bytes | str) -> None:
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data if isinstance(data, bytes) else data.encode())


def _log(d: Path, name: str, rewards) -> None:
    import numpy as np
    import pandas as pd

    pd.DataFrame({"epoch": np.arange(1, len(rewards) + 1), "reward_mean": rewards}).to_parquet(d / name, index=False)


def _fake_run(rd: Path, arm: str) -> None:
    """A finished run folder (log.parquet, config.yaml, checkpoint records), as tests/study/test_study.py writes."""
    import numpy as np
    import pandas as pd

    e = np.arange(1, 9)
    rate = 0.05 if arm == "DDPO" else 0.07
    rd.mkdir(parents=True)
    pd.DataFrame({"epoch": e, "reward_mean": rate * e, "control_reward_mean": 0 * e + 0.01,
                  "wall_time_s": 0.1 + 0 * e}).to_parquet(rd / "log.parquet", index=False)
    (rd / "config.yaml").write_text("model: toy\n")
    for ep in (2, 4, 6, 8):
        ck = rd / "checkpoints" / f"epoch_{ep:04d}"
        ck.mkdir(parents=True)
        (ck / "checkpoint.json").write_text(json.dumps({"epoch": ep, "reward_mean": rate * ep}))


def _study_spec(d: Path, **changes) -> None:
    import yaml

    (d / "prompts.txt").write_text("a red cube\na blue ball\n")
    spec = {"name": "bench", "train": {"overrides": {"epochs": 2, "sample_steps": 2, "checkpoint_every": 1}},
            "design": {"algorithm": {"A": {"objective": "ppo_clip"}, "B": {"objective": "pcpo"}}},
            "compare": {"factor": "algorithm", "baseline": "A", "pcpo": "B"}, "seeds": [0],
            "targets": [0.3], "select_target": 0.3,
            "eval": {"prompts": str(d / "prompts.txt"), "seeds": "2", "steps": 2},
            "metrics": ["lpips_toy"], "lmm": {"formula": "value ~ algorithm + (1|prompt)"}}
    spec.update(changes)
    (d / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def _cached(kind: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    """A builder whose (slow) product is made once per benchmark run and copied into each case folder."""
    store: dict[str, Path] = {}

    def build(d: Path) -> None:
        if kind not in store:
            store[kind] = scratch_dir(f"bench_rel_{kind}_")
            make(store[kind])
        for p in store[kind].iterdir():
            (shutil.copytree if p.is_dir() else shutil.copy2)(p, d / p.name)

    return build


def _make_toyset(d: Path) -> None:
    _cli(["generate", *GEN, "--out", str(d / "set")], d)
    _cli(["features", str(d / "set"), "--extractor", "toy", "-o", str(d / "feats.npy")], d)  # a warm cache


def _make_toyrun(d: Path) -> None:
    _cli(["train", str(TOY_CFG), "--out", str(d / "run"), "epochs=1", "lora_rank=2", "lora_alpha=2",
          "sample_batch_size=4", "sample_batches_per_epoch=1", "train_batch_size=4", "gradient_updates=1",
          "log_to=none"], d)


def _corrupt_png(d: Path) -> None:
    png = sorted((d / "set" / "images").rglob("*.png"))[1]
    png.write_bytes(png.read_bytes()[:200])


def _truncate_lora(d: Path) -> None:
    ck = sorted((d / "run" / "checkpoints").iterdir())[-1] / "pytorch_lora_weights.safetensors"
    ck.write_bytes(ck.read_bytes()[: ck.stat().st_size // 2])


def _dance(d: Path, reward: str = "0.1\n0.2\n", truncate: bool = False) -> None:
    from safetensors.torch import save_file

    from pcpo_eval.models.registry import load_model

    ck = d / "dance" / "checkpoint_epoch_1"
    ck.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in load_model("toy").denoiser.state_dict().items()}
    save_file(state, ck / "diffusion_pytorch_model.safetensors")
    if truncate:
        f = ck / "diffusion_pytorch_model.safetensors"
        f.write_bytes(f.read_bytes()[:1000])
    (d / "dance" / "reward.txt").write_text(reward)


def _flow_history(d: Path, reward) -> None:
    import pandas as pd

    (d / "flow" / "checkpoints" / "checkpoint-2" / "lora").mkdir(parents=True)
    pd.DataFrame([{"_step": 2 * e, "epoch": e, "reward_avg": r} for e, r in enumerate(reward)]).to_csv(
        d / "history.csv", index=False)


def _stale_temps(d: Path) -> None:
    s = d / "set"
    for p in (s / ".manifest.parquet.ab12cd34.tmp", s / "images" / "p00000" / ".s0000000.png.zz99yy88.tmp"):
        p.write_bytes(b"half")
    (s / ".ckpt.qqqqwwww.tmp").mkdir()
    (s / ".notes").write_text("mine")


BUILDERS: dict[str, Callable[[Path], None]] = {
    "toyset": _cached("toyset", _make_toyset),
    "toyrun": _cached("toyrun", _make_toyrun),
    "corrupt_png": _corrupt_png,
    "truncate_lora": _truncate_lora,
    "stale_temps": _stale_temps,
    "report_empty_object": lambda d: (_write(d, "s/results.json", "{}"), _write(d, "s/report.html", "<html>old</html>")),
    "log_ok": lambda d: _log(d, "ok.parquet", [0.1 * i for i in range(10)]),
    "log_inf": lambda d: _log(d, "inf.parquet", [0.1, 0.2, float("inf"), 0.4]),
    "bom_prompts": lambda d: _write(d, "p.txt", "\ufeffred circle\nblue square\n".encode()),
    "utf16_prompts": lambda d: _write(d, "p.txt", "red circle\nblue square\n".encode("utf-16")),
    "spec_aa": lambda d: _study_spec(d, design={"algorithm": {"A": {"objective": "ppo_clip"},
                                                              "B": {"objective": "ppo_clip"}}}),
    "spec_nan": lambda d: _study_spec(d, targets=[float("nan")]),
    "spec_ok": lambda d: _study_spec(d),
    "spec_runs_unreachable": lambda d: (_fake_run(d / "run A", "DDPO"), _fake_run(d / "run B", "PCPO"), _study_spec(
        d, runs=[{"levels": {"algorithm": "A"}, "seed": 0, "run_dir": str(d / "run A")},
                 {"levels": {"algorithm": "B"}, "seed": 0, "run_dir": str(d / "run B")}],
        targets=[5.0], select_target=5.0)),
    "study_state_corrupt": lambda d: _write(d, "out/study_state.json", b'{"train": {"fing'),
    "dance_ok": _dance,
    "dance_truncated": lambda d: _dance(d, truncate=True),
    "dance_inf": lambda d: _dance(d, reward="0.1\ninf\n"),
    "flow_inf": lambda d: _flow_history(d, [0.1, float("inf"), 0.3]),
    "flow_text": lambda d: _flow_history(d, [0.1, "abc", 0.3]),
    "wandb_corrupt": lambda d: _write(d, "flow/run-x.wandb", b":W&B\x00\x01\x00" + b"\xff" * 64),
    "sched_str": lambda d: _write(d, "sched.json", '{"beta_start": "abc"}'),
    "sched_list": lambda d: _write(d, "sched.json", "[1, 2]"),
    "sched_negative": lambda d: _write(d, "sched.json", '{"num_train_timesteps": -5}'),
    "garbage_weights": lambda d: _write(d, "weights.pt", b"not a state dict"),
}

# ------------------------------------------------------------------------------------------ checks


def _rerendered(d: Path) -> bool:
    from pcpo_eval.imageset import ImageSet

    s = ImageSet.load(d / "set")
    s.verify()
    return True


def _temps_gone(d: Path) -> bool:
    s = d / "set"
    return (not list(s.rglob("*.tmp"))) and (s / ".notes").read_text() == "mine"


def _no_set_json(d: Path) -> bool:
    return not (d / "set" / "set.json").exists()


CHECKS: dict[str, Callable[[Path], bool]] = {"rerendered": _rerendered, "temps_gone": _temps_gone,
                                             "no_set_json": _no_set_json}

FAIL_RENDER = ("import pcpo_eval.generate.runner as r\n"
               "def boom(*a, **k):\n    raise OSError(28, 'No space left on device')\n"
               "r.render_latents = boom\n")

# ------------------------------------------------------------------------------------------ the cases

CASES: list[Case] = [
    # 1. data loss
    Case("report on {} keeps report.html", ["report", "{d}/s"], setup=["report_empty_object"], needle="results.json"),
    # 2. silently wrong
    Case("study with identical arms", ["study", "{d}/spec.yaml", "--out", "{d}/out"], setup=["spec_aa"],
         needle="identical"),
    Case("study spec with a NaN target", ["study", "{d}/spec.yaml", "--out", "{d}/out"], setup=["spec_nan"]),
    Case("metrics on a corrupt PNG, warm cache", ["features", "{d}/set", "--extractor", "toy", "-o", "{d}/feats.npy"],
         setup=["toyset", "corrupt_png"], needle="image_sha256"),
    Case("generate repairs a corrupt PNG", ["generate", *GEN, "--out", "{d}/set"], expect="ok",
         setup=["toyset", "corrupt_png"], check="rerendered"),
    Case("train --resume on a truncated LoRA", ["train", str(TOY_CFG), "--out", "{d}/run", "--resume", "epochs=2",
                                                "lora_rank=2", "lora_alpha=2", "sample_batch_size=4",
                                                "sample_batches_per_epoch=1", "train_batch_size=4",
                                                "gradient_updates=1", "log_to=none"],
         setup=["toyrun", "truncate_lora"], needle="truncated or corrupt"),
    Case("import truncated weights", ["import", "dancegrpo", "{d}/dance", "--out", "{d}/r", "--model", "sd1:{d}/dance"],
         setup=["dance_truncated"], needle="truncated or corrupt"),
    Case("import an inf reward (reward.txt)", ["import", "dancegrpo", "{d}/dance", "--out", "{d}/r", "--model", "toy"],
         setup=["dance_inf"], needle="non-finite"),
    Case("import an inf reward (W&B export)", ["import", "flowgrpo", "{d}/flow", "--out", "{d}/r", "--model", "sd3",
                                              "--log", "{d}/history.csv"], setup=["flow_inf"], needle="non-finite"),
    Case("import a text reward (W&B export)", ["import", "flowgrpo", "{d}/flow", "--out", "{d}/r", "--model", "sd3",
                                              "--log", "{d}/history.csv"], setup=["flow_text"], needle="non-numeric"),
    Case("import an unknown --model", ["import", "dancegrpo", "{d}/dance", "--out", "{d}/r", "--model", "nosuch"],
         setup=["dance_ok"], needle="unknown --model"),
    Case("import an incompatible --model", ["import", "dancegrpo", "{d}/dance", "--out", "{d}/r", "--model", "toy"],
         setup=["dance_ok"], needle="fine-tunes"),
    Case("speedup --target nan", ["speedup", "--baseline", "{d}/ok.parquet", "--pcpo", "{d}/ok.parquet",
                                  "--target", "nan"], setup=["log_ok"], needle="finite"),
    Case("speedup on an inf reward", ["speedup", "--baseline", "{d}/ok.parquet", "--pcpo", "{d}/inf.parquet",
                                      "--target", "0.3"], setup=["log_ok", "log_inf"], needle="non-finite"),
    Case("prompt file with a UTF-8 BOM", ["generate", *GEN[:4], "--prompts", "{d}/p.txt", "--max-prompts", "1",
                                          "--seeds", "1", "--steps", "2", "--no-progress", "--out", "{d}/set"],
         expect="ok", setup=["bom_prompts"]),
    Case("UTF-16 prompt file", ["generate", *GEN[:4], "--prompts", "{d}/p.txt", "--max-prompts", "1",
                                "--seeds", "1", "--steps", "2", "--no-progress", "--out", "{d}/set"],
         expect="ok", setup=["utf16_prompts"]),
    # 4. tracebacks
    Case("import a corrupt W&B log", ["import", "flowgrpo", "{d}/flow", "--out", "{d}/r", "--model", "sd3"],
         setup=["wandb_corrupt"], needle="run-x.wandb"),
    Case("output name over 255 bytes", ["generate", *GEN, "--out", "{d}/" + "n" * 300], needle="too long"),
    Case("W&B online without an API key", ["train", str(TOY_CFG), "--out", "{d}/run", "log_to=wandb",
                                           "wandb_mode=online"], env={"NETRC": "/nonexistent", "WANDB_API_KEY": ""},
         needle="API key"),
    Case("--seeds 99999999999", ["generate", *GEN[:4], "--seeds", "99999999999", "--out", "{d}/set"],
         needle="too large"),
    Case("a huge batch", ["train", str(TOY_CFG), "--out", "{d}/run", "sample_batch_size=100000000",
                          "train_batch_size=100000000"], needle="cannot fit"),
    Case("features --weights: a missing folder", ["features", "{d}/set", "--extractor", "toy", "-o", "{d}/f.npy",
                                                  "--weights", "{d}/nope"], setup=["toyset"], needle="toy weights"),
    Case("features --weights: not inception", ["features", "{d}/set", "--extractor", "inception", "-o", "{d}/f.npy",
                                               "--weights", "{d}/weights.pt"], setup=["toyset", "garbage_weights"]),
    Case("credit --scheduler-config: a string beta", ["credit", "ddim", "--scheduler-config", "{d}/sched.json"],
         setup=["sched_str"], needle="beta_start"),
    Case("credit --scheduler-config: a list", ["credit", "ddim", "--scheduler-config", "{d}/sched.json"],
         setup=["sched_list"], needle="JSON object"),
    Case("credit --scheduler-config: negative steps", ["credit", "ddim", "--scheduler-config", "{d}/sched.json"],
         setup=["sched_negative"], needle="num_train_timesteps"),
    Case("a corrupt study_state.json", ["study", "{d}/spec.yaml", "--out", "{d}/out"],
         setup=["spec_ok", "study_state_corrupt"], needle="study_state.json"),
    # 5. unclear
    Case("study with an unreachable target (existing runs)", ["study", "{d}/spec.yaml", "--out", "{d}/out", "--stages", "train"],
         setup=["spec_runs_unreachable"], needle="reached by no run"),
    Case("stale temp files are cleaned", ["generate", *GEN, "--out", "{d}/set"], expect="ok",
         setup=["toyset", "stale_temps"], check="temps_gone"),
    Case("generate error mid-render leaves no set.json", ["generate", *GEN, "--out", "{d}/set"],
         patch=FAIL_RENDER, check="no_set_json"),
]


# ------------------------------------------------------------------------------------------ running

def _cli(argv: list[str], cwd: Path, env: dict[str, str] | None = None, patch: str = "") -> subprocess.CompletedProcess:
    code = patch + ("import sys\nsys.argv = ['pcpo-eval', *sys.argv[1:]]\nfrom pcpo_eval.cli import main\nmain()\n")
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=600)


def _hashes(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in d.rglob("*") if p.is_file()}


def run_case(case: Case) -> tuple[str, str, float]:
    """(outcome, detail, seconds)."""
    with tempfile.TemporaryDirectory(prefix="bench_rel_") as tmp:
        d = Path(tmp)
        for name in case.setup:
            BUILDERS[name](d)
        for argv in case.pre:
            _cli([a.format(d=d) for a in argv], d)
        before = _hashes(d)
        t0 = time.perf_counter()
        res = _cli([a.format(d=d) for a in case.argv], d, case.env, case.patch)
        dt = time.perf_counter() - t0
        after = _hashes(d)
        changed = sorted(k for k in before if after.get(k) != before[k])
        repaired = case.expect == "ok" and case.check == "rerendered"
        if changed and not repaired and not (case.check == "temps_gone"):
            return "damaged", f"changed: {changed[:3]}", dt
        lines = res.stderr.strip().splitlines()
        if "Traceback" in res.stderr or res.returncode not in (0, 2, 130):
            return "traceback", f"exit {res.returncode}: {lines[-1][:120] if lines else ''}", dt
        if case.expect == "ok":
            if res.returncode != 0:
                return "unclear", f"exit {res.returncode}: {lines[-1][:120] if lines else ''}", dt
            if case.check and not CHECKS[case.check](d):
                return "accepted", f"check {case.check} failed", dt
            return "clean", "", dt
        if res.returncode == 0:
            return "accepted", "exit 0", dt
        errors = [ln for ln in lines if ln.startswith("error: ")]
        if len(errors) != 1 or (case.needle and case.needle not in errors[0]):
            return "unclear", (lines[-1][:120] if lines else "no message"), dt
        if case.check and not CHECKS[case.check](d):
            return "accepted", f"check {case.check} failed", dt
        return "clean", errors[0][:120], dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--verbose", action="store_true", help="print every case's outcome as it finishes")
    args = ap.parse_args()
    cases = [c for c in CASES if args.only in c.name]
    outcomes: dict[str, list[tuple[str, str]]] = {k: [] for k in ("clean", "traceback", "accepted", "damaged",
                                                                  "unclear")}
    t0 = time.perf_counter()
    for case in cases:
        outcome, detail, dt = run_case(case)
        outcomes[outcome].append((case.name, detail))
        if args.verbose:
            print(f"{outcome:>9}  {dt:5.1f}s  {case.name}  {detail}", file=sys.stderr)
    total = time.perf_counter() - t0
    print(f"## Reliability battery (issue 30): {len(cases)} cases through the CLI\n")
    print("`.venv/bin/python benchmarks/bench_reliability.py` (cases as data in the script; each in a fresh "
          "temporary folder, files present before compared by sha256 after)\n")
    print("| clean | traceback | accepted | damaged | unclear | wall time |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {len(outcomes['clean'])} | {len(outcomes['traceback'])} | {len(outcomes['accepted'])} | "
          f"{len(outcomes['damaged'])} | {len(outcomes['unclear'])} | {total:.0f} s |")
    bad = [(k, n, det) for k in ("traceback", "accepted", "damaged", "unclear") for n, det in outcomes[k]]
    if bad:
        print("\n| outcome | case | detail |\n|---|---|---|")
        for k, n, det in bad:
            print(f"| {k} | {n} | {det.replace('|', '/')} |")


if __name__ == "__main__":
    main()
