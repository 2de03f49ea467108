"""Per-image random streams derived only from ``(prompt_id, seed)``.

Every image of a set owns one ``torch.Generator`` seeded from a stable hash of its prompt id and
seed (diffusers' one-generator-per-sample convention, ``randn_tensor(..., generator=[...])``).
The sampler draws the image's initial noise and then each stochastic step's noise from it in
order, so an image never depends on the batch it was rendered in, the process that rendered it,
the order of work, or any global RNG state.

Derivation (documented so other tools can reproduce it)::

    key  = f"pcpo-eval/sample/v1/{prompt_id}/{seed}".encode()
    s63  = int.from_bytes(sha256(key).digest()[:8], "little") & (2**63 - 1)
    g    = torch.Generator("cpu").manual_seed(s63)

SHA-256 (not Python's salted ``hash``) keeps the value identical across processes, platforms and
Python versions; hashing the pair (rather than e.g. ``seed * 100000 + prompt_id``) keeps the
streams of neighbouring pairs unrelated.
"""

from __future__ import annotations

import hashlib

import torch

#: the largest seed ``torch.Generator.manual_seed`` takes (a training or pretraining seed; 2**64 overflowed
#: inside torch with a traceback)
MAX_TORCH_SEED = 2**64 - 1


def seed_problem(name: str, seed: int) -> str | None:
    """Why ``seed`` cannot seed torch's generators (None when it can): negative, or above 2**64 - 1."""
    if seed < 0:
        return f"{name} must be >= 0 (got {seed}); torch's generators take non-negative seeds"
    if seed > MAX_TORCH_SEED:
        return f"{name} must be <= 2**64 - 1 = {MAX_TORCH_SEED} (got {seed}); torch's generators take 64-bit seeds"
    return None


_KEY_FORMAT = "pcpo-eval/sample/v1/{prompt_id}/{seed}"
_MASK_63 = (1 << 63) - 1


def keyed_seed(key: str) -> int:
    """63-bit seed from the first 8 bytes (little-endian) of SHA-256 of ``key``."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") & _MASK_63


def keyed_generator(namespace: str, *parts: object) -> torch.Generator:
    """CPU generator seeded by ``keyed_seed("pcpo-eval/{namespace}/" + "/".join(parts))``.

    The trainer's streams use namespace ``train/v1`` with parts (seed, epoch, rank, purpose, index).
    """
    g = torch.Generator()
    g.manual_seed(keyed_seed(f"pcpo-eval/{namespace}/" + "/".join(map(str, parts))))
    return g


def sample_seed(prompt_id: int, seed: int) -> int:
    """The 63-bit generator seed of image ``(prompt_id, seed)`` (pure, stable across runs)."""
    if int(prompt_id) < 0 or int(seed) < 0:
        raise ValueError(f"prompt_id and seed must be non-negative, got ({prompt_id}, {seed})")
    return keyed_seed(_KEY_FORMAT.format(prompt_id=int(prompt_id), seed=int(seed)))


def sample_generator(prompt_id: int, seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` seeded with :func:`sample_seed` (CPU by default).

    Noise is drawn on CPU by the samplers and moved to the model device, so the same pair gives
    the same noise whatever device the model runs on.
    """
    g = torch.Generator(device=device)
    g.manual_seed(sample_seed(prompt_id, seed))
    return g


def sample_generators(pairs: list[tuple[int, int]]) -> list[torch.Generator]:
    """One CPU generator per ``(prompt_id, seed)`` pair, in order."""
    return [sample_generator(p, s) for p, s in pairs]
