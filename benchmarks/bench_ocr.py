"""OCR reward: our edit distance vs the ``Levenshtein`` package Flow-GRPO imports, and the text-side cost.

1. Agreement and speed of the pure-Python Wagner-Fischer fallback against ``Levenshtein.distance``
   (C++; optional extra 'ocr') on random OCR-like pairs (targets of 5-30 characters, recognised texts
   with a few edits or unrelated), same pairs for both.
2. Rewards of the whole text side (target extraction, normalisation, capped distance) against
   ``Levenshtein``-based Flow-GRPO formula written out inline, and its cost per image: the part of
   the reward that is not the OCR engine.
"""

from __future__ import annotations

import string
import time

import numpy as np

from pcpo_eval.rewards import ocr as O

N_PAIRS = 5000


def _pairs(rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    alphabet = np.array(list(string.ascii_letters + string.digits + " "))
    out = []
    for _ in range(n):
        target = "".join(rng.choice(alphabet, size=int(rng.integers(5, 31))))
        chars = list(target)
        if rng.random() < 0.2:  # unrelated text
            chars = list(rng.choice(alphabet, size=int(rng.integers(0, 40))))
        else:
            for _ in range(int(rng.integers(0, 5))):
                pos = int(rng.integers(0, len(chars) + 1))
                op = rng.integers(0, 3)
                if op == 0:
                    chars.insert(pos, str(rng.choice(alphabet)))
                elif chars and pos < len(chars):
                    if op == 1:
                        del chars[pos]
                    else:
                        chars[pos] = str(rng.choice(alphabet))
        out.append(("".join(chars), target))
    return out


def _time(fn, pairs) -> tuple[float, list]:
    t0 = time.perf_counter()
    vals = [fn(a, b) for a, b in pairs]
    return time.perf_counter() - t0, vals


def main() -> None:
    rng = np.random.default_rng(0)
    pairs = _pairs(rng, N_PAIRS)
    norm = [(O.normalize_text(a), O.normalize_text(b)) for a, b in pairs]
    lines = ["## OCR reward (Flow-GRPO convention)", ""]
    try:
        from Levenshtein import distance as lev
    except ImportError:
        lev = None
    t_dp, d_dp = _time(O._levenshtein_dp, norm)
    if lev is not None:
        t_c, d_c = _time(lev, norm)
        agree = float(np.mean([x == y for x, y in zip(d_dp, d_c, strict=True)]))

        def flow_grpo(rec: str, tgt: str) -> float:  # formula written out as in flow_grpo/ocr.py
            r, t = rec.replace(" ", "").lower(), tgt.replace(" ", "").lower()
            d = 0 if t in r else lev(r, t)
            return 1 - min(d, len(t)) / len(t)

        ok = [(a, b) for a, b in pairs if O.normalize_text(b)]
        t_ours, r_ours = _time(lambda a, b: O.ocr_reward_value(a, b), ok)
        _, r_ref = _time(flow_grpo, ok)
        max_diff = float(np.max(np.abs(np.array(r_ours) - np.array(r_ref))))
        lines += [
            f"{N_PAIRS} random OCR-like pairs (targets 5-30 chars; 20% unrelated text), one run, 1 thread.",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| pure-Python DP == `Levenshtein.distance` | {agree:.4f} of pairs |",
            f"| DP time / `Levenshtein` time | {t_dp / t_c:.1f}x ({1e6 * t_dp / N_PAIRS:.1f} vs {1e6 * t_c / N_PAIRS:.2f} us/pair) |",
            f"| max abs reward diff vs Flow-GRPO formula inline | {max_diff:.1e} over {len(ok)} pairs |",
            f"| text side per image (with `Levenshtein`) | {1e6 * t_ours / len(ok):.1f} us |",
        ]
    else:
        lines += [
            "`Levenshtein` (extra 'ocr') not installed: only the fallback was timed.",
            "",
            "| measure | value |",
            "| --- | --- |",
            f"| pure-Python DP | {1e6 * t_dp / N_PAIRS:.1f} us/pair |",
        ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
