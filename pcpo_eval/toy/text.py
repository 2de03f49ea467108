"""Tiny text encoder and offline word-level tokenizer for the toy world.

The vocabulary is the toy prompt vocabulary (9 colors + 5 shapes) plus ``<pad>``, ``<bos>``,
``<eos>``; it is fixed in code, so nothing is downloaded. A prompt is lower-cased and split on
whitespace; ``""`` encodes to ``<bos> <eos>`` (the CFG null prompt, as in SD where the null
condition is the encoding of the empty string). A word outside the vocabulary raises
:class:`UserError` naming the word and the vocabulary (no ``<unk>``: a silently unknown word would
make the toy model ignore part of a prompt).

The encoder mirrors CLIP's text tower at toy scale: token + position embeddings, a pre-norm
transformer encoder, a final LayerNorm giving ``hidden`` (B, L, D) for cross-attention, and
``pooled`` (B, D) = a linear projection of the ``<eos>`` state (CLIP's pooled output convention),
which the UNet adds to its time embedding (``class_embed_type="projection"``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from pcpo_eval.errors import UserError
from pcpo_eval.toy.data import COLORS, SHAPES

SPECIAL = ("<pad>", "<bos>", "<eos>")
VOCAB: tuple[str, ...] = SPECIAL + tuple(COLORS) + SHAPES
PAD, BOS, EOS = 0, 1, 2


@dataclass(frozen=True)
class ToyTextConfig:
    """Architecture of :class:`ToyTextEncoder` (saved as ``text_encoder_config.json``)."""

    vocab_size: int = len(VOCAB)
    max_length: int = 6
    dim: int = 64
    layers: int = 2
    heads: int = 4
    ff_mult: int = 2

    def to_dict(self) -> dict:
        return asdict(self)


class ToyTokenizer:
    """Word-level tokenizer over :data:`VOCAB`; pads every prompt to ``max_length`` ids."""

    def __init__(self, max_length: int = ToyTextConfig.max_length) -> None:
        self.max_length = max_length
        self.vocab = {w: i for i, w in enumerate(VOCAB)}

    def __call__(self, prompts: list[str]) -> torch.Tensor:
        """Token ids (B, max_length) int64: ``<bos> words <eos> <pad>...``."""
        rows = []
        for prompt in prompts:
            words = prompt.lower().split()
            unknown = [w for w in words if w not in self.vocab or w in SPECIAL]
            if unknown:
                raise UserError(f"toy text encoder: unknown word {unknown[0]!r} in prompt {prompt!r}; "
                                f"the toy vocabulary is: {', '.join(VOCAB[len(SPECIAL):])}")
            if len(words) + 2 > self.max_length:
                raise UserError(f"toy prompt {prompt!r} is too long: at most {self.max_length - 2} words")
            ids = [BOS, *(self.vocab[w] for w in words), EOS]
            rows.append(ids + [PAD] * (self.max_length - len(ids)))
        return torch.tensor(rows, dtype=torch.long)


class ToyTextEncoder(nn.Module):
    """Token ids (B, L) -> (hidden (B, L, D), pooled (B, D))."""

    def __init__(self, config: ToyTextConfig) -> None:
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.dim)
        self.pos = nn.Parameter(torch.zeros(config.max_length, config.dim))
        layer = nn.TransformerEncoderLayer(config.dim, config.heads, config.ff_mult * config.dim,
                                           dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.dim)
        self.proj = nn.Linear(config.dim, config.dim)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.tok(ids) + self.pos[: ids.shape[1]]
        h = self.norm(self.blocks(h, src_key_padding_mask=ids == PAD))
        eos_pos = (ids == EOS).int().argmax(dim=1)
        pooled = self.proj(h[torch.arange(ids.shape[0], device=ids.device), eos_pos])
        return h, pooled
