"""Generator building blocks: seeds, generators, work split, IRG, fixed-shape micro-batching."""

from __future__ import annotations

import hashlib

import pytest
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.generate.fixed_batch import (
    FixedBatchAdapter,
    auto_micro_batch,
    effective_batch_size,
    memory_decode_batch,
)
from pcpo_eval.generate.irg import IRGAdapter, irg_combine, parse_irg_spec
from pcpo_eval.generate.plan import WorkItem, parse_seeds, plan_items, shard_items
from pcpo_eval.generate.runner import render_latents
from pcpo_eval.models.base import PromptEmbeds
from pcpo_eval.prompts import PromptSet, simple_animals
from pcpo_eval.samplers import resolve_sampler
from pcpo_eval.seeding import sample_generator, sample_seed
from tests.support.generate import StandInAdapter

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---- seeds -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, expected",
    [("3", [0, 1, 2]), (4, [0, 1, 2, 3]), ("5-7", [5, 6, 7]), (" 2 - 2 ", [2]), ([9, 1], [9, 1])],
)
def test_parse_seeds(spec, expected):
    assert parse_seeds(spec) == expected


@pytest.mark.parametrize("spec", ["0", "7-3", "-3", "1-", "a-b", "1,,2", "2,2", "3-1,5", "", "3.5", "1-10000000",
                                  "1,10000000"])
def test_malformed_seeds_are_user_errors(spec):
    with pytest.raises(UserError) as info:
        parse_seeds(spec)
    assert "\n" not in str(info.value)


# ---- per-image generators ---------------------------------------------------------------------


def test_sample_seed_is_the_documented_sha256():
    key = b"pcpo-eval/sample/v1/12/345"
    expected = int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & (2**63 - 1)
    assert sample_seed(12, 345) == expected
    assert sample_seed(12, 345) != sample_seed(345, 12) != sample_seed(12, 346)


