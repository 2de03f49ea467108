"""Weights locator: explicit > env var > caches, HF snapshot layout, one-line errors, the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import pcpo_eval.weights.locate as W
from pcpo_eval.errors import MissingWeightsError, UserError


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path, monkeypatch):
    """Point every cache root at empty temp dirs and clear all backend env vars."""
    from pcpo_eval.testing import isolate_weight_caches

    isolate_weight_caches(tmp_path, monkeypatch)
    return tmp_path


def _hf_snapshot(root, repo, files, rev="abc123", ref=True):
    base = root / "hf" / "hub" / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    for name in files:
        (snap / name).write_bytes(b"x")
    if ref:
        (base / "refs").mkdir(parents=True)
        (base / "refs" / "main").write_text(rev)
    return snap


def test_required_backends_listed():
    for name in ["inception", "dinov2", "lpips_alex", "hps", "pickscore", "imagereward", "clipscore",
                 "aesthetic", "clip_vit_l14", "sd1"]:
        assert name in W.BACKENDS
    assert W.BACKENDS["inception"].env_var == "PCPO_INCEPTION_WEIGHTS"
    assert W.BACKENDS["dinov2"].env_var == "PCPO_DINOV2_PATH"
    assert W.BACKENDS["hps"].env_var == "PCPO_HPS_WEIGHTS"
    assert W.BACKENDS["pickscore"].env_var == "PCPO_PICKSCORE_PATH"


def test_missing_is_one_line_naming_file_and_env():
    with pytest.raises(MissingWeightsError) as exc:
        W.locate("hps")
    msg = str(exc.value)
    assert "\n" not in msg and "PCPO_HPS_WEIGHTS" in msg and "HPS_v2.1_compressed.pt" in msg
    with pytest.raises(MissingWeightsError, match="PCPO_DINOV2_PATH.*config.json"):
        W.locate("dinov2")


def test_unknown_backend_lists_names():
    with pytest.raises(UserError, match="choose one of: inception, dinov2"):
        W.locate("nope")


def test_priority_explicit_over_env_over_cache(isolated_caches, monkeypatch):
    tmp = isolated_caches
    cached = _hf_snapshot(tmp, "xswu/HPSv2", ["HPS_v2.1_compressed.pt"]) / "HPS_v2.1_compressed.pt"
    assert W.locate("hps") == cached
    env_file = tmp / "env.pt"
    env_file.write_bytes(b"1")
    monkeypatch.setenv("PCPO_HPS_WEIGHTS", str(env_file))
    assert W.locate("hps") == env_file
    explicit = tmp / "explicit.pt"
    explicit.write_bytes(b"2")
    assert W.locate("hps", explicit) == explicit


def test_bad_env_or_explicit_is_an_error_not_a_fallback(isolated_caches, monkeypatch):
    tmp = isolated_caches
    _hf_snapshot(tmp, "xswu/HPSv2", ["HPS_v2.1_compressed.pt"])
    monkeypatch.setenv("PCPO_HPS_WEIGHTS", str(tmp / "missing.pt"))
    with pytest.raises(MissingWeightsError, match="PCPO_HPS_WEIGHTS=.*fix or unset"):
        W.locate("hps")
    with pytest.raises(MissingWeightsError, match="not HPS_v2.1_compressed.pt"):
        W.locate("hps", tmp / "also_missing.pt")


def test_hf_snapshot_follows_refs_main(isolated_caches):
    tmp = isolated_caches
    old = _hf_snapshot(tmp, "facebook/dinov2-large", ["config.json"], rev="old", ref=False)
    new = _hf_snapshot(tmp, "facebook/dinov2-large", ["config.json"], rev="new", ref=True)
    assert W.locate("dinov2") == new
    assert old != new


def test_hf_snapshot_without_refs(isolated_caches):
    snap = _hf_snapshot(isolated_caches, "yuvalkirstain/PickScore_v1", ["config.json"], ref=False)
    assert W.locate("pickscore") == snap


def test_dir_backend_needs_marker(isolated_caches):
    d = isolated_caches / "sd"
    d.mkdir()
    with pytest.raises(MissingWeightsError, match="model_index.json"):
        W.locate("sd1", d)
    (d / "model_index.json").write_text("{}")
    assert W.locate("sd1", d) == d


def test_file_backend_accepts_folder_holding_file(isolated_caches):
    d = isolated_caches / "ir"
    d.mkdir()
    (d / "ImageReward.pt").write_bytes(b"x")
    assert W.locate("imagereward", d) == d / "ImageReward.pt"


def test_torch_hub_and_package_caches(isolated_caches):
    tmp = isolated_caches
    ckpt = tmp / "torch" / "hub" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "alexnet-owt-7be5be79.pth").write_bytes(b"x")
    assert W.locate("lpips_alex") == ckpt / "alexnet-owt-7be5be79.pth"
    # torch-fidelity's converted inception in TORCH_HOME, and clean-fid's file in the temp dir
    (tmp / "sys_tmp").mkdir()
    (tmp / "sys_tmp" / "inception-2015-12-05.pt").write_bytes(b"x")
    assert W.locate("inception") == tmp / "sys_tmp" / "inception-2015-12-05.pt"
    (ckpt / "weights-inception-2015-12-05-6726825d.pth").write_bytes(b"x")
    assert W.locate("inception") == ckpt / "weights-inception-2015-12-05-6726825d.pth"


def test_pcpo_weights_dir_comes_first(isolated_caches):
    tmp = isolated_caches
    _hf_snapshot(tmp, "openai/clip-vit-large-patch14", ["config.json"])
    own = tmp / "pcpo" / "clip-vit-large-patch14"
    own.mkdir(parents=True)
    (own / "config.json").write_text("{}")
    assert W.locate("clip_vit_l14") == own


def test_env_roots_read_at_call_time(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert W.hf_hub_cache() == tmp_path / "elsewhere"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "h"))
    assert W.hf_hub_cache() == tmp_path / "h" / "hub"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "t"))
    import torch

    assert W.torch_hub_dir() == tmp_path / "t" / "hub" == __import__("pathlib").Path(torch.hub.get_dir())


def test_cli_weights_json_and_table(isolated_caches, monkeypatch):
    import typer

    app = typer.Typer()
    from pcpo_eval.weights.commands import register

    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer in multi-command mode
        pass

    tmp = isolated_caches
    f = tmp / "hps.pt"
    f.write_bytes(b"x")
    monkeypatch.setenv("PCPO_HPS_WEIGHTS", str(f))
    runner = CliRunner()
    res = runner.invoke(app, ["weights", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)["backends"]}
    assert set(rows) == set(W.BACKENDS)
    assert rows["hps"]["found"] and rows["hps"]["path"] == str(f)
    assert not rows["pickscore"]["found"] and "PCPO_PICKSCORE_PATH" in rows["pickscore"]["error"]
    assert any("HF cache yuvalkirstain/PickScore_v1" in s for s in rows["pickscore"]["searched"])
    res = runner.invoke(app, ["weights", "dinov2"])
    assert res.exit_code == 0 and "MISSING" in res.output and "hf download facebook/dinov2-large" in res.output


def test_every_paper_model_has_a_backend():
    """Setups 1-10 and the evaluation: base pipelines, feature nets, preference models, OCR, BERTScore."""
    needed = {
        "sd14": "CompVis/stable-diffusion-v1-4",
        "sd15": "stable-diffusion-v1-5/stable-diffusion-v1-5",
        "sd35_medium": "stabilityai/stable-diffusion-3.5-medium",
        "flux_dev": "black-forest-labs/FLUX.1-dev",
        "dinov2": "facebook/dinov2-large",
        "qwen25_vl_3b": "Qwen/Qwen2.5-VL-3B-Instruct",
        "llava": "llava-hf/llava-1.5-7b-hf",
        "bertscore_roberta": "FacebookAI/roberta-large",
        "pickscore": "yuvalkirstain/PickScore_v1",
        "clip_vit_l14": "openai/clip-vit-large-patch14",
    }
    for name, repo in needed.items():
        assert W.BACKENDS[name].hf_repos[0] == repo, name
    assert W.BACKENDS["sd15"].hf_repos[1] == "runwayml/stable-diffusion-v1-5"  # old id: an extra location only
    for name in ("inception", "lpips_alex", "hps", "hps_v20", "imagereward", "aesthetic",
                 "paddleocr_det", "paddleocr_rec", "paddleocr_cls", "trocr"):
        assert name in W.BACKENDS


def test_every_backend_entry_is_valid():
    env_vars = [b.env_var for b in W.BACKENDS.values()]
    for key, b in W.BACKENDS.items():
        assert key == b.name and b.kind in ("file", "dir") and b.filename
        assert b.env_var.startswith("PCPO_") and b.env_var.isupper(), b.name
        assert b.description and b.obtain and b.used_by, b.name
        assert b.hf_repos or b.torch_hub or b.extra or "download" in b.obtain, b.name
        for repo in b.hf_repos:
            assert repo.count("/") <= 1 and " " not in repo, repo
    shared = {v for v in env_vars if env_vars.count(v) > 1}
    assert not shared, f"backends share env vars: {shared}"


@pytest.mark.parametrize("name", ["sd35_medium", "flux_dev", "qwen25_vl_3b", "llava", "bertscore_roberta"])
def test_new_backends_found_in_fake_hf_snapshot(isolated_caches, name):
    b = W.BACKENDS[name]
    snap = _hf_snapshot(isolated_caches, b.hf_repos[-1], [b.filename], rev=f"rev-{name}")
    assert W.locate(name) == snap
    assert W.status(name).found


def test_every_backend_absent_is_one_line_naming_its_variable():
    for name, b in W.BACKENDS.items():
        with pytest.raises(MissingWeightsError) as exc:
            W.locate(name)
        msg = str(exc.value)
        assert "\n" not in msg and b.env_var in msg and "not found" in msg, name
        assert not W.status(name).found
