"""Procedural toy data and the toy tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.toy import data as toy_data
from pcpo_eval.toy.text import BOS, EOS, PAD, VOCAB, ToyTokenizer


def test_prompt_set():
    assert len(toy_data.TOY_PROMPTS) == 45 == len(set(toy_data.TOY_PROMPTS))
    assert toy_data.TOY_PROMPTS[0] == "red circle"
    assert toy_data.prompt_id("  Red   CIRCLE ") == 0
    assert toy_data.prompt_id("white ring") == 44
    with pytest.raises(UserError, match="not a toy prompt"):
        toy_data.prompt_id("a cat")


def test_render_is_deterministic_and_index_dependent():
    a = toy_data.render(7, 3)
    assert a.dtype == np.uint8 and a.shape == (3, 32, 32)
    np.testing.assert_array_equal(a, toy_data.render(7, 3))
    assert not np.array_equal(a, toy_data.render(7, 4))
    batch = toy_data.render_batch([7, 1], [3, 0])
    np.testing.assert_array_equal(batch[0].numpy(), a)  # independent of batch composition


def test_render_draws_the_prompt_color():
    # The brightest pixels of a "<color> <shape>" image are close to the nominal color.
    for pid, prompt in enumerate(toy_data.TOY_PROMPTS):
        img = toy_data.render(pid, 0).reshape(3, -1).astype(float)
        color = np.asarray(toy_data.COLORS[prompt.split()[0]], float)
        dist = np.abs(img - color[:, None]).max(axis=0)
        assert (dist <= 13).sum() >= 20, prompt  # at least 20 fully covered object pixels


def test_dataset_labels_and_sizes():
    x, y = toy_data.dataset(2)
    assert x.shape == (90, 3, 32, 32) and x.dtype == torch.uint8
    assert y.tolist() == [p for p in range(45) for _ in range(2)]
    small = toy_data.render(0, 0, size=16)
    assert small.shape == (3, 16, 16)


def test_tokenizer():
    tok = ToyTokenizer(6)
    ids = tok(["red circle", "", "BLUE ring"])
    v = {w: i for i, w in enumerate(VOCAB)}
    assert ids.tolist() == [[BOS, v["red"], v["circle"], EOS, PAD, PAD], [BOS, EOS, PAD, PAD, PAD, PAD],
                            [BOS, v["blue"], v["ring"], EOS, PAD, PAD]]
    with pytest.raises(UserError, match="unknown word 'cat'"):
        tok(["red cat"])
    with pytest.raises(UserError, match="too long"):
        tok(["red red red red red"])
