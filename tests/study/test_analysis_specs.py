"""Every shipped study spec (analysis/*.yaml) validates, and its eval schedule is one THE sampler
catalogue (:data:`pcpo_eval.samplers.SCHEDULES`) offers for the spec's model family; a schedule of
the wrong family is rejected at validation, before any run is trained.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.metrics.base import METRICS
from pcpo_eval.models.registry import prediction_of
from pcpo_eval.prompts import DATASETS
from pcpo_eval.samplers import SCHEDULES, resolve_sampler
from pcpo_eval.study.spec import load_spec
from pcpo_eval.testing import isolate_weight_caches

ANALYSIS = Path(__file__).resolve().parents[2] / "analysis"
SPECS = sorted(ANALYSIS.glob("*.yaml"))
#: Specs on the paper's real models (every spec but the toy ones): their weights and prompt
#: datasets are not part of the checkout.
REAL_WEIGHT_SPECS = {p.name for p in SPECS if not p.name.startswith("toy_")}
#: the paper's quality protocol: 45 prompts x 1112 seeds with per-prompt FID (Tables 2-4)
PAPER_QUALITY_SPECS = {"ddpo_aesthetic.yaml", "dancegrpo_hps.yaml", "dancegrpo_flux_hps.yaml"}
#: one spec per experiment of the paper (docs/reproduce.md maps tables and figures to them)
PAPER_SPECS = {
    "ddpo_aesthetic.yaml", "ddpo_bertscore.yaml", "dancegrpo_hps.yaml", "dancegrpo_flux_hps.yaml",
    "dpo_comparison.yaml", "flowgrpo_sd35_ocr.yaml", "flowgrpo_sd35_pickscore.yaml",
    "dancegrpo_flux_naive_acc.yaml", "ddpo_ablation.yaml", "ddpo_timestep_subsampling.yaml", "ddpo_delta_terms.yaml",
}  # fmt: skip


#: the paper's exact one-run-per-arm design, a documented variant (its header says what it cannot show)
ONE_RUN_VARIANTS = {"ddpo_aesthetic_one_run.yaml"}


@pytest.fixture(autouse=True)
def _no_real_weights(tmp_path, monkeypatch):
    """Empty weight caches: the toy specs must validate with weights checked on any machine."""
    isolate_weight_caches(tmp_path, monkeypatch)


def test_every_spec_is_listed():
    assert {p.name for p in SPECS} >= PAPER_SPECS | {"toy_study.yaml", "toy_flow_study.yaml", "toy_aa_study.yaml"}


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_spec_trains_replicates_with_paired_controls(path):
    """A verdict compares arms over runs: every shipped spec trains >= 2 seeds per arm with paired controls."""
    spec = load_spec(path, check_weights=False)
    for arm, seeds in spec.seeds.items():
        if path.name in ONE_RUN_VARIANTS:
            assert len(seeds) == 1 and "cannot show" in path.read_text()
            continue
        assert len(seeds) >= 2, f"{path.name}: arm {arm} has seeds {seeds}"
    assert spec.paired_control and all(r.train.paired_control for r in spec.runs)
    assert len({r.name for r in spec.runs}) == len(spec.runs)


def test_paper_specs_opt_in_to_the_per_prompt_fid_protocol():
    """1112 images per prompt < 2049 (FID's 2048-d covariance): refused unless opted in, as the paper's tables do."""
    for name in sorted(PAPER_QUALITY_SPECS):
        spec = load_spec(ANALYSIS / name, check_weights=False)
        assert spec.per_prompt_rank_deficient_ok == ("fid",) and "fid" in spec.per_prompt_metrics


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_spec_validates_and_schedule_fits_model_family(path):
    spec = load_spec(path, check_weights=path.name not in REAL_WEIGHT_SPECS)
    sampler = resolve_sampler("auto", prediction_of(spec.base_model))
    assert spec.eval.sigma_schedule in SCHEDULES[sampler]
    if "sigma_schedule" not in (yaml.safe_load(path.read_text()).get("eval") or {}):
        assert spec.eval.sigma_schedule == SCHEDULES[sampler][0]  # unset = the sampler's default
    assert spec.sampling()["sigma_schedule"] == spec.eval.sigma_schedule
    for run in spec.runs:  # every trained run carries its resolved train config, of the same family
        assert run.train is not None and prediction_of(run.train.model) == prediction_of(spec.base_model)


def test_toy_flow_spec_defaults_to_the_ode():
    spec = load_spec(ANALYSIS / "toy_flow_study.yaml")
    assert spec.base_model == "toyflow" and spec.eval.sigma_schedule == "ode"


def _flow_spec(tmp_path: Path, **eval_changes) -> Path:
    data = yaml.safe_load((ANALYSIS / "toy_flow_study.yaml").read_text())
    data["train"]["config"] = str(ANALYSIS.parent / "train" / "configs" / "toy_flow_dancegrpo.yaml")
    data["eval"].update(eval_changes)
    path = tmp_path / "flow.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_flow_model_with_ddim_schedule_is_rejected_at_validation(tmp_path):
    with pytest.raises(UserError) as ei:
        load_spec(_flow_spec(tmp_path, sigma_schedule="ddim"))
    msg = str(ei.value)
    assert "\n" not in msg and "has 1 problem(s)" in msg
    assert "eval.sigma_schedule 'ddim' does not fit the flow sampler of model 'toyflow'" in msg
    assert "choose ode, dance, flowgrpo" in msg


def test_flow_model_accepts_a_flow_sde(tmp_path):
    assert load_spec(_flow_spec(tmp_path, sigma_schedule="dance")).eval.sigma_schedule == "dance"


def test_eps_model_rejects_a_flow_schedule(tmp_path):
    data = yaml.safe_load((ANALYSIS / "toy_study.yaml").read_text())
    data["eval"]["sigma_schedule"] = "ode"
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError, match=r"eval.sigma_schedule 'ode' does not fit the ddim sampler of model 'toy' "
                                        r"\(choose ddim, pcpo; unset = ddim\)"):
        load_spec(path)


@pytest.mark.parametrize("name", sorted(REAL_WEIGHT_SPECS))
def test_paper_spec_without_weights_lists_every_missing_item_in_one_error(name):
    """On a machine without weights or prompt datasets, validation names each missing item once,
    with where it looked and how to get it, before anything is trained."""
    spec = load_spec(ANALYSIS / name, check_weights=False)
    with pytest.raises(UserError) as ei:
        load_spec(ANALYSIS / name)
    msg = str(ei.value)
    assert "\n" not in msg and f"study spec {ANALYSIS / name} has " in msg
    items = re.findall(r"\(\d+\) ([^;]+(?:;[^(]*)?)", msg)
    assert len(items) == int(re.search(r"has (\d+) problem", msg).group(1))
    assert len(set(items)) == len(items), "an item is listed twice"
    model = spec.base_model
    assert re.search(rf"base model '{re.escape(model)}'", msg) or "PCPO_SD" in msg or "PCPO_FLUX" in msg
    for run in spec.runs:
        if run.train.prompts in DATASETS:
            assert f"training prompts {run.train.prompts}: prompt set {run.train.prompts} not found" in msg
    for metric in spec.metrics:
        for backend in METRICS[metric].backends:
            assert backend in msg or METRICS[metric].label in msg or metric in msg


@pytest.mark.parametrize("device", ["auto", "cuda", "CUDA:1", "cpu"])
def test_eval_device_auto_reaches_generate_and_metrics_resolved(tmp_path, monkeypatch, device):
    """``eval.device: auto`` is read as ``--device auto`` (``dist.resolve_device``: this process's GPU, else cpu):
    passed on as written, ``torch.device('auto')`` stopped the sets stage after training."""
    import torch

    from pcpo_eval.study.runner import Study

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    spec = load_spec(_flow_spec(tmp_path, device=device))
    want = {"auto": "cuda:0", "cuda": "cuda", "CUDA:1": "cuda:1", "cpu": "cpu"}[device]
    assert Study(spec, tmp_path / "out")._eval_device() == want


def test_eval_device_typo_is_a_spec_problem(tmp_path):
    with pytest.raises(UserError, match=r"eval: device='gpu' \(choose auto, cpu, cuda or cuda:N\)"):
        load_spec(_flow_spec(tmp_path, device="gpu"))
