"""Inception extractor: clean-fid resize + torch-fidelity architecture, with random weights in a file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.features import make_extractor
from pcpo_eval.features.base import clean_resize
from pcpo_eval.features.inception import TFInceptionTrunk, is_torchscript

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def random_weights(tmp_path_factory):
    """Randomly initialized TF-Inception state dict (non-trivial BN stats) saved like the real .pth."""
    torch.manual_seed(0)  # nn.Module default init uses the global generator; fixed for reproducibility
    trunk = TFInceptionTrunk()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, buf in trunk.named_buffers():
            if name.endswith("running_mean"):
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
            elif name.endswith("running_var"):
                buf.copy_(torch.rand(buf.shape, generator=gen) + 0.5)
    path = tmp_path_factory.mktemp("w") / "pt_inception-2015-12-05-6726825d.pth"
    torch.save(trunk.state_dict(), path)
    return path


def _images(n: int, size: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )


def test_clean_resize_equals_cleanfid_resizer() -> None:
    from cleanfid.resize import build_resizer

    imgs = _images(2, 64, 0)
    ours = clean_resize(imgs, 299)
    fn = build_resizer("clean")
    for i in range(2):
        ref = fn(imgs[i].permute(1, 2, 0).numpy())
        np.testing.assert_array_equal(ours[i].permute(1, 2, 0).numpy(), ref)


def test_features_and_logits_match_torch_fidelity(random_weights) -> None:
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    ref = FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048", "logits_unbiased"], feature_extractor_weights_path=str(random_weights)
    )
    ext = make_extractor("inception", weights_path=random_weights)
    assert not is_torchscript(random_weights)
    # at 299x299 both resizes are the identity, so this isolates normalization + network + dtype
    imgs = _images(3, 299, 1)
    out = ext.extract(imgs)
    with torch.no_grad():
        f_ref, l_ref = ref(imgs)
    assert out["features"].shape == (3, 2048) and out["logits"].shape == (3, 1008)
    torch.testing.assert_close(out["features"], f_ref, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out["logits"], l_ref, rtol=1e-4, atol=1e-5)
    s = ext.settings()
    assert s["weights_sha256"] and "clean" in s["resize"] and s["extractor"] == "inception"


def test_fid_value_matches_torch_fidelity_statistics(random_weights) -> None:
    from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric

    from pcpo_eval.metrics.frechet import frechet_distance_from_features

    ext = make_extractor("inception", weights_path=random_weights)
    # first 64 dims: torch-fidelity's sqrtm at d=2048 alone takes ~30 s (see the benchmark instead)
    a = ext(_images(6, 299, 2)).double()[:, :64]
    b = ext(_images(6, 299, 3)).double()[:, :64]
    ref = fid_statistics_to_metric(
        fid_features_to_statistics(a), fid_features_to_statistics(b), verbose=False
    )
    assert frechet_distance_from_features(a.numpy(), b.numpy()) == pytest.approx(
        ref["frechet_inception_distance"], rel=1e-4
    )


def test_non_299_input_uses_clean_resize(random_weights) -> None:
    ext = make_extractor("inception", weights_path=random_weights)
    imgs = _images(2, 40, 4)
    x = (clean_resize(imgs, 299) - 128) / 128
    with torch.no_grad():
        pool, _ = ext.trunk(x)
    torch.testing.assert_close(ext(imgs), pool)


def test_absent_weights_raise_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PCPO_INCEPTION_WEIGHTS", str(tmp_path / "nope.pth"))
    with pytest.raises(MissingWeightsError) as err:
        make_extractor("inception")
    assert "\n" not in str(err.value) and "PCPO_INCEPTION_WEIGHTS" in str(err.value)


def test_wrong_file_is_rejected(tmp_path) -> None:
    bad = tmp_path / "bad.pth"
    torch.save({"foo": torch.zeros(1)}, bad)
    with pytest.raises(MissingWeightsError, match="not a converted TF Inception"):
        make_extractor("inception", weights_path=bad)


def test_torchscript_file_is_called_like_cleanfid(random_weights, tmp_path) -> None:
    """A TorchScript file with NVIDIA's interface (``layers``, ``output``) is detected and used."""
    trunk = TFInceptionTrunk()
    trunk.load_state_dict(torch.load(random_weights, weights_only=True))
    trunk.eval()

    class Nvidia(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            names = [n for n, _ in trunk.named_children() if n != "fc"]
            self.layers = torch.nn.Sequential(*[getattr(trunk, n) for n in names])
            self.output = trunk.fc

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layers(x)

    path = tmp_path / "inception-2015-12-05.pt"
    torch.jit.trace(Nvidia().eval(), torch.zeros(1, 3, 299, 299)).save(str(path))
    assert is_torchscript(path)
    ts = make_extractor("inception", weights_path=path)
    assert ts.settings()["weights_format"].startswith("torchscript")
    imgs = _images(2, 299, 5)
    with torch.no_grad():
        pool, logits = trunk((imgs.float() - 128) / 128)
    out = ts.extract(imgs)
    torch.testing.assert_close(out["features"], pool, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out["logits"], logits, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("size", [512, 256, 64, 299, 300])
def test_torch_resize_agrees_with_clean_fid_within_tolerance(size) -> None:
    """The GPU-side resize (``resize: torch``) against clean-fid's PIL resize, on white noise (the worst
    case for a resampling kernel) downsampled and upsampled: max |diff| within the documented bound."""
    from pcpo_eval.features.base import TORCH_RESIZE_TOLERANCE, torch_clean_resize

    imgs = _images(3, size, 5)
    ref = clean_resize(imgs, 299)
    got = torch_clean_resize(imgs, 299)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    diff = float((got - ref).abs().max())
    assert diff <= TORCH_RESIZE_TOLERANCE, diff
    assert float(ref.std()) > 10  # a real signal, not a constant


def test_resize_choice_is_recorded_and_features_agree(random_weights) -> None:
    from pcpo_eval.errors import UserError
    from pcpo_eval.features.base import resolve_resize

    assert resolve_resize("auto", torch.device("cpu")) == "pil"
    assert resolve_resize("auto", torch.device("cuda")) == "torch"
    with pytest.raises(UserError, match="unknown resize 'lanczos'"):
        resolve_resize("lanczos", torch.device("cpu"))
    imgs = _images(4, 128, 9)
    pil = make_extractor("inception", weights_path=random_weights)
    tch = make_extractor("inception", weights_path=random_weights, resize="torch")
    assert pil.settings()["resize"] != tch.settings()["resize"]  # another cache key: never mixed
    a, b = pil.extract(imgs), tch.extract(imgs)
    for k in ("features", "logits"):
        rel = float((a[k] - b[k]).norm() / a[k].norm())
        assert rel < 1e-4, (k, rel)


def test_fid_resize_flag_bad_value_is_one_error_line(cli, tmp_path) -> None:
    r = cli("metrics", str(tmp_path / "set"), "--out", str(tmp_path / "out"), "--fid-resize", "lanczos",
            "--device", "cpu")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: --fid-resize 'lanczos': choose one of auto, pil, torch"]
    assert not (tmp_path / "out").exists()
