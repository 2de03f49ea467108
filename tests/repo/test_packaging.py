"""The built wheel works on its own: the package, its entry point and the shipped toy weights.

The wheel is built from a copy of the sources (nothing is written into the checkout) with this
environment's setuptools (no build isolation, so nothing is downloaded), installed with
``pip install --no-deps --target DIR`` and run from outside the checkout with ``PYTHONPATH=DIR``:
the dependencies come from this environment, pcpo_eval itself only from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracked_package_data() -> list[str]:
    """Non-Python files under pcpo_eval/ (git-tracked where git can say; else everything on disk)."""
    try:
        out = subprocess.run(["git", "ls-files", "pcpo_eval"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = [str(p.relative_to(ROOT)) for p in (ROOT / "pcpo_eval").rglob("*") if p.is_file()]
    return sorted(p for p in out if not p.endswith((".py", ".pyc")) and "__pycache__" not in p)


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_checkout(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "pcpo_eval", src / "pcpo_eval",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    dist = tmp_path / "dist"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--quiet", "-w", str(dist), str(src)], check=True, env=env, cwd=tmp_path)
    (wheel,) = dist.glob("pcpo_eval-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    missing = [p for p in _tracked_package_data() if p not in names]
    assert not missing, f"package data left out of the wheel (pyproject [tool.setuptools.package-data]): {missing}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target",
                    str(target), str(wheel)], check=True, env=env, cwd=tmp_path)
    script = target / "bin" / "pcpo-eval"
    assert script.is_file()

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run_env = {**env, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}

    def pcpo(*args: str) -> str:
        proc = subprocess.run([sys.executable, str(script), *args], cwd=outside, env=run_env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    where = subprocess.run([sys.executable, "-c", "import pcpo_eval; print(pcpo_eval.__file__)"], cwd=outside,
                           env=run_env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).resolve().is_relative_to(target.resolve()), where

    from pcpo_eval import __version__

    assert pcpo("--version").strip() == f"pcpo-eval {__version__}"
    # The smallest toy run that loads every shipped toy weight (text encoder, U-Net, classifier).
    result = json.loads(pcpo("toy", "check", "--seeds", "2", "--threads", "1", "--json"))
    assert Path(result["weights"]).resolve() == (target / "pcpo_eval" / "toy" / "weights").resolve()
    assert result["passed"] is True