def test_generators_reproduce_and_leave_global_rng_alone():
    state = torch.random.get_rng_state()
    a = torch.randn(5, generator=sample_generator(3, 7))
    b = torch.randn(5, generator=sample_generator(3, 7))
    c = torch.randn(5, generator=sample_generator(3, 8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(state, torch.random.get_rng_state())


# ---- planning and sharding ----------------------------------------------------------------------


def test_plan_is_seed_major_and_shards_partition_it():
    ps = PromptSet("x", (4, 9), ("a", "b"))
    items = plan_items(ps, [0, 1, 2])
    assert [(i.prompt_id, i.seed) for i in items[:3]] == [(4, 0), (9, 0), (4, 1)]
    assert items[0].rel_path == "images/p00004/s0000000.png"
    shards = [shard_items(items, r, 4) for r in range(4)]
    flat = [i for s in shards for i in s]
    assert sorted(flat, key=items.index) == items and len(set(flat)) == len(items)


# ---- IRG ----------------------------------------------------------------------------------------


def test_parse_irg_spec():
    spec = parse_irg_spec("irg:runs/a/checkpoints/epoch_0010=0.5,runs/b/checkpoints/epoch_0020=-0.25@base")
    assert spec.components == (("runs/a/checkpoints/epoch_0010", 0.5), ("runs/b/checkpoints/epoch_0020", -0.25))
    assert spec.reference == "base"
    assert parse_irg_spec("irg:ckpt").components == (("ckpt", 1.0),)
    assert parse_irg_spec("irg:ckpt").reference is None
    for bad in ("irg:a=x", "irg:a=1,,b=2", "irg:a=1@", "irg:=1", "irg:a=inf", "irg:a=1e308", "irg:a=-1001"):
        with pytest.raises(UserError):
            parse_irg_spec(bad)


def test_irg_combine_formula():
    g = torch.Generator().manual_seed(0)
    ref, e1, e2 = (torch.randn(2, 3, generator=g) for _ in range(3))
    out = irg_combine(ref, [e1, e2], [0.5, 2.0])
    torch.testing.assert_close(out, ref + 0.5 * (e1 - ref) + 2.0 * (e2 - ref))


def test_irg_adapter_interpolates_between_reference_and_checkpoint():
    ref, ft = StandInAdapter(0), StandInAdapter(1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, *ref.latent_shape, generator=g)
    t = torch.tensor([900, 500, 100])
    cond = ref.encode_prompts(["cat", "dog", "fox"])
    with torch.no_grad():
        e_ref, e_ft = ref.denoise(x, t, cond), ft.denoise(x, t, cond)
        torch.testing.assert_close(IRGAdapter(ref, [(ft, 0.0)]).denoise(x, t, cond), e_ref)
        torch.testing.assert_close(IRGAdapter(ref, [(ft, 1.0)]).denoise(x, t, cond), e_ft)
        half = IRGAdapter(ref, [(ft, 0.5), (StandInAdapter(2), 0.0)]).denoise(x, t, cond)
    torch.testing.assert_close(half, 0.5 * (e_ref + e_ft))


def test_sampler_dispatch():
    assert resolve_sampler("auto", "eps") == "ddim" and resolve_sampler("auto", "velocity") == "flow"
    with pytest.raises(UserError, match="does not fit"):
        resolve_sampler("flow", "eps")
    with pytest.raises(UserError, match="choose one of"):
        resolve_sampler("euler", "eps")


# ---- fixed-shape micro-batching -------------------------------------------------------------------


def test_fixed_batch_adapter_matches_inner_on_full_chunks():
    inner = StandInAdapter()
    fixed = FixedBatchAdapter(inner, 4)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, *inner.latent_shape, generator=g)
    t = torch.full((8,), 700)
    cond = inner.encode_prompts(["cat"] * 8)
    with torch.no_grad():
        a = fixed.denoise(x, t, cond)
        b = torch.cat([inner.denoise(x[:4], t[:4], cond.index(slice(0, 4))), inner.denoise(x[4:], t[4:], cond.index(slice(4, 8)))])
    assert torch.equal(a, b)
    emb = fixed.encode_prompts(["cat", "dog", "fox"])
    assert isinstance(emb, PromptEmbeds) and len(emb) == 3
    assert fixed.decode(x[:5]).shape == (5, 3, 8, 8)


def test_decode_batch_decodes_unpadded_chunks():
    """``decode_batch`` (CUDA tolerance sets): the decoder sees chunks of that many latents, none padded,
    with the padded path's images; without it, padded micro-batches as before."""
    inner = StandInAdapter()
    seen: list[int] = []
    real = inner.decode
    inner.decode = lambda z: seen.append(len(z)) or real(z)
    x = torch.randn(7, *inner.latent_shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        chunked = FixedBatchAdapter(inner, 4, decode_batch=3).decode(x)
        assert seen == [3, 3, 1]
        seen.clear()
        padded = FixedBatchAdapter(inner, 4).decode(x)
        assert seen == [4, 4]
    torch.testing.assert_close(chunked, padded)
    with pytest.raises(ValueError, match="CUDA"):
        memory_decode_batch(inner, cap=8)


def test_latents_bit_identical_for_batch_sizes_1_8_37():
    """The sampler's final latents (before uint8 rounding) do not depend on the batch size."""
    animals = simple_animals()
    items = plan_items(PromptSet("x", animals.prompt_ids[:10], animals.prompts[:10]), [0, 1, 2, 3])
    fixed = FixedBatchAdapter(StandInAdapter(), 4)
    uncond = fixed.encode_prompts([""])
    outs = {}
    with torch.inference_mode():
        for bs in (1, 8, 37):
            outs[bs] = torch.cat(
                [render_latents(fixed, items[s : s + bs], uncond, "ddim", 5.0, 3, 1.0, "ddim") for s in range(0, 40, bs)]
            )
    assert torch.equal(outs[1], outs[8]) and torch.equal(outs[1], outs[37])


def test_items_are_independent_of_batch_neighbours():
    """Same item, different batch companions (and positions) -> identical latents."""
    fixed = FixedBatchAdapter(StandInAdapter(), 4)
    uncond = fixed.encode_prompts([""])
    target = WorkItem(3, "monkey", 5)
    others = [WorkItem(i, p, 0) for i, p in enumerate(["cat", "dog", "horse", "bird", "fox"])]
    with torch.inference_mode():
        a = render_latents(fixed, [target], uncond, "ddim", 5.0, 3, 1.0, "ddim")
        b = render_latents(fixed, [*others, target], uncond, "ddim", 5.0, 3, 1.0, "ddim")[-1:]
    assert torch.equal(a, b)


def test_auto_micro_batch_and_effective_batch_size():
    assert auto_micro_batch((4, 64, 64)) == 16  # SD-1.x 512 px: batch 8 with CFG
    assert auto_micro_batch((16, 64, 64)) == 4 and auto_micro_batch((16, 128, 128)) == 2
    assert auto_micro_batch((48, 8, 8)) == 64 and auto_micro_batch((3, 2, 2)) == 64
    assert effective_batch_size(8, 16, cfg=5.0) == 8  # 16 rows: one full micro-batch
    assert effective_batch_size(37, 16, cfg=5.0) == 40 and effective_batch_size(1, 16, cfg=1.0) == 16
    assert effective_batch_size(5, 3, cfg=5.0) == 6  # 2 rows per item, unit lcm(3, 2) / 2 = 3
    assert effective_batch_size(37, 0, cfg=5.0) == 37  # micro-batching off


def test_a_set_too_large_to_plan_is_refused_before_memory_runs_out(tmp_path, cli):
    """``--seeds 10000000`` on the toy's 45 prompts planned 450 M items and was killed at 23.5 GB (a review); now
    one ``error:`` line with the count, before the items are built."""
    from pcpo_eval.errors import UserError
    from pcpo_eval.generate.plan import MAX_SET_IMAGES, check_set_size

    check_set_size(5, MAX_SET_IMAGES // 5)
    with pytest.raises(UserError, match="450,000,000 images in one set"):
        check_set_size(45, 10_000_000)
    res = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "300000", "--out", tmp_path / "g")
    assert res.returncode == 2 and "45 prompts x 300,000 seeds = 13,500,000 images in one set" in res.stderr
    assert not (tmp_path / "g").exists()
