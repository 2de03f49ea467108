"""Reward / metric ``vlm_bertscore`` (ddpo-pytorch's caption + BERTScore recall, in process) and the
server client's retries.

* BERTScore conventions checked by hand: greedy cosine matching of one layer's token embeddings,
  [CLS]/[SEP] excluded, no idf, no rescaling (the reference server's ``BERTScorer`` settings);
* the reward scores the caption against "The image contains {prompt}" and returns the recall;
* a real LlavaForConditionalGeneration (tiny, random) captions through its processor's chat
  template, found through PCPO_LLAVA_PATH; absent weights are one line naming the variable;
* so does the default captioner, a real Qwen2_5_VLForConditionalGeneration (tiny, random, saved in
  bfloat16 as the published checkpoint), found through PCPO_QWEN25_VL_PATH, in the precision
  ``captioner_dtype`` resolves to (fp32 on a CPU, the checkpoint's own on CUDA);
* the server client retries with backoff, gives up in one line, and does not retry a 4xx.
"""

from __future__ import annotations

import pickle
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest
import torch

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.metrics.base import METRICS, PREFERENCE_METRICS
from pcpo_eval.rewards import make_reward
from pcpo_eval.rewards import required_backends as reward_backends
from pcpo_eval.rewards.bertscore import (
    QUERY,
    BertScore,
    VLMBertScoreReward,
    VLMCaptioner,
    captioner_precision,
    declared_precision,
    references,
)
from pcpo_eval.rewards.llava import llava_bertscore
from pcpo_eval.testing import isolate_weight_caches, save_tiny_qwen25_vl
from tests.support.vlm import save_tiny_bert, save_tiny_llava


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert"))


