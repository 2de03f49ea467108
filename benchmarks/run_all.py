"""Run ``benchmarks/bench_*.py`` (all, or the named ones) and update ``benchmarks/RESULTS.md``.

Each script measures ratios against a reference implementation within one run (machines are
noisy) and prints a markdown section (``## Title`` + table) to stdout. This runner puts each
script's output into RESULTS.md between marker lines naming the script, dated and with the machine:

1. a section marked with a script that ran replaces the old one in place;
2. a script with no marked section yet is appended at the end;
3. everything else (sections written by hand, e.g. the GPU results; scripts not run this time) is kept
   verbatim, and a script that fails keeps its old section (the failure is printed, the exit code is 1).

    .venv/bin/python benchmarks/run_all.py [bench_stats bench_metrics ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from pcpo_eval.io import atomic_write_text  # noqa: E402

RESULTS = HERE / "RESULTS.md"
HEADER = ("# Benchmark results\n\n"
          "Sections between `<!-- run_all: bench_x -->` and `<!-- /run_all: bench_x -->` lines are written "
          "by `make bench` (benchmarks/run_all.py), which replaces such a block when it reruns that script and keeps every "
          "other one; each names its script, date and machine under its title. The unmarked sections were "
          "written by hand from the commands they name.\n\n"
          "Every figure is measured in the same process as its reference, and reported as a ratio.\n")
#: the marker lines around what a script wrote (its stem): one or more ``## `` sections
MARKER = re.compile(r"^<!-- run_all: (bench_\w+) -->$")
END = re.compile(r"^<!-- /run_all: (bench_\w+) -->$")


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


def split_sections(text: str) -> list[tuple[str | None, str]]:
    """RESULTS.md cut into its header and sections, each as (the script whose markers enclose it, None for
    the header and hand-written sections; its raw text). A script's block runs from its marker line to its
    end marker, whatever ``## `` sections it holds; outside blocks a section starts at a ``## `` line.
    Joining the texts gives ``text`` back."""
    lines = text.splitlines(keepends=True)
    out: list[tuple[str | None, str]] = []
    script, chunk = None, []
    for ln in lines:
        bare = ln.rstrip("\n")
        start = MARKER.match(bare)
        if script is None and (start or ln.startswith("## ")) and chunk:
            out.append((None, "".join(chunk)))
            chunk = []
        if script is None and start:
            script = start.group(1)
        chunk.append(ln)
        end = END.match(bare)
        if script is not None and end and end.group(1) == script:
            out.append((script, "".join(chunk)))
            script, chunk = None, []
    if chunk:
        out.append((script, "".join(chunk)))
    return out


def merge(old_text: str, new: dict[str, str]) -> str:
    """RESULTS.md with the sections of ``new`` (script stem -> its marked section) in place of the ones
    those scripts wrote before, the others appended; the header and every other section kept byte for
    byte (:data:`HEADER` starts a new file)."""
    chunks = split_sections(old_text) if old_text.strip() else [(None, HEADER + "\n")]
    out, seen = [], set()
    for script, text in chunks:
        if script in new:
            if script not in seen:
                out.append(new[script].strip() + "\n" + ("\n" if text.endswith("\n\n") else ""))
            seen.add(script)
        else:
            out.append(text)
    for script in (s for s in new if s not in seen):
        out[-1] = out[-1].rstrip("\n") + "\n\n"
        out.append(new[script].strip() + "\n")
    return "".join(out)


def marked(script: str, stdout: str, when: str, where: str) -> str:
    """A script's printed section behind its marker, with the date and machine under its title."""
    lines = stdout.strip().splitlines()
    title, rest = (lines[0], lines[1:]) if lines and lines[0].startswith("## ") else (f"## {script}", lines)
    return "\n".join([f"<!-- run_all: {script} -->", title, "", f"*{script}.py, {when}; {where}.*", *rest,
                      f"<!-- /run_all: {script} -->"])


#: Analyses run by hand with their options (a pool study, the draws per setting): without them they print
#: nothing, and `make bench` counted them as failures (exit 1 every time); their RESULTS.md sections are
#: hand-written, each with its command
BY_HAND = ("bench_lmm_boundary", "bench_lmm_calibration")


def main(argv: list[str]) -> int:
    known = sorted(p.stem for p in HERE.glob("bench_*.py") if p.stem not in BY_HAND)
    ap = argparse.ArgumentParser(prog="benchmarks/run_all.py", description="Run benchmarks and update "
                                 "benchmarks/RESULTS.md (only the named scripts' sections are replaced).")
    ap.add_argument("scripts", nargs="*", metavar="bench_x", help="scripts to run (default: all): " + " ".join(known))
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    unknown = [s for s in args.scripts if s.removesuffix(".py") not in known]
    if unknown:
        hand = unknown[0].removesuffix(".py") in BY_HAND
        print(f"error: {unknown[0]!r} is run by hand with its options (its RESULTS.md section names them)" if hand else
              f"error: no benchmark {unknown[0]!r} in benchmarks/ (choose from {', '.join(known)})", file=sys.stderr)
        return 2
    scripts = [s.removesuffix(".py") for s in args.scripts] or known
    when, where = f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC", machine()
    new, failed = {}, []
    for script in scripts:
        print(f"running {script}.py ...", flush=True)
        res = subprocess.run([sys.executable, str(HERE / f"{script}.py")], capture_output=True, text=True,
                             cwd=HERE.parent)
        if res.returncode == 0 and res.stdout.strip():
            new[script] = marked(script, res.stdout, when, where)
            print(new[script], flush=True)
        else:
            failed.append(script)
            print(f"FAILED {script}.py (exit {res.returncode}); its old section is kept:\n"
                  + "\n".join(res.stderr.strip().splitlines()[-5:]), file=sys.stderr, flush=True)
    old = RESULTS.read_text() if RESULTS.exists() else ""
    if new:
        atomic_write_text(RESULTS, merge(old, new))
    print(f"{len(new)} section(s) written to {RESULTS}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
