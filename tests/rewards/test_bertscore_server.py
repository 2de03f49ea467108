"""``pcpo-eval bertscore-server``: the in-process BERTScore reward served on LLaVA-server's protocol.

* the ``llava_bertscore`` client's scores through the server equal ``vlm_bertscore`` in process on the same
  images (its quality-80 JPEG round trip; BERTScore batches differ: float rounding), and the captioner
  sees the same pixels both ways;
* a pickle naming a class or function is refused (400) before anything of it runs; a request of the wrong
  shape is one 400 line; the client's 4xx is one error line without retries;
* the real command starts with tiny Qwen2.5-VL / BERT folders and answers; bad options are one line.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.rewards.bertscore import QUERY, BertScore, VLMBertScoreReward, references
from pcpo_eval.rewards.llava import llava_bertscore
from pcpo_eval.rewards.server import loads_plain, make_server
from pcpo_eval.testing import save_tiny_qwen25_vl
from tests.support.vlm import save_tiny_bert

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert"))


def _captioner(seen: list[torch.Tensor]):
    def caption(images: torch.Tensor, query: str) -> list[str]:  # depends on the pixels it is given
        assert query == QUERY
        seen.append(images.clone())
        return ["a red ball on the mat" if float(im.float().mean()) > 127 else "a dog sitting" for im in images]

    return caption


def _serve(reward):
    server = make_server(reward, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _post(url: str, body: bytes) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=30) as r:
            return r.status, pickle.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, pickle.loads(exc.read())


def test_served_scores_equal_the_in_process_reward(bert_dir):
    g = torch.Generator().manual_seed(5)
    imgs = torch.randint(0, 256, (5, 3, 24, 32), dtype=torch.uint8, generator=g)
    imgs[:2] = imgs[:2] // 4 + 180  # bright ones get the other caption
    prompts = ["a cat", "a dog", "a red ball", "a cat", "a dog"]
    scorer = BertScore(str(bert_dir), 2)
    local_seen, served_seen = [], []
    local = VLMBertScoreReward(_captioner(local_seen), scorer, batch_size=2)(imgs, prompts)  # jpeg_quality 80
    server, url = _serve(VLMBertScoreReward(_captioner(served_seen), scorer, batch_size=2, jpeg_quality=None))
    try:
        served = llava_bertscore(url=url, batch_size=3)(imgs, prompts)
        assert torch.equal(torch.cat(local_seen), torch.cat(served_seen))  # the client's JPEG, as PIL decodes it
        # BERTScore's padding follows the batch (the server scores per request): equal to float rounding
        assert served.dtype == torch.float32 and torch.allclose(served, local, atol=1e-6), (served, local)
        assert len({round(float(v), 4) for v in served}) == 2  # both captions occurred
        # LLaVA-server's response shape: (n, 1) per key
        status, out = _post(url, pickle.dumps({"images": [], "queries": [], "answers": []}))
        assert status == 200 and out == {"outputs": [], "precision": [], "recall": [], "f1": []}
        from pcpo_eval.rewards.jpeg import jpeg_bytes

        one = jpeg_bytes(imgs[0].permute(1, 2, 0).numpy(), 80)
        status, out = _post(url, pickle.dumps({"images": [one], "queries": [[QUERY]],
                                               "answers": [[r] for r in references(["a"])]}))
        assert status == 200 and out["outputs"] == [["a red ball on the mat"]] and len(out["recall"][0]) == 1
    finally:
        server.shutdown()


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_pickle_naming_code_or_of_the_wrong_shape_is_refused(bert_dir, tmp_path):
    calls = []
    server, url = _serve(VLMBertScoreReward(_captioner(calls), BertScore(str(bert_dir), 2), jpeg_quality=None))
    try:
        status, out = _post(url, pickle.dumps({"images": [_Evil()]}))
        assert status == 400 and "refused posix.system" in out["error"] and not calls
        with pytest.raises(pickle.UnpicklingError, match="plain data only"):
            loads_plain(pickle.dumps(np.zeros(2)))  # numpy arrays are classes too: refused
        status, out = _post(url, pickle.dumps({"images": [b"x"], "queries": [["q", "r"]]}))
        assert status == 400 and "'queries' must hold one string per image" in out["error"]
        status, out = _post(url, pickle.dumps(["not", "a", "dict"]))
        assert status == 400 and "a request is a dict" in out["error"]
        status, out = _post(url, pickle.dumps({"images": [b"not a jpeg"], "queries": [[QUERY]]}))
        assert status == 500 and "UnidentifiedImageError" in out["error"]  # the server stays up
        with pytest.raises(UserError, match="cannot listen on 127.0.0.1:"):
            make_server(None, "127.0.0.1", server.server_address[1])
    finally:
        server.shutdown()


def test_the_command_serves_the_default_captioner(tmp_path, bert_dir, cli):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PCPO_QWEN25_VL_PATH": str(save_tiny_qwen25_vl(tmp_path / "qwen")),
           "PCPO_BERTSCORE_DEBERTA_PATH": str(bert_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "pcpo_eval", "bertscore-server", "num_layers=2", "max_new_tokens=3",
                             "--port", "0", "--device", "cpu"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        deadline = time.time() + 120
        while "bertscore-server on" not in line and time.time() < deadline and proc.poll() is None:
            line = proc.stderr.readline()
        assert "bertscore-server on http://127.0.0.1:" in line and "qwen25_vl fp32" in line, line
        url = line.split(" on ")[1].split(" ")[0]
        imgs = torch.randint(0, 256, (2, 3, 40, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        r = llava_bertscore(url=url)(imgs, ["a cat", "a dog"])
        assert r.shape == (2,) and torch.isfinite(r).all()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for args, msg in ((["captioner"], "option 'captioner' is not KEY=VALUE"),
                      (["jpeg_quality=80"], "jpeg_quality and device are the server's own")):
        res = cli("bertscore-server", *args)
        assert res.returncode == 2 and res.stderr.startswith("error: ") and msg in res.stderr, res.stderr
