"""Inception Score with torch-fidelity's conventions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pcpo_eval.metrics.inception_score import inception_score


def test_uniform_logits_give_one() -> None:
    res = inception_score(np.zeros((100, 7)))
    assert res.mean == pytest.approx(1.0, abs=1e-12)
    assert res.std == pytest.approx(0.0, abs=1e-12)


def test_even_one_hot_classes_give_k() -> None:
    k, n = 8, 800
    labels = np.arange(n) % k  # evenly spread: every split holds each class equally often
    logits = np.full((n, k), -1e4)
    logits[np.arange(n), labels] = 1e4
    res = inception_score(logits, splits=10, shuffle=False)
    assert res.mean == pytest.approx(k, rel=1e-9)
    assert res.std == pytest.approx(0.0, abs=1e-9)
    # with the fixed-seed shuffle each split is only roughly balanced
    assert inception_score(logits, splits=10).mean == pytest.approx(k, rel=0.05)
    assert inception_score(logits, splits=1).mean == pytest.approx(k, rel=1e-9)


def test_sorted_and_shuffled_input_agree_and_unshuffled_sorted_is_wrong() -> None:
    rng = np.random.default_rng(0)
    k, per = 10, 40
    labels = np.repeat(np.arange(k), per)
    logits = rng.normal(size=(k * per, k)) + 6 * np.eye(k)[labels]
    perm = rng.permutation(len(labels))
    a = inception_score(logits, splits=10)  # class-sorted input
    b = inception_score(logits[perm], splits=10)
    assert a.mean == pytest.approx(b.mean, rel=0.05)
    wrong = inception_score(logits, splits=10, shuffle=False)  # each split = one class
    assert wrong.mean < 0.5 * a.mean


def test_matches_torch_fidelity() -> None:
    from torch_fidelity.metric_isc import isc_features_to_metric

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(333, 1008)).astype(np.float32) * 2
    ref = isc_features_to_metric(torch.from_numpy(logits), splits=10, shuffle=True, rng_seed=2020)
    ours = inception_score(logits, splits=10, seed=2020)
    assert ours.mean == pytest.approx(ref["inception_score_mean"], rel=1e-12)
    assert ours.std == pytest.approx(ref["inception_score_std"], rel=1e-9)
    assert (ours.n, ours.splits, ours.shuffle_seed) == (333, 10, 2020)


def test_rejects_too_many_splits() -> None:
    with pytest.raises(ValueError):
        inception_score(np.zeros((5, 3)), splits=10)


def test_per_prompt_scores_batched_equal_one_call_per_prompt():
    """The batched per-prompt pass gives each prompt what torch-fidelity gives its rows alone (min(splits, n)
    splits, the same shuffle), for prompts of different image counts."""
    from torch_fidelity.metric_isc import isc_features_to_metric

    from pcpo_eval.metrics.inception_score import per_prompt_inception_scores

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(200, 12)).astype(np.float32) * 3
    order = rng.permutation(200)
    rows, at = {}, 0
    for pid, n in enumerate([10, 10, 25, 3, 1, 10, 40, 10, 20, 10, 10, 10, 11]):
        rows[pid * 7] = order[at:at + n]
        at += n
    got = per_prompt_inception_scores(logits, rows, splits=10, seed=2020)
    assert list(got) == list(rows)
    for pid, r in rows.items():
        want = isc_features_to_metric(torch.from_numpy(logits[r]), splits=min(10, len(r)), shuffle=True,
                                      rng_seed=2020)
        assert (got[pid].n, got[pid].splits, got[pid].shuffle_seed) == (len(r), min(10, len(r)), 2020)
        assert got[pid].mean == pytest.approx(want["inception_score_mean"], rel=1e-12, abs=1e-12)
        assert got[pid].std == pytest.approx(want["inception_score_std"], rel=1e-9, abs=1e-12)
