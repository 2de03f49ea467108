"""Paper fidelity of the study specs and the commands around them (issue 27).

* docs/reproduce.md, row by row: every spec a row names exists and validates offline, and the
  paper's prompts, checkpoints, targets, metric versions and selection protocol that the row names
  are the spec's (:data:`PAPER_FACTS`, each with its line in pcpo-paper.tex).
* explicit checkpoint epochs, preference prompt sets and named grids are validated when loaded;
* a launch whose processes x per-process batch differs from the paper's total is refused;
* the KL to the reference is carried into the traces as a running mean and drawn.
End-to-end runs of every spec on tiny stand-ins are tests/e2e/test_paper_specs.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.study.spec import load_spec
from pcpo_eval.train.config import config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]
REPRODUCE = ROOT / "docs" / "reproduce.md"

#: spec -> what the paper states for it (pcpo-paper.tex lines in the comments)
PAPER_FACTS: dict[str, dict] = {
    # DDPO: checkpoint every epoch (l.1115, l.1166); four aesthetic targets (l.1457-1466)
    "ddpo_aesthetic.yaml": {"checkpoint_every": 1, "targets": [6.0, 6.3, 6.6, 6.9], "eval_prompts": "simple_animals",
                            "eval_seeds": "1112",
                            "grids": {"image_grid_a": (("cat", "bear", "butterfly", "chicken", "bee", "camel"), None),
                                      "consecutive_seed": (("hedgehog", "mouse"), (0, 1, 2, 3, 4, 5))}},
    "ddpo_aesthetic_one_run.yaml": {"checkpoint_every": 1, "targets": [6.0, 6.3, 6.6, 6.9], "seeds": 1},
    "ddpo_bertscore.yaml": {"checkpoint_every": 1, "targets": [0.49, 0.50, 0.51, 0.52]},
    "ddpo_ablation.yaml": {"checkpoint_every": 1},
    "ddpo_delta_terms.yaml": {"checkpoint_every": 1},
    "ddpo_timestep_subsampling.yaml": {"checkpoint_every": 1, "grids": {"naive_acceleration_b": (("fish",), (0, 1, 2, 3))}},
    # DanceGRPO SD1.4: every 50 (l.1115); HPS targets 0.37-0.34 (l.1480-1484); E200 both arms (l.686-687)
    "dancegrpo_hps.yaml": {"checkpoint_every": 50, "targets": [0.34, 0.35, 0.36, 0.37], "select_epoch": 200,
                           "preference": {"coco2017_val": {"DanceGRPO": 200, "PCPO": 200},
                                          "mjhq30k": {"DanceGRPO": 200, "PCPO": 200}}},
    # FLUX: PCPO E120 vs DanceGRPO E180 (l.1282-1285, l.692-699); image_grid (b) at E200 (l.114-116)
    "dancegrpo_flux_hps.yaml": {"checkpoint_every": 20, "targets": [0.33, 0.34, 0.35, 0.36],
                                "select_epoch": {"DanceGRPO": 180, "PCPO": 120},
                                "preference": {"coco2017_val": {"DanceGRPO": 180, "PCPO": 120},
                                               "mjhq30k": {"DanceGRPO": 180, "PCPO": 120}},
                                "grid_epochs": {"image_grid_b": {"DanceGRPO": 200, "PCPO": 200}}},
    "dancegrpo_flux_naive_acc.yaml": {"checkpoint_every": 60},
    # DPO table: HPSv2 v2.0 (l.1276), PCPO E200 (l.1421), CLIPScore (l.1403-1404), Pick-a-Pic test (l.1277)
    "dpo_comparison.yaml": {"checkpoint_every": 50, "select_epoch": 200, "eval_prompts": "pickapic_test",
                            "metrics_include": ["hps_v20", "clipscore", "aesthetic", "pickscore", "imagereward"],
                            "metrics_exclude": ["hps"]},
    "flowgrpo_sd35_ocr.yaml": {"checkpoint_every": 20},
    "flowgrpo_sd35_pickscore.yaml": {"checkpoint_every": 20},
}
MAIN_SPEC_ROWS = {"ddpo_aesthetic.yaml", "ddpo_bertscore.yaml", "dancegrpo_hps.yaml", "dancegrpo_flux_hps.yaml",
                  "dpo_comparison.yaml", "flowgrpo_sd35_ocr.yaml", "flowgrpo_sd35_pickscore.yaml",
                  "ddpo_ablation.yaml", "ddpo_timestep_subsampling.yaml", "dancegrpo_flux_naive_acc.yaml",
                  "ddpo_delta_terms.yaml"}


def reproduce_rows() -> list[tuple[str, list[str]]]:
    """(paper item, spec files linked in its row) for every table row of docs/reproduce.md."""
    rows = []
    for line in REPRODUCE.read_text().splitlines():
        if not line.startswith("| ") or line.startswith(("| Paper item", "|---", "| Where")):
            continue
        item = line.split("|")[1].strip()
        rows.append((item, re.findall(r"\]\(\.\./(analysis/[^)]+\.yaml)\)", line)))
    return rows


def _specs_in_rows() -> list[str]:
    return sorted({s for _, specs in reproduce_rows() for s in specs if not s.startswith("analysis/irg/")
                   and not s.startswith("analysis/human/")})


def test_reproduce_md_names_every_paper_spec():
    named = {Path(s).name for s in _specs_in_rows()}
    assert MAIN_SPEC_ROWS <= named, sorted(MAIN_SPEC_ROWS - named)
    assert set(PAPER_FACTS) <= named


@pytest.mark.parametrize("rel", _specs_in_rows())
def test_every_row_spec_exists_validates_and_names_the_papers_protocol(rel):
    path = ROOT / rel
    assert path.is_file(), f"docs/reproduce.md names {rel}, which does not exist"
    sp = load_spec(path, check_weights=False)
    facts = PAPER_FACTS.get(path.name, {})
    trained = [r.train for r in sp.runs if r.train is not None]
    if "checkpoint_every" in facts:
        assert {c.checkpoint_every for c in trained} == {facts["checkpoint_every"]}, path.name
    if "targets" in facts:
        assert list(sp.targets) == pytest.approx(facts["targets"])
    if "select_epoch" in facts:
        assert sp.select_epoch == facts["select_epoch"]
    if "seeds" in facts:
        assert {len(s) for s in sp.seeds.values()} == {facts["seeds"]}
    if "eval_prompts" in facts:
        assert sp.eval.prompts == facts["eval_prompts"]
    if "eval_seeds" in facts:
        assert sp.eval.seeds == facts["eval_seeds"]
    assert set(facts.get("metrics_include", [])) <= set(sp.metrics)
    assert not set(facts.get("metrics_exclude", [])) & set(sp.metrics)
    prefs = {p.name: p for p in sp.preferences}
    for name, epochs in facts.get("preference", {}).items():
        assert prefs[name].prompts == name and prefs[name].epochs == epochs and prefs[name].seeds == "1"
    grids = {g.name: g for g in sp.grids}
    for name, (prompts, seeds) in facts.get("grids", {}).items():
        assert grids[name].prompts == prompts and (seeds is None or grids[name].seeds == seeds)
    for name, epochs in facts.get("grid_epochs", {}).items():
        assert grids[name].epochs == epochs


def test_reproduce_md_rows_name_the_metric_versions_and_protocols():
    text = REPRODUCE.read_text()
    for needle in ("hps_v20", "select_epoch: {DanceGRPO: 180, PCPO: 120}", "coco2017_val", "mjhq30k",
                   "higher-reward checkpoint", "kl_ref", "irg_prompts.txt", "ddpo_aesthetic_one_run.yaml",
                   "Deliberate deviations", "paper_total_batch"):
        assert needle in text, needle


def test_irg_prompts_are_the_papers_four():
    lines = (ROOT / "analysis" / "irg" / "irg_prompts.txt").read_text().splitlines()
    assert len(lines) == 4 and lines[1] == "The kitchen has a stove and a refrigerator."


# -- explicit epochs, preference sets, grids ----------------------------------------------------------


def _toy_spec(tmp_path: Path, **extra) -> Path:
    data = yaml.safe_load((ROOT / "analysis" / "toy_study.yaml").read_text())
    if data["train"].get("config"):
        data["train"]["config"] = str((ROOT / "analysis" / data["train"]["config"]).resolve())
    data.update(extra)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_explicit_epochs_must_be_saved_by_every_run(tmp_path):
    sp = load_spec(_toy_spec(tmp_path), check_weights=False)
    arms = list(sp.seeds)
    every = sp.runs[0].train.checkpoint_every
    ok = {arms[0]: every, arms[1]: 2 * every}
    assert load_spec(_toy_spec(tmp_path, select_epoch=ok), check_weights=False).select_epoch == ok
    with pytest.raises(UserError, match="not at epoch"):
        load_spec(_toy_spec(tmp_path, select_epoch={arms[0]: every + 1, arms[1]: every}), check_weights=False)
    with pytest.raises(UserError, match="an epoch for each arm"):
        load_spec(_toy_spec(tmp_path, select_epoch={arms[0]: every}), check_weights=False)


def test_preference_list_and_named_grids_parse(tmp_path):
    sp0 = load_spec(_toy_spec(tmp_path), check_weights=False)
    every = sp0.runs[0].train.checkpoint_every
    spec = _toy_spec(tmp_path, preference=[{"name": "a", "prompts": "toy"}, {"name": "b", "prompts": "toy",
                                                                            "epochs": every}],
                     grid=[{"name": "g", "prompts": ["a red ball", "x"], "seeds": [3, 4]}, {"name": "h", "prompts": 2}])
    sp = load_spec(spec, check_weights=False)
    assert [p.name for p in sp.preferences] == ["a", "b"] and sp.preference.name == "a"
    assert sp.preferences[1].epochs == dict.fromkeys(sp.seeds, every)
    assert sp.grids[0].prompts == ("a red ball", "x") and sp.grids[0].seeds == (3, 4) and sp.grids[0].own_sets
    assert sp.grids[1].prompts == 2 and not sp.grids[1].own_sets
    bad = _toy_spec(tmp_path, preference=[{"prompts": "toy"}], grid=[{"name": "g", "seeds": [1, 1]}])
    with pytest.raises(UserError) as exc:
        load_spec(bad, check_weights=False)
    assert "preference[0] needs a name" in str(exc.value) and "distinct seeds" in str(exc.value)


# -- launcher batch -----------------------------------------------------------------------------------


@pytest.mark.parametrize("setup", sorted((ROOT / "train" / "configs").glob("setup*.yaml")), ids=lambda p: p.stem)
def test_setup_configs_state_the_papers_total_and_meet_it_on_one_process(setup):
    cfg = load_config(setup)
    assert cfg.paper_total_batch > 0 and cfg.total_batch_problem(1) is None
    assert cfg.total_batch_problem(8) is not None  # 8 processes without dividing: refused


def test_launch_with_the_wrong_total_is_refused_with_the_fix():
    cfg = load_config(ROOT / "train" / "configs" / "setup5_dancegrpo_sd14.yaml")
    msg = cfg.total_batch_problem(8)
    assert "4096" in msg and "512" in msg and "sample_batches_per_epoch=4" in msg
    fixed = load_config(ROOT / "train" / "configs" / "setup5_dancegrpo_sd14.yaml", ["sample_batches_per_epoch=4"])
    assert fixed.total_batch_problem(8) is None


def test_trainer_refuses_before_loading_anything(tmp_path):
    from pcpo_eval.train.trainer import Trainer

    cfg = config_from_dict({**load_config(ROOT / "train" / "configs" / "toy_ddpo.yaml").to_dict(),
                            "paper_total_batch": 10_000, "device": "cpu"})
    with pytest.raises(UserError, match="paper_total_batch=10000"):
        Trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_train_exits_2_with_one_error_line(cli, tmp_path):
    res = cli("train", ROOT / "train" / "configs" / "toy_ddpo.yaml", "--out", tmp_path / "r", "paper_total_batch=7",
              "--device", "cpu")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "paper_total_batch=0" in lines[0]


# -- KL to the reference ------------------------------------------------------------------------------


def test_kl_ref_running_mean_and_figure():
    from pcpo_eval.report.kl_ref import kl_ref_png, running_mean

    rm = running_mean([float("nan"), 1.0, None, 3.0])
    assert math.isnan(rm[0]) and rm[1:] == [1.0, 1.0, 2.0]
    tr = {"run": "r", "role": "pcpo", "cell": "all", "kl_ref": [0.1, 0.3], "reward_smoothed": [0.5, 0.6]}
    assert kl_ref_png([tr]).startswith(b"\x89PNG")
    assert kl_ref_png([{**tr, "kl_ref": [float("nan")] * 2}]) is None


# -- commands: --model base, prompt sets ---------------------------------------------------------------


def test_model_base_is_refused_with_the_fix(cli, tmp_path):
    res = cli("generate", "--model", "base", "--prompts", "toy", "--seeds", "1", "--out", tmp_path / "s")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "toy" in lines[0] and "sd1:" in lines[0]


def test_pickapic_sfw_follows_flowgrpos_recipe(tmp_path, monkeypatch):
    import pandas as pd

    from pcpo_eval.prompts import DATASETS, load_dataset_prompts

    ds = DATASETS["pickapic_sfw"]
    assert ds.obtain.startswith("hf download CarperAI/pickapic_v1_no_images_training_sfw")
    caps = ["a cat on a mat in the sun", "short caption", "a cat on a mat in the sun", "one two three four five six"]
    f = tmp_path / "pickapic_training_sfw.parquet"
    pd.DataFrame({"caption": caps}).to_parquet(f)
    monkeypatch.setenv(ds.env_var, str(f))
    assert list(load_dataset_prompts("pickapic_sfw").prompts) == [caps[0], caps[3]]


def test_prompt_fetch_commands_name_hf_not_huggingface_cli():
    from pcpo_eval.prompts import DATASETS

    assert all("huggingface-cli" not in d.obtain for d in DATASETS.values())
    assert any(d.obtain.startswith("hf download ") for d in DATASETS.values())


# -- missing weights: one error, one item per line, printed once -----------------------------------------


def test_train_lists_every_missing_item_once_on_one_line(cli, tmp_path, monkeypatch):
    """Every missing item in the one error line (``(1) ...; (2) ...``: one item per line broke the contract)."""
    from pcpo_eval.testing import isolate_weight_caches

    isolate_weight_caches(tmp_path, monkeypatch)
    monkeypatch.setenv("PCPO_PROMPTS_DIR", str(tmp_path / "no_prompts"))
    res = cli("train", ROOT / "train" / "configs" / "setup5_dancegrpo_sd14.yaml", "--out", tmp_path / "r")
    assert res.returncode == 2 and not (tmp_path / "r").exists()
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: training config") and "item(s) not found" in lines[0]
    items = re.split(r"; \(\d+\) |: \(1\) ", lines[0])[1:]
    assert len(items) >= 3  # prompts, HPS weights, SD-1.4
    assert any("hpdv2" in it for it in items) and any("hps" in it.lower() for it in items)
    assert len(set(items)) == len(items)


def test_errors_print_once_under_a_launcher(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    res = cli("generate", "--model", "base", "--prompts", "toy", "--seeds", "1", "--out", tmp_path / "s")
    assert res.returncode == 2 and res.stderr.strip() == ""  # rank 1 exits 2 silently; rank 0 prints


@pytest.mark.parametrize("setup", sorted((ROOT / "train" / "configs").glob("setup*dancegrpo*.yaml")), ids=lambda p: p.stem)
def test_dancegrpo_setups_never_train_the_last_step(setup):
    """DanceGRPO trains the steps before the last (train_grpo_sd.py: ``timesteps[:, :-1]``, 49 of 50; its FLUX
    trainer likewise): setups 5 and 7 trained all 50, where PCPO's residual weight of the extra step (sigma
    0.02) is 48.6 against a mean of 3.56 over the others."""
    assert load_config(setup).train_last_step is False