def _by_hand(bert_dir, cand: str, ref: str, layer: int) -> tuple[float, float]:
    """BERTScore P and R from the definition (Zhang et al. 2020, Eq. 1-2 without idf)."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(bert_dir), AutoModel.from_pretrained(bert_dir).eval()

    def emb(s: str) -> torch.Tensor:
        ids = tok(s, return_tensors="pt")
        with torch.no_grad():
            h = model(**ids, output_hidden_states=True).hidden_states[layer][0]
        return torch.nn.functional.normalize(h, dim=-1)

    # every token can be a match, but [CLS] / [SEP] (first, last) get weight 0 in the averages
    sim = emb(cand) @ emb(ref).T
    return float(sim.max(dim=1).values[1:-1].mean()), float(sim.max(dim=0).values[1:-1].mean())


def test_bertscore_matches_its_definition(bert_dir):
    scorer = BertScore(str(bert_dir), num_layers=2)
    cands, refs = ["a cat sitting on the mat", "a red ball"], ["the image contains a cat", "the image contains a dog"]
    out = scorer(cands, refs)
    for i in range(2):
        p, r = _by_hand(bert_dir, cands[i], refs[i], layer=2)
        assert out["precision"][i] == pytest.approx(p, abs=1e-5) and out["recall"][i] == pytest.approx(r, abs=1e-5)
        assert out["f1"][i] == pytest.approx(2 * p * r / (p + r), abs=1e-5)
    same = scorer(["the image contains a cat"], ["the image contains a cat"])
    assert same["recall"][0] == pytest.approx(1.0, abs=1e-6)


def test_reward_scores_captions_against_the_reference_recall(bert_dir):
    captions = ["the image contains a cat", "a dog sitting", "a red ball on the mat"]
    seen = []

    def captioner(images: torch.Tensor, query: str) -> list[str]:
        assert query == QUERY and images.dtype == torch.uint8
        seen.append(len(images))
        return captions[sum(seen) - len(images) : sum(seen)]

    scorer = BertScore(str(bert_dir), 2)
    reward = VLMBertScoreReward(captioner, scorer, component="recall", batch_size=2)
    imgs = torch.zeros(3, 3, 8, 8, dtype=torch.uint8)
    prompts = ["a cat", "a dog", "a red ball"]
    r = reward(imgs, prompts)
    assert seen == [2, 1] and references(["a cat"]) == ["The image contains a cat"]
    assert r.shape == (3,) and r[0] == pytest.approx(1.0, abs=1e-5)  # caption == reference (lower-cased vocab)
    assert r.numpy() == pytest.approx(scorer(captions, references(prompts))["recall"], abs=1e-6)
    with pytest.raises(UserError, match="3 images but 2 prompts"):
        reward(imgs, ["a", "b"])


def test_tiny_llava_captions_through_the_real_model_and_the_weights_variables(tmp_path, monkeypatch, bert_dir):
    isolate_weight_caches(tmp_path, monkeypatch)
    with pytest.raises(MissingWeightsError, match="PCPO_LLAVA_PATH"):
        make_reward("vlm_bertscore", captioner="llava")
    monkeypatch.setenv("PCPO_LLAVA_PATH", str(save_tiny_llava(tmp_path / "llava")))
    with pytest.raises(MissingWeightsError, match="PCPO_BERTSCORE_DEBERTA_PATH"):
        make_reward("vlm_bertscore", captioner="llava")
    monkeypatch.setenv("PCPO_BERTSCORE_DEBERTA_PATH", str(bert_dir))
    reward = make_reward("vlm_bertscore", captioner="llava", num_layers=2, max_new_tokens=4, batch_size=2)
    imgs = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    r = reward(imgs, ["a cat", "a dog", "a red ball"])
    assert r.shape == (3,) and torch.isfinite(r).all() and ((r >= -1) & (r <= 1)).all()
    assert len(reward.last_captions) == 3 and all(isinstance(c, str) for c in reward.last_captions)
    assert reward.settings["component"] == "recall" and reward.settings["num_layers"] == 2


def test_the_captioner_sees_the_client_jpeg_as_the_reference_server_did(bert_dir):
    """ddpo-pytorch's llava_bertscore sends quality-80 JPEGs and LLaVA-server opens them with PIL: the
    in-process captioner gets exactly those pixels (and the raw ones with jpeg_quality null)."""
    import io

    from PIL import Image

    from pcpo_eval.rewards.bertscore import check_jpeg_quality

    g = torch.Generator().manual_seed(3)
    imgs = torch.randint(0, 256, (2, 3, 24, 32), dtype=torch.uint8, generator=g)
    expect = []
    for im in imgs.permute(0, 2, 3, 1).numpy():  # the client's encode and the server's decode, by hand
        buf = io.BytesIO()
        Image.fromarray(im).save(buf, format="JPEG", quality=80)
        expect.append(torch.from_numpy(np.array(Image.open(io.BytesIO(buf.getvalue())))).permute(2, 0, 1))
    seen = []

    def captioner(images: torch.Tensor, query: str) -> list[str]:
        seen.append(images.clone())
        return ["a cat"] * len(images)

    scorer = BertScore(str(bert_dir), 2)
    VLMBertScoreReward(captioner, scorer, batch_size=2)(imgs, ["a cat", "a dog"])
    assert seen[0].dtype == torch.uint8 and torch.equal(seen[0], torch.stack(expect))
    assert not torch.equal(seen[0], imgs)  # lossy: the raw pixels are not what the reference captioned
    VLMBertScoreReward(captioner, scorer, batch_size=2, jpeg_quality=None)(imgs, ["a cat", "a dog"])
    assert torch.equal(seen[1], imgs)
    assert check_jpeg_quality(80) == 80 and check_jpeg_quality(None) is None and check_jpeg_quality(0) is None
    for bad in (96, 7.5, True, "80"):
        with pytest.raises(UserError, match="jpeg_quality must be an integer 1..95"):
            check_jpeg_quality(bad)
    with pytest.raises(UserError, match="jpeg_quality must be"):  # before any model is looked for
        make_reward("vlm_bertscore", captioner="qwen25_vl", jpeg_quality=100)


def test_an_empty_caption_scores_zero_as_bert_score_sets_it(bert_dir):
    scorer = BertScore(str(bert_dir), num_layers=2)
    full = scorer(["a cat on the mat", "a red ball"], ["the image contains a cat", "the image contains a ball"])
    mixed = scorer(["a cat on the mat", "  ", "a red ball"], ["the image contains a cat", "x", "the image contains a ball"])
    for k in ("precision", "recall", "f1"):
        assert mixed[k][1] == 0.0 and mixed[k][[0, 2]] == pytest.approx(full[k], abs=1e-6)
    assert all((v == 0).all() and v.shape == (2,) for v in scorer(["", ""], ["a", "b"]).values())


def test_tiny_qwen25_vl_is_the_default_captioner_in_the_precision_it_resolves(tmp_path, monkeypatch, bert_dir):
    isolate_weight_caches(tmp_path, monkeypatch)
    qwen = save_tiny_qwen25_vl(tmp_path / "qwen")
    assert declared_precision(str(qwen)) == "bf16" and declared_precision(str(tmp_path)) is None
    monkeypatch.setenv("PCPO_QWEN25_VL_PATH", str(qwen))
    monkeypatch.setenv("PCPO_BERTSCORE_DEBERTA_PATH", str(bert_dir))
    imgs = torch.randint(0, 256, (3, 3, 40, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    prompts = ["a cat", "a dog", "a red ball"]
    for option, name, dtype in (("auto", "fp32", torch.float32), ("bf16", "bf16", torch.bfloat16)):
        reward = make_reward("vlm_bertscore", num_layers=2, max_new_tokens=3, batch_size=2, captioner_dtype=option)
        assert reward.captioner.model.dtype == dtype and reward.settings["captioner_dtype"] == name
        r = reward(imgs, prompts)
        # at most 3 new tokens each (a special token decodes to nothing): image tokens, chat template and
        # decoding went through Qwen's own classes
        caps = reward.last_captions
        assert r.shape == (3,) and torch.isfinite(r).all() and all(len(c.split()) <= 3 for c in caps) and any(caps)
    # the captioner's floating inputs (pixel_values) follow its weights' dtype: bf16 captions without a dtype error
    cap = VLMCaptioner.from_pretrained(str(qwen), dtype=torch.bfloat16, max_new_tokens=2)
    assert len(cap(imgs[:1], QUERY)) == 1


def test_captioner_precision_resolves_by_device_and_checkpoint():
    assert captioner_precision("auto", "cpu", "bf16") == "fp32"  # half precision is slow on a CPU
    assert captioner_precision("auto", "cuda:1", "bf16") == "bf16"  # Qwen2.5-VL-3B-Instruct's config.json
    assert captioner_precision("auto", "cuda", "fp16") == "fp16"  # llava-hf's, the fp16 LLaVA-server runs
    assert captioner_precision("auto", "cuda", None) == captioner_precision("auto", "cuda", "fp32") == "bf16"
    assert captioner_precision(" FP16 ", "cpu") == "fp16" and captioner_precision("bfloat16", "cpu") == "bf16"
    with pytest.raises(UserError, match="unknown captioner_dtype 'int8'; choose auto, fp32, bf16, fp16"):
        captioner_precision("int8", "cpu")
    with pytest.raises(UserError, match="unknown captioner_dtype 'half'"):  # before any model is looked for
        make_reward("vlm_bertscore", captioner="qwen25_vl", captioner_dtype="half")


def test_options_are_validated_and_the_catalogue_knows_the_metric():
    with pytest.raises(UserError, match="unknown BERTScore component 'accuracy'"):
        make_reward("vlm_bertscore", captioner=lambda i, q: [], component="accuracy")
    with pytest.raises(UserError, match="unknown captioner 'blip'"):
        make_reward("vlm_bertscore", captioner="blip")
    assert "bertscore" in PREFERENCE_METRICS and METRICS["bertscore"].source == "vlm_bertscore"
    assert reward_backends("vlm_bertscore") == ("qwen25_vl_3b", "bertscore_deberta")
    assert reward_backends("vlm_bertscore", {"captioner": "llava", "scorer": "roberta"}) == ("llava", "bertscore_roberta")


class _Flaky(BaseHTTPRequestHandler):
    fail_first = 2
    calls = 0
    status = 503

    def do_POST(self):  # noqa: N802 (http.server's name)
        type(self).calls += 1
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).calls <= type(self).fail_first:
            self.send_response(type(self).status)
            self.end_headers()
            return
        n = len(pickle.loads(body)["images"])
        self.send_response(200)
        self.end_headers()
        self.wfile.write(pickle.dumps({"recall": np.full((n, 1), 0.5)}))

    def log_message(self, *a):
        pass


def _serve(handler):
    srv = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def test_server_client_retries_then_succeeds_and_gives_up_in_one_line():
    handler = type("H", (_Flaky,), {"fail_first": 2, "calls": 0})
    srv, url = _serve(handler)
    try:
        r = llava_bertscore(url=url, retries=3, backoff=0.01, timeout=5)(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), ["a", "b"])
        assert r.tolist() == [0.5, 0.5] and handler.calls == 3
        handler.calls, handler.fail_first = 0, 10
        with pytest.raises(MissingWeightsError, match="after 3 attempts") as ei:
            llava_bertscore(url=url, retries=2, backoff=0.01, timeout=5)(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), ["a"])
        assert "\n" not in str(ei.value) and handler.calls == 3
        handler.calls, handler.status = 0, 400
        with pytest.raises(MissingWeightsError, match="refused the request \\(HTTP 400\\)"):
            llava_bertscore(url=url, retries=3, backoff=0.01)(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), ["a"])
        assert handler.calls == 1  # a 4xx is not retried
    finally:
        srv.shutdown()
