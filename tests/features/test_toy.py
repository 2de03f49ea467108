"""Toy extractor and registry (with a stand-in of the toy classifier's interface)."""

from __future__ import annotations

import pytest
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.features import REGISTRY, make_extractor
from tests.support.metrics import StandInToyClassifier


def test_registry_names_and_unknown_name() -> None:
    assert set(REGISTRY) == {"inception", "dinov2", "toy"}
    with pytest.raises(UserError, match="choose one of: dinov2, inception, toy"):
        make_extractor("vgg")


def test_toy_extractor_wraps_classifier() -> None:
    clf = StandInToyClassifier(seed=0)
    ext = make_extractor("toy", classifier=clf)
    imgs = torch.randint(
        0, 256, (4, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    out = ext.extract(imgs)
    ref = clf(imgs)
    torch.testing.assert_close(out["features"], ref["features"])
    torch.testing.assert_close(out["logits"], ref["logits"])
    assert ext.dim == 12 and ext.has_logits and len(ext.layers(imgs)) == 2
    # the weights hash identifies the network
    assert (
        ext.settings()["weights_sha256"]
        == make_extractor("toy", classifier=StandInToyClassifier(0)).settings()["weights_sha256"]
    )
    assert (
        ext.settings()["weights_sha256"]
        != make_extractor("toy", classifier=StandInToyClassifier(1)).settings()["weights_sha256"]
    )


def test_input_contract_is_checked() -> None:
    ext = make_extractor("toy", classifier=StandInToyClassifier())
    with pytest.raises(UserError, match="uint8"):
        ext(torch.zeros(1, 3, 8, 8))


def test_shipped_toy_classifier_fits_the_interface() -> None:
    from pcpo_eval.errors import MissingWeightsError

    try:
        ext = make_extractor("toy")
    except MissingWeightsError as exc:  # the toy weights are rebuilt by `pcpo-eval toy pretrain`
        pytest.skip(f"toy weights not built: {exc}")
    imgs = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = ext.extract(imgs)
    assert out["features"].shape == (3, ext.dim) and out["logits"].shape == (3, 45)
    assert all(t.shape[0] == 3 and t.dim() == 4 for t in ext.layers(imgs))
