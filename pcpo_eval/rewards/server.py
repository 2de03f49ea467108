"""The BERTScore reward as a server on LLaVA-server's protocol: one captioner for every training process.

The paper's setups 3-4 ran ddpo-pytorch on three training GPUs beside one VLM GPU: each process's
``llava_bertscore`` client POSTs a pickled ``{"images": [JPEG bytes], "queries": [[query]], "answers":
[[reference]]}`` to kvablack/LLaVA-server, which answers ``{"outputs": [[caption]], "precision": [[p]],
"recall": [[r]], "f1": [[f]]}``. In process (``reward: vlm_bertscore``) each training process loads its
own captioner and scorer (9.4 GiB for Qwen2.5-VL-3B in bf16 and DeBERTa-xlarge in float32), which one
24 GB card cannot hold beside the policy. ``pcpo-eval bertscore-server`` answers that protocol with
``vlm_bertscore``'s captioner and scorer on a GPU of its own, for ``reward: llava_bertscore`` in every
training process: the paper's layout.

The answer equals the in-process reward's on the same images: the client's quality-80 JPEG decoded by
PIL, as ``vlm_bertscore``'s ``jpeg_quality: 80`` round trip sees them (tested), captioned
``batch_size`` images per call and scored by :class:`~pcpo_eval.rewards.bertscore.BertScore`.

The protocol is pickle. Requests are read with an unpickler that admits only plain containers and
scalars (dict, list, tuple, str, bytes, numbers, bool, None): a payload naming any class or function
(what makes unpickling run code) is refused with HTTP 400. The server listens on 127.0.0.1 unless told
otherwise, and computes one request at a time (the GPU's model is not shared between threads).
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.rewards.bertscore import COMPONENTS, VLMBertScoreReward
from pcpo_eval.rewards.jpeg import jpeg_decode

#: the largest request body read (bytes): 512 JPEGs of 512 px at quality 80 take about 25 MB
MAX_BODY = 1 << 30


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused before it is looked up."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: requests may hold plain data only")


def loads_plain(data: bytes) -> Any:
    """``pickle.loads`` restricted to dicts, lists, tuples, strings, bytes, numbers, bools and None."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def check_request(payload: Any) -> tuple[list[bytes], list[str], list[str] | None]:
    """The images, one query per image and the optional reference answers of a request.

    Raises:
        ValueError: a request of another shape (the server answers 400 with the message).
    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get("images"), list | tuple):
        raise ValueError("a request is a dict with 'images' (JPEG bytes), 'queries' and optionally 'answers'")
    images, queries, answers = list(payload["images"]), payload.get("queries"), payload.get("answers")
    if not all(isinstance(i, bytes) for i in images):
        raise ValueError("'images' must be JPEG bytes")

    def one_each(rows: Any, what: str) -> list[str]:
        ok = isinstance(rows, list | tuple) and len(rows) == len(images)
        if not ok or not all(isinstance(r, list | tuple) and len(r) == 1 and isinstance(r[0], str) for r in rows):
            raise ValueError(f"'{what}' must hold one string per image, [[text], ...] ({len(images)} images)")
        return [r[0] for r in rows]

    return images, one_each(queries, "queries"), None if answers is None else one_each(answers, "answers")


def answer(reward: VLMBertScoreReward, payload: Any) -> dict[str, list]:
    """LLaVA-server's response to one request: each image's caption and, with answers, its BERTScore.

    Images of one query and size are captioned together (:meth:`VLMBertScoreReward.caption`)."""
    jpegs, queries, answers = check_request(payload)
    pixels = [jpeg_decode(j) for j in jpegs]
    captions: list[str] = [""] * len(pixels)
    groups: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for i, (q, px) in enumerate(zip(queries, pixels, strict=True)):
        groups.setdefault((q, px.shape), []).append(i)
    for (query, _), rows in groups.items():
        images = torch.from_numpy(np.stack([pixels[i] for i in rows])).permute(0, 3, 1, 2).contiguous()
        for i, text in zip(rows, reward.caption(images, query), strict=True):
            captions[i] = text
    out: dict[str, list] = {"outputs": [[c] for c in captions]}
    if answers is not None:
        scores = reward.scorer(captions, answers) if captions else {k: np.zeros(0) for k in COMPONENTS}
        out.update({k: [[float(v)] for v in scores[k]] for k in COMPONENTS})
    return out


def make_server(reward: VLMBertScoreReward, host: str = "127.0.0.1", port: int = 8085) -> ThreadingHTTPServer:
    """An HTTP server answering LLaVA-server's protocol with ``reward`` (call ``serve_forever``); port 0 picks
    a free one (``server.server_address``)."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            size = int(self.headers.get("Content-Length") or 0)
            if not 0 < size <= MAX_BODY:
                return self._send(413 if size > MAX_BODY else 400, {"error": f"request body of {size} bytes"})
            try:
                payload = loads_plain(self.rfile.read(size))
                check_request(payload)
            except (pickle.UnpicklingError, ValueError, EOFError, TypeError) as exc:
                return self._send(400, {"error": str(exc)})
            try:
                with lock:
                    body = answer(reward, payload)
            except Exception as exc:  # noqa: BLE001 - the client is told (500: it retries), the server stays up
                return self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
            self._send(200, body)

        def _send(self, status: int, body: dict) -> None:
            data = pickle.dumps(body)
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    try:
        return ThreadingHTTPServer((host, int(port)), Handler)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); choose another --port or --host") \
            from None
