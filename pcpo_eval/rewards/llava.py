"""DDPO's prompt-alignment reward ("BERT" in the paper's setups 3-4): LLaVA caption + BERTScore.

Client for the LLaVA reward server used by ddpo-pytorch (kvablack/LLaVA-server): images are
sent as JPEG (quality 80) with the query "Answer concisely: what is going on in this image?" and
the reference answer "The image contains {prompt}"; the server replies with BERTScore
precision/recall/F1 of LLaVA's answer, and the reward is the recall (DDPO's convention).
The wire format is a pickled dict over HTTP POST, as that server expects; only talk to a
server you run yourself (``PCPO_LLAVA_URL``, default ``http://127.0.0.1:8085``).
"""

from __future__ import annotations

import os
import pickle
import time
import urllib.error
import urllib.request

import numpy as np
import torch

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.rewards.bertscore import CLIENT_JPEG_QUALITY, QUERY, references
from pcpo_eval.rewards.jpeg import jpeg_bytes


def post_with_retries(url: str, body: bytes, timeout: float, retries: int, backoff: float) -> bytes:
    """POST ``body``; on a connection error, timeout or HTTP 5xx retry ``retries`` times, waiting
    ``backoff * 2**k`` seconds before retry k (exponential backoff). The last failure is one line."""
    last: Exception | None = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        req = urllib.request.Request(url, data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (user-run local server)
                return resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code < 500:  # the server understood and refused: retrying will not help
                raise MissingWeightsError(f"LLaVA reward server at {url} refused the request (HTTP {exc.code}); "
                                          "check that it is kvablack/LLaVA-server's protocol") from None
            last = exc
        except (urllib.error.URLError, OSError) as exc:  # refused connection, reset, timeout
            last = exc
    raise MissingWeightsError(
        f"LLaVA reward server not reachable at {url} after {retries + 1} attempts ({last}); start "
        "kvablack/LLaVA-server and set PCPO_LLAVA_URL, or use reward vlm_bertscore (in process)"
    )


def llava_bertscore(url: str | None = None, batch_size: int = 16, timeout: float = 120.0, retries: int = 3,
                    backoff: float = 2.0):
    """Reward fn: BERTScore recall of LLaVA's answer against "The image contains {prompt}".

    ``timeout`` seconds per request; ``retries`` further attempts with exponential ``backoff``."""
    url = url or os.environ.get("PCPO_LLAVA_URL", "http://127.0.0.1:8085")

    def _post(payload: dict) -> dict:
        raw = post_with_retries(url, pickle.dumps(payload), timeout, int(retries), float(backoff))
        return pickle.loads(raw)  # noqa: S301 (the server's documented protocol; a server you run)

    def reward(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        arr = images.permute(0, 2, 3, 1).cpu().numpy().astype(np.uint8)
        scores: list[float] = []
        for i in range(0, len(arr), batch_size):
            jpegs = [jpeg_bytes(im, CLIENT_JPEG_QUALITY) for im in arr[i:i + batch_size]]
            chunk = prompts[i:i + batch_size]
            out = _post({"images": jpegs, "queries": [[QUERY]] * len(chunk),
                         "answers": [[ref] for ref in references(chunk)]})
            scores.extend(np.asarray(out["recall"], dtype=np.float64).reshape(-1).tolist())
        return torch.tensor(scores, dtype=torch.float32)

    return reward
