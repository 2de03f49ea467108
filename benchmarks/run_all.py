"""Run every ``benchmarks/bench_*.py`` and rewrite ``benchmarks/RESULTS.md``.

Each script measures ratios against a reference implementation within one run (machines are
noisy) and prints a markdown section (``## Title`` + table) to stdout. This runner records the
machine and date, and concatenates the sections. A failing script is reported in its section.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from pcpo_eval.io import atomic_write_text  # noqa: E402


def machine() -> str:
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu}), "
        f"Python {platform.python_version()}, torch {torch.__version__}, threads {torch.get_num_threads()}"
    )


def main(argv: list[str]) -> int:
    only = set(argv)
    scripts = sorted(p for p in HERE.glob("bench_*.py") if not only or p.stem in only)
    sections = []
    for script in scripts:
        print(f"running {script.name} ...", flush=True)
        res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=HERE.parent)
        if res.returncode == 0:
            sections.append(res.stdout.strip())
        else:
            tail = "\n".join(res.stderr.strip().splitlines()[-5:])
            sections.append(f"## {script.stem}\n\nFAILED (exit {res.returncode}):\n\n```\n{tail}\n```")
        print(sections[-1], flush=True)
    header = (
        "# Benchmark results\n\n"
        f"Written by `make bench` (benchmarks/run_all.py) on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC.\n\n"
        f"Machine: {machine()}.\n\n"
        "Every figure is measured in the same process as its reference, and reported as a ratio.\n"
    )
    atomic_write_text(HERE / "RESULTS.md", header + "\n" + "\n\n".join(sections) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
