"""JPEG (DDPO) and toy rewards against independent references."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from pcpo_eval.errors import UserError
from pcpo_eval.rewards import make_reward
from pcpo_eval.testing import tiny_toy_classifier
from pcpo_eval.toy import data as toy_data


def _images(n: int = 4) -> torch.Tensor:
    return toy_data.render_batch(list(range(n)), [0] * n)


def test_jpeg_matches_ddpo_formula():
    imgs = _images()
    # ddpo-pytorch: pil.save(buffer, format="JPEG", quality=95); buffer.tell() / 1000
    ref = []
    for img in imgs.permute(0, 2, 3, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=95)
        ref.append(len(buf.getvalue()) / 1000)
    inc = make_reward("jpeg_incompressibility")(imgs, [""] * 4)
    comp = make_reward("jpeg_compressibility")(imgs, [""] * 4)
    assert inc.dtype == torch.float32 and inc.shape == (4,)
    np.testing.assert_allclose(inc.numpy(), ref, rtol=1e-6)
    np.testing.assert_allclose(comp.numpy(), -np.asarray(ref), rtol=1e-6)


def test_jpeg_orders_noise_above_flat():
    flat = torch.full((1, 3, 32, 32), 128, dtype=torch.uint8)
    noise = torch.randint(0, 256, (1, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    r = make_reward("jpeg_incompressibility")(torch.cat([flat, noise]), ["", ""])
    assert r[1] > r[0] * 2


def test_rewards_reject_float_images():
    with pytest.raises(UserError, match="uint8"):
        make_reward("toy_aesthetic")(torch.zeros(1, 3, 8, 8), [""])


def test_toy_aesthetic_is_colorfulness():
    imgs = _images()
    got = make_reward("toy_aesthetic")(imgs, [""] * 4).numpy()
    for i, img in enumerate(imgs.numpy().astype(float)):  # Hasler & Suesstrunk (2003), numpy
        rg = img[0] - img[1]
        yb = 0.5 * (img[0] + img[1]) - img[2]
        m = np.sqrt(rg.std() ** 2 + yb.std() ** 2) + 0.3 * np.sqrt(rg.mean() ** 2 + yb.mean() ** 2)
        assert got[i] == pytest.approx(m / 100, rel=1e-5)
    gray = torch.full((1, 3, 8, 8), 77, dtype=torch.uint8)
    assert make_reward("toy_aesthetic")(gray, [""]).item() == 0.0


def test_toy_alignment_is_softmax_of_prompt_class():
    net = tiny_toy_classifier(3)
    imgs = _images(3)
    prompts = ["red circle", "white ring", "blue cross"]
    r = make_reward("toy_alignment", classifier=net)(imgs, prompts)
    with torch.no_grad():
        p = torch.softmax(net(imgs)["logits"], 1)
    ids = [toy_data.prompt_id(q) for q in prompts]
    torch.testing.assert_close(r, p[torch.arange(3), ids])
    with pytest.raises(UserError, match="not a toy prompt"):
        make_reward("toy_alignment", classifier=net)(imgs[:1], ["a photo of a cat"])


def test_toy_alignment_shipped_classifier_prefers_matching_prompt():
    imgs = toy_data.render_batch([0, 44], [5, 5])  # red circle, white ring
    fn = make_reward("toy_alignment")
    right = fn(imgs, ["red circle", "white ring"])
    wrong = fn(imgs, ["white ring", "red circle"])
    assert (right > 0.9).all() and (wrong < 0.1).all()
