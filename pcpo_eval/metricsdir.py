"""The metrics-folder contract (paths only): one home for the files ``pcpo-eval metrics --out OUT`` leaves.

::

    OUT/per_prompt.parquet   one row per prompt (every metric's per-prompt column)
    OUT/per_image.parquet    one row per image (the per-image columns, e.g. reward scores)
    OUT/metrics.json         {"metrics": {name: value}, "settings": {...}}; written last, so a folder
                             with it is complete
    OUT/.metrics.lock        flock held while the three are written (two runs into one folder take turns)

Written by :func:`pcpo_eval.metrics.workers.write_outputs`; read by ``study`` (the metrics stage's
skip check, the results tables: ``STUDY/metrics/<label>`` is one such folder) and ``irg-sweep``
(``OUT/metrics/point_NN``). It sits on the ground floor with the other folder formats that cross
stages (:mod:`pcpo_eval.imageset`, :mod:`pcpo_eval.rundir`, :mod:`pcpo_eval.studydir`); no stage
spells these names itself (``tests/repo/test_file_names.py``).
"""

from __future__ import annotations

from pathlib import Path

#: the overall values and their provenance; written last
METRICS_FILE = "metrics.json"
#: one row per prompt
PER_PROMPT_FILE = "per_prompt.parquet"
#: one row per image
PER_IMAGE_FILE = "per_image.parquet"
#: held (``flock``) while a run writes the three files above, so two runs' files never mix
LOCK_FILE = ".metrics.lock"


def metrics_path(out_dir: str | Path) -> Path:
    """``OUT/metrics.json``."""
    return Path(out_dir) / METRICS_FILE


def per_prompt_path(out_dir: str | Path) -> Path:
    """``OUT/per_prompt.parquet``."""
    return Path(out_dir) / PER_PROMPT_FILE


def per_image_path(out_dir: str | Path) -> Path:
    """``OUT/per_image.parquet``."""
    return Path(out_dir) / PER_IMAGE_FILE


def lock_path(out_dir: str | Path) -> Path:
    """``OUT/.metrics.lock``."""
    return Path(out_dir) / LOCK_FILE
