"""Metric workers end to end on toy image sets (stand-in toy classifier, fake reward), bad input, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from pcpo_eval import rewards
from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.imageset import ImageSet
from pcpo_eval.metrics.extract import ExtractionReport, MetricsOptions
from pcpo_eval.metrics.frechet import frechet_distance_from_features
from pcpo_eval.metrics.inception_score import inception_score
from pcpo_eval.metrics.lpips_diversity import make_lpips_embedder, naive_lpips_diversity
from pcpo_eval.metrics.workers import compute_metrics, run_metrics
from tests.support.metrics import TOY_PROMPTS, StandInToyClassifier, make_image_set, rewrite_image

SEEDS = list(range(12))


@pytest.fixture(autouse=True)
def _fake_reward(monkeypatch):
    monkeypatch.setitem(rewards.REGISTRY, "hps", "tests.support.metrics:fake_reward")


@pytest.fixture
def sets(tmp_path):
    a = make_image_set(tmp_path / "a", TOY_PROMPTS, SEEDS)
    b = make_image_set(tmp_path / "b", TOY_PROMPTS, [100 + s for s in SEEDS])
    return a, b


def _opts(tmp_path: Path, **kw) -> MetricsOptions:
    return MetricsOptions(
        batch_size=5,
        cache_dir=tmp_path / "cache",
        lpips_batch=4,
        lpips_trunk="random",
        extractor_options={"toy": {"classifier": StandInToyClassifier(0)}},
        **kw,
    )


def _direct(root: Path) -> dict[str, torch.Tensor]:
    s = ImageSet.load(root)
    with torch.no_grad():
        return StandInToyClassifier(0)(s.read_batch(range(len(s))))


def test_set_against_itself_and_outputs(sets, tmp_path) -> None:
    a, _ = sets
    out = tmp_path / "out"
    res = run_metrics(a, "fd_toy,is_toy,lpips_toy,hps", out, reference=a, options=_opts(tmp_path))
    assert res["metrics"]["fd_toy"] == 0.0  # exactly: a set against itself
    on_disk = json.loads((out / "metrics.json").read_text())
    assert set(on_disk) == {"metrics", "settings"} and on_disk["metrics"].keys() == res["metrics"].keys()
    st = on_disk["settings"]
    assert st["inception_score"]["splits"] == 10 and st["inception_score"]["shuffle_seed"] == 2020
    assert st["extractors"]["toy"]["weights_sha256"] and st["n_images"] == 36
    pp = pd.read_parquet(out / "per_prompt.parquet")
    assert list(pp["prompt_id"]) == [0, 1, 2] and list(pp["fd_toy"]) == [0.0, 0.0, 0.0]
    assert st["frechet"]["diagnostics"]["fd_toy"]["method"] == "identical"
    assert {"is_toy", "is_toy_std", "lpips_toy", "hps", "n_images", "n_reference"} <= set(pp.columns)
    pi = pd.read_parquet(out / "per_image.parquet")
    assert len(pi) == 36 and "hps" in pi.columns


def test_values_match_direct_computation(sets, tmp_path) -> None:
    a, b = sets
    res = compute_metrics(a, "fd_toy,is_toy,hps,lpips", b, _opts(tmp_path))
    fa, fb = _direct(a), _direct(b)
    assert res.metrics["fd_toy"] == pytest.approx(
        frechet_distance_from_features(fa["features"].numpy(), fb["features"].numpy()), rel=1e-6
    )
    assert res.metrics["is_toy"] == pytest.approx(inception_score(fa["logits"].numpy()).mean, rel=1e-6)
    sa = ImageSet.load(a)
    rows = sa.rows_by_prompt()
    for i, pid in enumerate(rows):
        fr = frechet_distance_from_features(
            fa["features"][rows[pid]].numpy(), fb["features"][ImageSet.load(b).rows_by_prompt()[pid]].numpy()
        )
        # float32 features of a few images per prompt: the per-prompt FD is ill-conditioned, and another
        # batch composition in the workers moved it by 1.0e-6 relative on one CPU
        assert res.per_prompt["fd_toy"][i] == pytest.approx(fr, rel=1e-5)
    # LPIPS per prompt == naive pairwise lpips calls on that prompt's images
    model = make_lpips_embedder("random").model
    imgs = sa.read_batch(rows[1])
    assert res.per_prompt["lpips"][1] == pytest.approx(naive_lpips_diversity(model, imgs), rel=1e-5)
    assert res.metrics["lpips"] == pytest.approx(float(np.mean(res.per_prompt["lpips"])), rel=1e-12)
    # rewards: per image and per-prompt means
    imgs_all = sa.read_batch(range(len(sa)))
    expected = imgs_all.float().mean(dim=(1, 2, 3)) / 255 + torch.tensor(
        [len(p) / 100 for p in sa.manifest["prompt"]]
    )
    np.testing.assert_allclose(res.per_image["hps"], expected.numpy(), rtol=1e-6)
    assert res.metrics["hps"] == pytest.approx(float(expected.mean()), rel=1e-6)


def test_second_run_reuses_the_cache(sets, tmp_path) -> None:
    a, b = sets
    first, second = ExtractionReport(), ExtractionReport()
    r1 = compute_metrics(a, "fd_toy,hps", b, _opts(tmp_path), report=first)
    r2 = compute_metrics(a, "fd_toy,hps", b, _opts(tmp_path), report=second)
    assert first.computed == 3 * 36 and second.computed == 0  # set + reference features, set rewards
    assert r1.metrics == r2.metrics
    # different weights -> different cache directory, features recomputed
    other = _opts(tmp_path)
    other.extractor_options = {"toy": {"classifier": StandInToyClassifier(1)}}
    third = ExtractionReport()
    compute_metrics(a, "fd_toy", b, other, report=third)
    assert third.computed == 72


def test_grayscale_and_rgba_are_converted_and_reported(sets, tmp_path) -> None:
    a, _ = sets
    rewrite_image(a, 0, np.full((32, 32), 100, np.uint8), mode="L")
    rewrite_image(a, 1, np.full((32, 32, 4), 50, np.uint8), mode="RGBA")
    res = compute_metrics(a, "is_toy", None, _opts(tmp_path))
    assert res.settings["converted_to_rgb"] == {"L": 1, "RGBA": 1}


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("truncated", "truncated"),
        ("size", "one resolution"),
        ("sha", "does not match its image_sha256"),
        ("missing", "cannot read image"),
    ],
)
def test_bad_images_fail_in_one_line_and_keep_old_outputs(sets, tmp_path, damage, message) -> None:
    a, b = sets
    out = tmp_path / "out"
    c = make_image_set(tmp_path / "c", TOY_PROMPTS, [200 + s for s in SEEDS])
    run_metrics(c, "fd_toy", out, b, _opts(tmp_path))  # the set's metrics, then it is damaged and measured again
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    path = c / pd.read_parquet(c / "manifest.parquet").loc[5, "path"]
    if damage == "truncated":
        rewrite_image(c, 5, path.read_bytes()[:60])
    elif damage == "size":
        rewrite_image(c, 5, np.zeros((40, 32, 3), np.uint8))
    elif damage == "sha":
        rewrite_image(c, 5, np.zeros((32, 32, 3), np.uint8), update_sha=False)
    else:
        path.unlink()
    with pytest.raises(UserError, match=message) as err:
        run_metrics(c, "fd_toy", out, b, _opts(tmp_path))
    assert "\n" not in str(err.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_request_errors(sets, tmp_path) -> None:
    a, b = sets
    other = make_image_set(tmp_path / "other", {0: "red circle", 1: "blue square", 2: "yellow star"}, SEEDS)
    with pytest.raises(UserError, match="prompt_id 2 is 'green triangle'"):
        compute_metrics(a, "fd_toy", other, _opts(tmp_path))
    few = make_image_set(tmp_path / "few", TOY_PROMPTS, [1])
    with pytest.raises(UserError, match="at least 2"):
        compute_metrics(few, "lpips_toy", None, _opts(tmp_path))
    with pytest.raises(UserError, match="at least 2"):
        compute_metrics(a, "fd_toy", few, _opts(tmp_path))
    with pytest.raises(UserError, match="--reference"):
        compute_metrics(a, "fd_toy", None, _opts(tmp_path))
    with pytest.raises(UserError, match="unknown metric"):
        compute_metrics(a, "fid,kid", b, _opts(tmp_path))
    with pytest.raises(UserError, match="not an image set"):
        compute_metrics(tmp_path / "nowhere", "is_toy", None, _opts(tmp_path))


def test_absent_weights_fail_before_any_output(sets, tmp_path, monkeypatch, cli) -> None:
    a, b = sets
    for var in ("PCPO_INCEPTION_WEIGHTS", "PCPO_DINOV2_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PCPO_WEIGHTS_DIR", str(tmp_path / "w"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path / "tmp"))
    out = tmp_path / "out"
    with pytest.raises(MissingWeightsError):
        run_metrics(a, "fid", out, b, _opts(tmp_path))
    assert not out.exists()
    r = cli("metrics", a, "--reference", b, "--metrics", "fd_dinov2", "--out", out)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert not out.exists()


def test_features_command_exports_manifest_order(sets, tmp_path, cli) -> None:
    from pcpo_eval.features.inception import TFInceptionTrunk

    small = make_image_set(tmp_path / "small", {0: "red circle", 1: "blue square"}, [0, 1])
    torch.manual_seed(0)
    w = tmp_path / "inc.pth"
    torch.save(TFInceptionTrunk().state_dict(), w)
    out = tmp_path / "f.npy"
    r = cli("features", small, "--extractor", "inception", "--weights", w, "--output", out, "--batch-size", "3")
    assert r.returncode == 0, r.stderr
    feats = np.load(out)
    from pcpo_eval.features import make_extractor

    s = ImageSet.load(small)
    direct = make_extractor("inception", weights_path=w)(s.read_batch([2]))
    assert feats.shape == (4, 2048)
    np.testing.assert_allclose(feats[[2]], direct.numpy(), rtol=1e-5, atol=1e-6)
    r = cli("features", small, "--extractor", "nope", "--output", out)
    assert r.returncode == 2 and "choose one of" in r.stderr


def test_a_failed_rewrite_keeps_the_old_three_files(tmp_path, monkeypatch):
    """A folder with metrics.json is complete: a rewrite that fails while writing its files (a full disk)
    must leave the old three as they were, and no temporary file. Before, metrics.json was removed first
    and the tables replaced one by one: a full disk left a new per-prompt table, the old per-image one
    and no metrics.json, while the error said finished work was kept."""
    import pcpo_eval.metrics.workers as workers
    from pcpo_eval.metricsdir import metrics_path, per_image_path, per_prompt_path

    def result(v: float) -> workers.MetricsResult:
        return workers.MetricsResult({"m": v}, {"image_set": "s"}, pd.DataFrame({"prompt_id": [0], "m": [v]}),
                                     pd.DataFrame({"prompt_id": [0], "seed": [0]}))

    workers.write_outputs(result(1.0), tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = pd.DataFrame.to_parquet

    def disk_full_on_the_second_table(self, *a, **k):
        if "seed" in self.columns:
            raise OSError(28, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full_on_the_second_table)
    with pytest.raises(OSError):
        workers.write_outputs(result(2.0), tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # old three, no temporary file
    assert pd.read_parquet(per_prompt_path(tmp_path))["m"].tolist() == [1.0]
    assert json.loads(metrics_path(tmp_path).read_text())["metrics"]["m"] == 1.0 and per_image_path(tmp_path).exists()


def test_outputs_current_tells_a_kept_folder_from_a_stale_one(sets, tmp_path):
    """``study`` and ``irg-sweep`` keep a metrics folder only while it is this request's: the same metric
    names, manifests and value-changing options (here IS splits) as the run that wrote it."""
    from pcpo_eval.metrics.workers import outputs_current

    a, b = sets
    out = tmp_path / "out"
    assert not outputs_current(out, a, ["fd_toy", "is_toy"], b, _opts(tmp_path))  # nothing there yet
    run_metrics(a, "fd_toy,is_toy", out, reference=b, options=_opts(tmp_path, is_splits=2))
    assert outputs_current(out, a, ["fd_toy", "is_toy"], b, _opts(tmp_path, is_splits=2))
    assert not outputs_current(out, a, ["fd_toy", "is_toy"], b, _opts(tmp_path, is_splits=3))
    assert not outputs_current(out, a, ["fd_toy"], b, _opts(tmp_path, is_splits=2))
    assert not outputs_current(out, a, ["fd_toy", "is_toy"], a, _opts(tmp_path, is_splits=2))
    make_image_set(a, TOY_PROMPTS, SEEDS[:6])  # the set re-rendered with fewer seeds: another manifest
    assert not outputs_current(out, a, ["fd_toy", "is_toy"], b, _opts(tmp_path, is_splits=2))


def test_two_runs_writing_one_folder_leave_one_runs_files(tmp_path, monkeypatch):
    """Two ``metrics`` runs into one ``--out`` (say, two sets): when the second writes while the first is
    between its tables, the folder must end as one run's three files, not one run's per-prompt table
    beside the other's metrics.json (each file alone is atomic; the group was not)."""
    import threading

    import pcpo_eval.metrics.workers as workers
    from pcpo_eval.metricsdir import metrics_path, per_image_path, per_prompt_path

    def result(v: float) -> workers.MetricsResult:
        return workers.MetricsResult({"m": v}, {"image_set": str(v)}, pd.DataFrame({"prompt_id": [0], "m": [v]}),
                                     pd.DataFrame({"prompt_id": [0], "seed": [0], "m": [v]}))

    real, other = pd.DataFrame.to_parquet, []

    def second_run_writes_meanwhile(self, *a, **k):
        if "seed" in self.columns and not other:  # the first run, between its two tables
            other.append(threading.Thread(target=workers.write_outputs, args=(result(2.0), tmp_path)))
            other[0].start()
            other[0].join(timeout=1.0)  # unlocked, the whole second write happens here
        return real(self, *a, **k)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", second_run_writes_meanwhile)
    workers.write_outputs(result(1.0), tmp_path)
    other[0].join(timeout=30)
    assert not other[0].is_alive()
    values = {json.loads(metrics_path(tmp_path).read_text())["metrics"]["m"],
              float(pd.read_parquet(per_prompt_path(tmp_path))["m"].iloc[0]),
              float(pd.read_parquet(per_image_path(tmp_path))["m"].iloc[0])}
    assert values == {2.0}, values  # the later run's files, all three


def test_reward_weights_replaced_at_the_same_path_are_scored_again(sets, tmp_path, monkeypatch):
    """A preference reward records its weights by path: new weights written over the old file (same path,
    same options) must not be answered from the scores the old weights cached."""
    import os

    monkeypatch.setitem(rewards.REGISTRY, "hps", "tests.support.metrics:file_reward")
    a, _ = sets
    weights = tmp_path / "weights.txt"
    weights.write_text("1.0")
    opts = _opts(tmp_path, reward_options={"hps": {"weights": str(weights)}})
    assert compute_metrics(a, "hps", options=opts).metrics["hps"] == 1.0
    weights.write_text("2.5")
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a later write, however coarse the clock
    assert compute_metrics(a, "hps", options=opts).metrics["hps"] == 2.5
