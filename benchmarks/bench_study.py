"""Benchmark: the demo study (analysis/toy_study.yaml) end to end on CPU, against its 10-minute budget.

Runs every stage into a fresh temporary directory, then re-runs it (everything finished is
skipped) and renders the report once more. Prints a markdown section with per-stage wall times,
the ratio of the total to the 600 s budget (issue 8: `pcpo-eval demo` <= 10 minutes on 2 cores),
and the report's size.

    .venv/bin/python benchmarks/bench_study.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = 600.0


def main() -> None:
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    from pcpo_eval.report.html import write_report
    from pcpo_eval.study.commands import find_demo_spec
    from pcpo_eval.study.runner import run_study
    from pcpo_eval.study.spec import STAGES

    spec = find_demo_spec()
    with tempfile.TemporaryDirectory(prefix="bench_study_") as tmp:
        out = Path(tmp) / "demo"
        t0 = time.perf_counter()
        run_study(spec, out, log=lambda s: print(s, file=sys.stderr))
        total = time.perf_counter() - t0
        stages = json.loads((out / "timings.json").read_text())
        t1 = time.perf_counter()
        run_study(spec, out, log=lambda s: None)
        rerun = time.perf_counter() - t1
        t2 = time.perf_counter()
        report = write_report(out, Path(tmp) / "again.html")
        render = time.perf_counter() - t2
        size_kb = report.stat().st_size / 1024

    print("## Study pipeline (demo on the toy world)\n")
    print(f"`analysis/toy_study.yaml`, {torch.get_num_threads()} CPU thread(s); budget {BUDGET_S:.0f} s (issue 8).\n")
    print("| Stage | Wall time (s) |")
    print("|---|---:|")
    for s in STAGES:
        print(f"| {s} | {stages.get(s, float('nan')):.1f} |")
    print(f"| **total** | **{total:.1f}** |")
    print()
    print("| Measure | Value |")
    print("|---|---:|")
    print(f"| total / 600 s budget | {total / BUDGET_S:.2f} |")
    print(f"| re-run with everything finished (s) | {rerun:.1f} |")
    print(f"| report render from results.json (s) | {render:.1f} |")
    print(f"| report.html size (KiB) | {size_kb:.0f} |")


if __name__ == "__main__":
    main()
