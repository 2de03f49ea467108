"""Running R (lme4 / lmerTest) as the reference in tests (a helper module, not a test module).

:func:`have_r_package` says whether ``Rscript`` can load a package (tests skip with the reason when
not); :func:`run_r_fits` runs one R script over a table of cases in one process and parses its
output, whose blocks start with ``model <id>`` followed by ``<key> <values...>`` lines.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd


def have_r_package(name: str) -> bool:
    """``Rscript`` exists and loads ``name``."""
    if shutil.which("Rscript") is None:
        return False
    r = subprocess.run(["Rscript", "-e", f"quit(status = !requireNamespace('{name}', quietly = TRUE))"],
                       capture_output=True, timeout=120)
    return r.returncode == 0


def parse_r_blocks(text: str) -> dict[str, dict[str, list[str]]]:
    """``model <id>`` blocks of ``<key> <values...>`` lines -> {id: {key: values}}."""
    out: dict[str, dict[str, list[str]]] = {}
    cur: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, *vals = line.split()
        if key == "model":
            cur = out.setdefault(vals[0], {})
        else:
            cur[key] = vals
    return out


def run_r_fits(script: str, specs: pd.DataFrame, folder: Path) -> dict[str, dict[str, list[str]]]:
    """Write ``specs`` (one row per case) and ``script`` to ``folder``, run ``Rscript script specs.tsv``."""
    specs.to_csv(folder / "specs.tsv", sep="\t", index=False)
    (folder / "fit.R").write_text(script)
    r = subprocess.run(["Rscript", str(folder / "fit.R"), str(folder / "specs.tsv")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return parse_r_blocks(r.stdout)
