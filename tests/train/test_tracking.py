"""Experiment tracking (pcpo_eval/train/tracking.py): each backend, offline, records what log.parquet holds.

A 2-epoch toy training per backend, then the logged data is read back with the backend's own
format: TensorBoard event files (EventAccumulator), the W&B offline transaction log (records parsed
with wandb's protobuf), trackio's SQLite database under the run directory. Scalars must equal the
log.parquet values, the reward histogram must count every sample, the image grid must be there,
and the config must be the run's full config.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.tracking import image_grid, parse_log_to
from pcpo_eval.train.trainer import train
from tests.support.train import TINY

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
N_SAMPLES = TINY["sample_batch_size"] * TINY["sample_batches_per_epoch"]


def _train(tmp_path: Path, log_to: str, **kw) -> tuple[Path, pd.DataFrame]:
    out = tmp_path / "run"
    cfg = config_from_dict({**TINY, "device": "cpu", "log_to": log_to, **kw})
    train(cfg, out)
    return out, pd.read_parquet(out / "log.parquet")


def test_log_to_is_validated():
    assert parse_log_to("tensorboard, wandb,wandb") == ("tensorboard", "wandb")
    assert parse_log_to("none") == () and parse_log_to("") == ()
    with pytest.raises(UserError, match="unknown tracker.*mlflow.*choose from tensorboard, wandb, trackio"):
        config_from_dict({**TINY, "log_to": "tensorboard,mlflow"})
    with pytest.raises(UserError, match="wandb_mode='cloud'"):
        config_from_dict({**TINY, "wandb_mode": "cloud"})


def test_image_grid_places_images_row_major():
    imgs = np.stack([np.full((3, 2, 2), i * 10, np.uint8) for i in range(5)])
    g = image_grid(imgs, ncol=2)
    assert g.shape == (6, 4, 3)
    assert g[0, 0, 0] == 0 and g[0, 2, 0] == 10 and g[2, 0, 0] == 20 and g[4, 0, 0] == 40 and g[4, 2, 0] == 0


def test_tensorboard_records_scalars_histogram_images_and_config(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, log = _train(tmp_path, "tensorboard")
    acc = EventAccumulator(str(out / "tb"), size_guidance={"images": 0, "histograms": 0, "scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    for col in ("reward_mean", "clipfrac", "approx_kl", "wall_clock_s"):
        got = {e.step: e.value for e in acc.Scalars(col)}
        assert got == pytest.approx({int(e): float(v) for e, v in zip(log.epoch, log[col], strict=True)}, rel=1e-6)
    hist = acc.Histograms("reward")
    assert [h.step for h in hist] == [1, 2] and all(h.histogram_value.num == N_SAMPLES for h in hist)
    assert [i.step for i in acc.Images("samples")] == [1, 2]
    config_text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert yaml.safe_load(config_text.strip("`").removeprefix("yaml\n"))["log_to"] == "tensorboard"
    assert "samples" in tags["images"]


def _wandb_records(path: Path):
    """Records of a W&B transaction log, through the importer's reader of its framing."""
    from wandb.proto import wandb_internal_pb2 as pb

    from pcpo_eval.train.importers import wandb_log_records

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    return wandb_log_records(pb, data)


def test_wandb_offline_records_scalars_histogram_images_and_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    out, log = _train(tmp_path, "wandb", log_images_every=2)
    import wandb

    wandb.teardown()  # wandb's service process writes the log: once it is shut down, every record is on disk
    files = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, "one offline run, nothing synced"
    history, config = [], {}
    for rec in _wandb_records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item})
        elif kind == "run":
            config = {i.key: json.loads(i.value_json) for i in rec.run.config.update}
            assert rec.run.display_name == "run"
    assert [h["_step"] for h in history] == [1, 2]
    for h, (_, row) in zip(history, log.iterrows(), strict=True):
        assert h["reward_mean"] == pytest.approx(row["reward_mean"]) and h["clipfrac"] == pytest.approx(row["clipfrac"])
        assert sum(h["reward_hist/values"]) == N_SAMPLES
    assert "samples/path" not in history[0] and history[1]["samples/_type"] == "image-file"  # every 2nd epoch
    assert config["log_to"] == "wandb" and config["wandb_mode"] == "offline" and config["epochs"] == TINY["epochs"]


def test_trackio_writes_its_database_under_the_run(tmp_path):
    out, log = _train(tmp_path, "trackio", log_project="unit")
    db = out / "trackio" / "unit.db"
    assert db.is_file(), sorted(p.name for p in (out / "trackio").iterdir())
    with sqlite3.connect(db) as con:
        rows = con.execute("select step, metrics from metrics where run_name = 'run' order by step").fetchall()
        (config_json,) = con.execute("select config from configs where run_name = 'run'").fetchone()
    assert [s for s, _ in rows] == [1, 2]
    for (_, metrics), (_, row) in zip(rows, log.iterrows(), strict=True):
        m = json.loads(metrics)
        assert m["reward_mean"] == pytest.approx(row["reward_mean"]) and m["approx_kl"] == pytest.approx(row["approx_kl"])
        assert m["reward_hist"]["_type"] == "trackio.histogram" and m["samples"]["_type"]
    assert json.loads(config_json)["log_project"] == "unit"
    assert list((out / "trackio" / "media").rglob("*.png")), "the sample grids are stored with the run"


def test_log_to_none_writes_only_the_log(tmp_path):
    out, log = _train(tmp_path, "none", epochs=1)
    assert len(log) == 1 and not (out / "tb").exists() and not (out / "wandb").exists()


def test_cli_log_to_overrides_the_config(cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "epochs": 1, "device": "cpu"}))
    res = cli("train", cfg, "--out", tmp_path / "r", "--log-to", "none")
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["log_to"] == "none"
    assert not (tmp_path / "r" / "tb").exists()
    bad = cli("train", cfg, "--out", tmp_path / "r2", "--log-to", "comet")
    assert bad.returncode == 2 and "unknown tracker(s) comet" in bad.stderr and not (tmp_path / "r2").exists()
