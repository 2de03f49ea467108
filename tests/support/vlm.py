"""Tiny random models of the real architectures behind reward ``vlm_bertscore``, saved locally:
a LLaVA (LlavaForConditionalGeneration: Llama text model + CLIP vision tower, LlavaProcessor with a
chat template) and a BERT for bert-score. Random weights caption gibberish; the code paths are real.
"""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ("<pad> <unk> <s> </s> <image> USER: ASSISTANT: answer concisely: what is going on in this image? "
         "the contains a cat dog red ball sitting mat").split()
CHAT_TEMPLATE = ("{% for m in messages %}USER: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image> "
                 "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}{% if add_generation_prompt %} ASSISTANT:{% endif %}")


def save_tiny_llava(folder: Path, seed: int = 0) -> Path:
    """A 1-layer LLaVA on 32x32 images (4 image tokens) with a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    vocab = {w: i for i, w in enumerate(WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>", model_max_length=128)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    ip = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    proc = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=16, vision_feature_select_strategy="default",
                          chat_template=CHAT_TEMPLATE, image_token="<image>", num_additional_image_tokens=1)
    torch.manual_seed(seed)
    text = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                       pad_token_id=0, bos_token_id=2, eos_token_id=3)
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=16, projection_dim=16)
    cfg = LlavaConfig(text_config=text, vision_config=vision, image_token_index=vocab["<image>"],
                      vision_feature_select_strategy="default", vision_feature_layer=-1)
    LlavaForConditionalGeneration(cfg).save_pretrained(folder)
    proc.save_pretrained(folder)
    return folder


def save_tiny_bert(folder: Path, seed: int = 0, layers: int = 2) -> Path:
    """A 2-layer BERT with a word-piece vocabulary covering the test sentences."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted({w.strip("?:").lower() for w in WORDS[5:]} | {
        "image", "contains", "a", "cat", "dog", "on", "the", "mat", "sitting", "red", "ball", "running"})]
    (folder / "vocab.txt").write_text("\n".join(vocab))
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), model_max_length=64).save_pretrained(folder)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=32)
    BertModel(cfg).save_pretrained(folder)
    return folder
