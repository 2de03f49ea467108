"""The study stand-ins: a spec writer, run folders with synthetic curves, and fast fakes of the trainer,
generator and metric workers that write the documented run / image-set / metrics layouts.

Used by tests/study/ and tests/cli/ (``install_fakes(monkeypatch)``, ``write_spec(path, **changes)``).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from PIL import Image

from pcpo_eval.metrics.base import METRICS


def write_spec(path: Path, **changes) -> Path:
    """A 2 x 2 study (algorithm x batch) on stand-ins; ``changes`` replace top-level keys (None deletes)."""
    prompts = path.parent / "prompts.txt"
    prompts.write_text("a red cube\na <b>blue</b> ball & <script>alert(1)</script>\na green cone\n")
    spec = {
        "name": "unit",
        "description": "stand-in study",
        "train": {"overrides": {"epochs": 12, "checkpoint_every": 2}},
        "design": {"algorithm": {"DDPO": {"objective": "ppo_clip"}, "PCPO": {"objective": "pcpo"}},
                   "batch": {"16": {"sample_batch_size": 16}, "32": {"sample_batch_size": 32}}},
        "compare": {"factor": "algorithm", "baseline": "DDPO", "pcpo": "PCPO"},
        "targets": [0.3, 0.5],
        "select_target": 0.5,
        "eval": {"prompts": str(prompts), "seeds": "4", "steps": 4},
        "metrics": ["fd_toy", "lpips_toy"],
        "overall_only": ["fd_toy"],  # 4 images per prompt cannot fit a 128-d covariance
        "lmm": {"formula": "value ~ algorithm * batch + (1|prompt)"},
        "grid": {"prompts": 2, "seeds": 2},
    }
    spec.update(changes)
    spec = {k: v for k, v in spec.items() if v is not None}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rising(rate: float, run_sd: float = 0.0, control: float = 0.0, noise: float = 0.005):
    """A curve model for :class:`Fakes`: reward = control + rate_run * (epoch - 1) + noise, with the run's
    rate drawn around ``rate`` (SD ``run_sd``) and the untrained control flat at ``control``."""

    def curve(epochs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        e = np.arange(1, epochs + 1)
        ctrl = control + rng.normal(0, noise, epochs)
        r = rate + run_sd * rng.normal()
        return ctrl + r * (e - 1) + rng.normal(0, noise, epochs) * (e > 1), ctrl

    return curve


def write_run(rd: Path, epochs: int, rate: float, every: int, upto: int | None = None, curve=None,
               rng_key: str = "", config: dict | None = None) -> None:
    """A run directory: log.parquet (reward and paired control per epoch) + checkpoints every ``every``."""
    upto = epochs if upto is None else upto
    rng = np.random.default_rng(zlib.crc32(f"{rng_key or rate}".encode()))
    reward, control = (curve or rising(rate))(epochs, rng)
    e = np.arange(1, upto + 1)
    log = pd.DataFrame({
        "epoch": e, "reward_mean": reward[:upto], "control_reward_mean": control[:upto], "reward_std": 0.1 + 0 * e,
        "clipfrac": 0.2 + 0 * e, "approx_kl": 1e-4 * e, "rho_mean": 1.0 + 0 * e, "rho_min": 0.9 + 0 * e,
        "rho_max": 1.1 + 0 * e, "rho_std": 0.02 + 0 * e, "grad_first_abs_mean": 1e-3 * e,
        "grad_first_abs_var": 1e-6 * e, "wall_time_s": 0.1 + 0 * e,
    })  # fmt: skip
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "config.yaml").write_text(yaml.safe_dump(config or {"model": "toy"}, sort_keys=False))
    log.to_parquet(rd / "log.parquet", index=False)
    for ep in [*range(every, upto + 1, every), *([upto] if upto == epochs else [])]:
        ck = rd / "checkpoints" / f"epoch_{ep:04d}"
        ck.mkdir(parents=True, exist_ok=True)
        (ck / "checkpoint.json").write_text(json.dumps({"epoch": ep, "reward_mean": float(log.reward_mean[ep - 1])}))


class Fakes:
    """Counting stand-ins; ``fail_train_once`` / ``fail_metrics_on`` simulate crashes.

    ``curves`` maps a level of the compared factor to a curve model (:func:`rising`); default: PCPO
    rises 0.1 per epoch, everything else 0.07. Every run draws its noise from its own directory name,
    so runs of different seeds or arms differ. ``metric_effect`` maps a level to the shift of its
    per-prompt ``lpips_toy`` and overall ``fd_toy``; every run also gets its own offset (SD
    ``run_sd_metric``), the between-run variation that ``(1|run)`` models.
    """

    def __init__(self) -> None:
        self.train_calls: list[tuple[str, bool]] = []
        self.generate_calls: list[str] = []
        self.metrics_calls: list[str] = []
        self.fail_train_once: str | None = None
        self.fail_metrics_on: str | None = None
        self.curves: dict[str, object] = {}
        self.metric_effect: dict[str, float] = {"PCPO": 0.05}
        self.run_sd_metric = 0.01

    def train(self, cfg, out_dir, resume=False):
        out = Path(out_dir)
        self.train_calls.append((out.name, resume))
        level = out.name.split("__")[0].split("-", 1)[1]
        default = rising(0.1 if cfg.objective == "pcpo" else 0.07)
        curve = self.curves.get(level, default)
        if self.fail_train_once and self.fail_train_once in out.name:
            self.fail_train_once = None
            write_run(out, cfg.epochs, 0, cfg.checkpoint_every, upto=cfg.epochs // 2, curve=curve, rng_key=out.name,
                       config=cfg.to_dict())
            raise RuntimeError("simulated crash mid-training")
        write_run(out, cfg.epochs, 0, cfg.checkpoint_every, curve=curve, rng_key=out.name, config=cfg.to_dict())
        return pd.read_parquet(out / "log.parquet")

    def generate_set(self, model, prompts, seeds, out_dir, **kw):
        from pcpo_eval.generate.plan import parse_seeds
        from pcpo_eval.imageset import image_rel_path
        from pcpo_eval.prompts import load_prompts

        out = Path(out_dir)
        self.generate_calls.append(str(model))
        ps = load_prompts(prompts)
        rows = []
        for pid, prompt in zip(ps.prompt_ids, ps.prompts, strict=True):
            for s in parse_seeds(seeds):
                rel = image_rel_path(pid, s)
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (8, 8), (pid * 40 % 255, s * 50 % 255, 100)).save(out / rel)
                rows.append({"prompt_id": pid, "prompt": prompt, "seed": s, "path": rel, "image_sha256": "x"})
        pd.DataFrame(rows).to_parquet(out / "manifest.parquet", index=False)
        (out / "set.json").write_text(json.dumps({"model": str(model)}))

    def run_metrics(self, image_set, metrics, out_dir, reference=None, options=None):
        sdir = Path(image_set)
        self.metrics_calls.append(str(sdir))
        if self.fail_metrics_on and self.fail_metrics_on in str(sdir):
            raise RuntimeError("simulated metrics crash")
        man = pd.read_parquet(sdir / "manifest.parquet")
        pids = sorted(man.prompt_id.unique())
        # seeded by the set's place in the study (not the tmp path), so every test run draws the same data
        rng = np.random.default_rng(zlib.crc32("/".join(sdir.parts[-2:]).encode()))
        run = sdir.parent.name if sdir.name.startswith("epoch_") else "base"
        level = run.split("__")[0].split("-", 1)[1] if run != "base" else ""
        shift = self.metric_effect.get(level, 0.0)
        run_offset = np.random.default_rng(zlib.crc32(run.encode())).normal(0, self.run_sd_metric) if run != "base" else 0
        pp = pd.DataFrame({"prompt_id": pids, "prompt": [f"p{p}" for p in pids],
                           "fd_toy": [5.0 + p - 60 * shift + rng.normal(0, 0.1) for p in pids],
                           "lpips_toy": [0.4 + 0.01 * p + shift + run_offset + rng.normal(0, 0.01) for p in pids]})
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        pp.to_parquet(out / "per_prompt.parquet", index=False)
        per_image = [m for m in metrics if METRICS[m].is_preference]
        if per_image:  # a preference score per image: prompt + shared-noise + run + residual variation
            pi = man[["prompt_id", "prompt", "seed", "path"]].copy()
            noise = [np.random.default_rng([int(p), int(k)]).normal(0, 0.05) for p, k in zip(pi.prompt_id, pi.seed, strict=True)]
            for m in per_image:
                pi[m] = (0.2 + 0.02 * pi.prompt_id + np.array(noise) + shift + run_offset
                         + rng.normal(0, 0.05, len(pi)))
                pp[m] = pi.groupby("prompt_id")[m].mean().reindex(pids).to_numpy()
            pi.to_parquet(out / "per_image.parquet", index=False)
            pp.to_parquet(out / "per_prompt.parquet", index=False)
        from pcpo_eval.metrics.workers import MetricsOptions, request_fingerprint

        fp = request_fingerprint(sdir, list(metrics), reference, options or MetricsOptions())  # as the real one
        res = {"metrics": {m: float(pp[m].mean()) for m in metrics if m in pp},  # a test adds the others
               "settings": {"metrics": list(metrics), "request_fingerprint": fp}}
        (out / "metrics.json").write_text(json.dumps(res))
        return res


def install_fakes(monkeypatch) -> Fakes:
    """Replace the trainer, generator, metric workers and credit figure with :class:`Fakes`."""
    import io

    import pcpo_eval.credit.plot
    import pcpo_eval.generate.runner
    import pcpo_eval.metrics.workers
    import pcpo_eval.train.trainer

    f = Fakes()
    monkeypatch.setattr(pcpo_eval.train.trainer, "train", f.train)
    monkeypatch.setattr(pcpo_eval.generate.runner, "generate_set", f.generate_set)
    monkeypatch.setattr(pcpo_eval.metrics.workers, "run_metrics", f.run_metrics)
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), "white").save(buf, format="PNG")
    monkeypatch.setattr(pcpo_eval.credit.plot, "credit_figure_png", lambda *a, **k: buf.getvalue())
    monkeypatch.setattr(pcpo_eval.credit.plot, "credit_figure_files",
                        lambda *a, **k: {"png": buf.getvalue(), "svg": b"<svg/>", "pdf": b"%PDF-1.4"})
    return f
