"""LLaVA-BERTScore reward client against a loopback stand-in of the LLaVA reward server."""

from __future__ import annotations

import io
import pickle
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
from PIL import Image

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.rewards import make_reward


class _Handler(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_POST(self):  # noqa: N802
        data = pickle.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(data)
        # stand-in "recall": the image's mean red value / 255, so the test can check the order
        recall = [[Image.open(io.BytesIO(b)).convert("RGB").getpixel((0, 0))[0] / 255] for b in data["images"]]
        body = pickle.dumps({"recall": recall, "precision": recall, "f1": recall})
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_llava_bertscore_protocol_and_batching():
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=server.serve_forever, daemon=True)
    th.start()
    try:
        fn = make_reward("llava_bertscore", url=f"http://127.0.0.1:{server.server_port}", batch_size=2)
        images = torch.zeros(3, 3, 8, 8, dtype=torch.uint8)
        images[:, 0] = torch.tensor([0, 128, 255], dtype=torch.uint8)[:, None, None]
        out = fn(images, ["a cat", "a dog", "an owl"])
        assert out.shape == (3,) and out.dtype == torch.float32
        assert out[0] < 0.05 and abs(out[1] - 0.5) < 0.05 and out[2] > 0.95
        assert len(_Handler.seen) == 2  # two batches of <= 2
        assert _Handler.seen[0]["answers"] == [["The image contains a cat"], ["The image contains a dog"]]
        assert _Handler.seen[0]["queries"][0] == ["Answer concisely: what is going on in this image?"]
    finally:
        server.shutdown()


def test_llava_server_absent_names_the_variable():
    fn = make_reward("llava_bertscore", url="http://127.0.0.1:9", timeout=2, backoff=0.01)  # retries, not their waits
    with pytest.raises(MissingWeightsError, match="PCPO_LLAVA_URL"):
        fn(torch.zeros(1, 3, 8, 8, dtype=torch.uint8), ["a cat"])
