"""Does the toy regime learn? Paired gains of DDPO (ppo_clip) and PCPO (pcpo) over untrained controls.

For each arm (``train/configs/toy_ddpo.yaml``, ``toy_pcpo.yaml``) and each seed ``s``:

* **run**: ``Trainer(config, seed=s, paired_control=true).run()``. The paired control is the
  untrained model sampling the same prompts with the same keyed generators, sampler and schedule
  every epoch (``control_reward_mean``): the ``lr -> 0`` limit of ``bench_toy_rl.py``'s
  ``learning_rate=1e-12`` twin without its training cost.
* **on-policy gain**: mean over the last ``--last`` epochs of ``reward_mean - control_reward_mean``.
* **held-out gain**: the final policy and the base model sample the same fixed set (every toy
  prompt x ``--eval-noises`` noises, seeds independent of ``s``, the arm's own sampler); gain =
  mean paired reward difference.

Printed (markdown): per arm, mean +- SD over seeds of both gains and their ratio mean/SD, the
median ``approx_kl`` and mean ``clipfrac`` over all epochs of all seeds, wall and CPU seconds.
The bar (issue: "find a toy regime that learns"): both ratios >= 3, median approx_kl <= 0.05,
mean clipfrac <= 0.25, 3 seeds x 2 arms with their controls in <= ~6 minutes.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_toy_regime.py [--seeds 3] [--epochs N]
[--configs DIR]`` (``--configs``: measure ``toy_ddpo.yaml`` / ``toy_pcpo.yaml`` from another directory).
Exit status 1 when an arm misses the bar.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
ARMS = (("DDPO (ppo_clip)", "toy_ddpo.yaml"), ("PCPO (pcpo)", "toy_pcpo.yaml"))
BAR = {"ratio": 3.0, "approx_kl": 0.05, "clipfrac": 0.25}


@dataclass
class SeedResult:
    """One seed of one arm: per-epoch paired gains, held-out gain, PPO statistics, cost."""

    seed: int
    epoch_gains: np.ndarray  # reward_mean - control_reward_mean, per epoch
    heldout_gain: float
    approx_kl: np.ndarray  # per epoch
    clipfrac: np.ndarray  # per epoch
    wall_s: float
    cpu_s: float


@contextlib.contextmanager
def base_policy(trainer) -> Iterator[None]:
    """Temporarily make ``trainer.adapter`` the untrained model: LoRA disabled, or the shipped weights
    swapped in for a full fine-tune (``lora_rank: 0``)."""
    ad = trainer.adapter
    if trainer.cfg.lora_rank > 0:
        ad.denoiser.disable_adapters()
        try:
            yield
        finally:
            ad.denoiser.enable_adapters()
        return
    from pcpo_eval.models.registry import load_model

    live, ad.denoiser = ad.denoiser, load_model(trainer.cfg.model, device=trainer.device).denoiser
    try:
        yield
    finally:
        ad.denoiser = live


def heldout_rewards(trainer, n_noises: int) -> np.ndarray:
    """Rewards of the fixed held-out set (all prompts x ``n_noises``) under the adapter's current policy.

    Same sampler as training (``cfg.sigma_schedule()``: DDIM for ppo_clip, PCPO's sigma~ for pcpo),
    generators keyed by the image index only, so every seed and the base model share the set.
    """
    from pcpo_eval.samplers.ddim import sample_ddim
    from pcpo_eval.seeding import keyed_generator

    cfg, ad = trainer.cfg, trainer.adapter
    prompts = [p for p in trainer.prompt_set.prompts for _ in range(n_noises)]
    ad.denoiser.eval()
    out = []
    for start in range(0, len(prompts), 45):
        bp = prompts[start:start + 45]
        gens = [keyed_generator("bench_toy_regime/heldout", start + j) for j in range(len(bp))]
        with torch.no_grad():
            s = sample_ddim(ad, ad.encode_prompts(bp), trainer.null.repeat(len(bp)), cfg=cfg.cfg,
                            steps=cfg.sample_steps, eta=cfg.sample_eta, generators=gens,
                            sigma_schedule=cfg.sigma_schedule(), convention=cfg.credit_convention,
                            fallback=cfg.credit_fallback)
        out.append(trainer.reward_fn(ad.decode(s.latents.float()), bp).double().numpy())
    return np.concatenate(out)


def run_seed(config: Path, seed: int, overrides: list[str], n_noises: int, tmp: Path) -> SeedResult:
    """Train one seed with its paired control and measure both gains."""
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import Trainer

    cfg = load_config(config, [*overrides, f"seed={seed}", "checkpoint_every=100000", "paired_control=true"])
    t0, c0 = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(sys.stderr):  # the trainer's epoch lines; stdout is the table
        trainer = Trainer(cfg, tmp / f"{config.stem}_s{seed}")
        log = trainer.run()
    tuned = heldout_rewards(trainer, n_noises)
    with base_policy(trainer):
        heldout = tuned - heldout_rewards(trainer, n_noises)
    gains = (log["reward_mean"] - log["control_reward_mean"]).to_numpy()
    return SeedResult(seed, gains, float(heldout.mean()),
                      log["approx_kl"].to_numpy(), log["clipfrac"].to_numpy(),
                      time.perf_counter() - t0, time.process_time() - c0)


def summarize(name: str, config: Path, results: list[SeedResult], last: int) -> dict[str, object]:
    """Mean +- SD (ddof 1) over seeds of both gains, ratios, PPO statistics, the bar verdict."""
    from pcpo_eval.train.config import load_config

    cfg = load_config(config)  # objective and credit convention only (not affected by --epochs)
    on = np.array([r.epoch_gains[-last:].mean() for r in results])
    ho = np.array([r.heldout_gain for r in results])
    kl = np.median(np.concatenate([r.approx_kl for r in results]))
    cf = np.mean(np.concatenate([r.clipfrac for r in results]))
    sd_on, sd_ho = on.std(ddof=1), ho.std(ddof=1)
    ratio_on, ratio_ho = on.mean() / sd_on, ho.mean() / sd_ho
    ok = min(ratio_on, ratio_ho) >= BAR["ratio"] and kl <= BAR["approx_kl"] and cf <= BAR["clipfrac"]
    conv = cfg.credit_convention if cfg.objective == "pcpo" else "-"
    return {"arm": name, "convention": conv, "seeds": len(results), "on": (on.mean(), sd_on, ratio_on),
            "ho": (ho.mean(), sd_ho, ratio_ho), "kl": kl, "cf": cf, "wall": sum(r.wall_s for r in results),
            "cpu": sum(r.cpu_s for r in results), "ok": ok, "per_seed": list(zip(on, ho, strict=True))}


def markdown(rows: list[dict[str, object]], args: argparse.Namespace, total_s: float) -> str:
    """The results table (and a per-seed table) as markdown."""
    lines = [f"## Toy regime: paired gain over the untrained control ({args.seeds} seeds, {total_s:.0f} s total)\n",
             f"| arm | credit convention | on-policy gain, last {args.last} epochs (mean +- SD) | ratio | "
             "held-out gain (mean +- SD) | ratio | median approx_kl | mean clipfrac | wall / CPU s | bar |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        (m, s, q), (hm, hs, hq) = r["on"], r["ho"]
        lines.append(f"| {r['arm']} | {r['convention']} | {m:+.4f} +- {s:.4f} | {q:.1f} | {hm:+.4f} +- {hs:.4f} | "
                     f"{hq:.1f} | {r['kl']:.2e} | {r['cf']:.3f} | {r['wall']:.0f} / {r['cpu']:.0f} | "
                     f"{'pass' if r['ok'] else 'FAIL'} |")
    lines += ["", "| arm | " + " | ".join(f"seed {i}: on-policy / held-out" for i in range(args.seeds)) + " |",
              "|---|" + "---|" * args.seeds]
    for r in rows:
        lines.append(f"| {r['arm']} | " + " | ".join(f"{a:+.4f} / {b:+.4f}" for a, b in r["per_seed"]) + " |")
    lines.append(f"\nBar: both ratios >= {BAR['ratio']:g}, median approx_kl <= {BAR['approx_kl']:g}, mean clipfrac "
                 f"<= {BAR['clipfrac']:g}. Held-out set: 45 toy prompts x {args.eval_noises} fixed noises.")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per arm (>= 2 for an SD)")
    ap.add_argument("--epochs", type=int, default=None, help="override the configs' epochs")
    ap.add_argument("--last", type=int, default=5, help="epochs averaged for the on-policy gain")
    ap.add_argument("--eval-noises", type=int, default=2, help="held-out noises per toy prompt")
    ap.add_argument("--configs", type=Path, default=ROOT / "train" / "configs")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.seeds < 2:
        ap.error("--seeds must be >= 2 (the bar is a ratio to the seed-to-seed SD)")
    torch.set_num_threads(args.threads)
    overrides = [f"epochs={args.epochs}"] if args.epochs else []
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, file in ARMS:
            config = args.configs / file
            results = [run_seed(config, s, overrides, args.eval_noises, Path(tmp)) for s in range(args.seeds)]
            rows.append(summarize(name, config, results, args.last))
    print(markdown(rows, args, time.perf_counter() - t0))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
