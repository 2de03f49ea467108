"""The human study on a real toy study: design -> raters -> the real page -> analysis -> report section.

A tiny toy study (DDPO vs PCPO, 1 seed, 4 epochs) is trained once per module; the design brackets
PCPO's reward-matched checkpoint with DDPO's checkpoints, renders them, and the rest runs through
the CLI (``pcpo-eval human ...``) and the app (FastAPI TestClient).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from pcpo_eval.human import PAIR_COLUMNS, HumanLayout
from tests.support.human import shown_pair

ROOT = Path(__file__).resolve().parents[2]
DESIGN = {"checkpoints": "bracket", "seed": 0, "prompts": "toy", "max_prompts": 6, "seeds": 3, "identical": 2,
          "degraded": 2, "per_rater": 12, "rng_seed": 7, "batch_size": 32}


@pytest.fixture(scope="module")
def study(tmp_path_factory, one_thread) -> Path:
    """A finished tiny toy study (every stage), trained once for this module."""
    from pcpo_eval.study.runner import run_study

    tmp = tmp_path_factory.mktemp("human_study")
    d = yaml.safe_load((ROOT / "analysis" / "toy_study.yaml").read_text())
    d["train"]["overrides"] |= {"epochs": 4, "checkpoint_every": 1, "sample_batches_per_epoch": 1}
    d |= {"name": "tiny_human", "seeds": [0], "targets": [0.5], "window": 1, "metrics": ["fd_toy", "lpips_toy"],
          "overall_only": ["fd_toy"], "grid": {"prompts": 2, "seeds": 2}}
    d.pop("parallel")
    d["eval"] |= {"max_prompts": 4, "seeds": 2}
    d["select_target"] = 0.0  # every run's first checkpoint: PCPO@1's reward is then bracketed by DDPO's
    spec = tmp / "spec.yaml"
    spec.write_text(yaml.safe_dump(d))
    run_study(spec, tmp / "study", log=lambda s: None)
    return tmp / "study"


@pytest.fixture(scope="module")
def human(study, tmp_path_factory) -> Path:
    from pcpo_eval.human.design import make_design, parse_design_spec

    out = tmp_path_factory.mktemp("human") / "h"
    make_design(study, out, parse_design_spec(DESIGN), log=lambda s: None)
    return out


def test_design_brackets_the_matched_reward_and_hides_the_methods(study, human):
    design = json.loads((human / "design.json").read_text())
    pairs = pd.read_parquet(human / "pairs.parquet")
    assert tuple(pairs.columns) == PAIR_COLUMNS
    sel = json.loads((study / "selection.json").read_text())
    ref = next(r for r in sel["runs"] if r["role"] == "pcpo")
    note = design["selection"]
    assert note["reference"]["reward"] == pytest.approx(ref["reward"])
    below, above = note["below"], note["above"]
    assert below is None or below["reward"] < ref["reward"]
    assert above is None or above["reward"] >= ref["reward"]
    assert above is None or below is None or below["epoch"] < above["epoch"]
    # every path in design.json is relative to the design folder (the folder can move)
    assert not Path(design["study"]).is_absolute() and (human / design["study"]).resolve() == study.resolve()
    assert all(not Path(c["model"]).is_absolute() for c in design["checkpoints"])
    n_comp = len(design["comparisons"])
    assert 1 <= n_comp <= 2
    main = pairs[pairs["kind"] == "main"]
    assert len(main) == n_comp * 6 * 3 and (pairs["kind"] != "main").sum() == 4
    # sides are randomised: the PCPO checkpoint is on the left in some pairs and on the right in others
    pcpo = f"PCPO@{ref['epoch']}"
    assert 0 < (main["left_method"] == pcpo).sum() < len(main)
    # every shown image exists, is a metadata-free PNG under a 16-hex name, and a pair's two images
    # were rendered from the same prompt and seed (the same initial noise)
    for tok in pd.concat([pairs["left_image"], pairs["right_image"]]).unique():
        assert re.fullmatch(r"[0-9a-f]{16}", tok)
        with Image.open(HumanLayout(human).image(tok)) as im:
            assert not getattr(im, "text", {}) and not {k for k in im.info if k not in ("dpi", "gamma")}
    ident = pairs[pairs["kind"] == "identical"].iloc[0]
    a, b = (np.asarray(Image.open(HumanLayout(human).image(ident[s]))) for s in ("left_image", "right_image"))
    assert ident["left_image"] != ident["right_image"] and np.array_equal(a, b)
    deg = pairs[pairs["kind"] == "degraded"].iloc[0]
    assert deg["expected"] in ("left", "right")


def test_design_renders_each_comparison_on_its_own_seeds(study, human):
    """The default design (comparison_seeds: distinct): comparison k on 3 seeds of its own, drawn from the
    blinding secret above every seed the study uses, for both its checkpoints; PCPO's set holds every
    comparison's seeds, and no image file of a main pair is in two comparisons (by token and by bytes)."""
    import hashlib

    from pcpo_eval.human.design import SECRET_SEED_FLOOR, comparison_seeds, seed_text
    from pcpo_eval.imageset import MANIFEST_FILE

    design = json.loads((human / "design.json").read_text())
    pairs = pd.read_parquet(human / "pairs.parquet")
    main = pairs[pairs["kind"] == "main"]
    assert design["comparison_seeds"] == "distinct" and design["seed_draw"] == "secret"
    drawn = comparison_seeds(len(design["comparisons"]), 3, "distinct", bytes.fromhex(design["blinding_secret"]))
    for k, comp in enumerate(design["comparisons"]):
        assert design["comparison_seed_ranges"][comp] == seed_text(drawn[k])
        assert set(main.loc[main["comparison"] == comp, "seed"]) == set(drawn[k])
        assert min(drawn[k]) >= SECRET_SEED_FLOOR
    assert len({s for ss in drawn for s in ss}) == 3 * len(drawn)
    for c in design["checkpoints"]:  # a set holds the seeds of the comparisons its checkpoint is in
        seeds = sorted(set(pd.read_parquet(human / "sets" / c["label"].replace("@", "_") / MANIFEST_FILE)["seed"]))
        ks = [k for k, comp in enumerate(design["comparisons"]) if c["label"] in comp.split(" vs ")]
        assert seeds == sorted(s for k in ks for s in drawn[k]), (c["label"], seeds)
        assert design["checkpoint_seed_ranges"][c["label"]] == seed_text(seeds)
    assert pd.concat([main["left_image"], main["right_image"]]).is_unique
    comps: dict[str, set] = {}
    for side in ("left", "right"):
        for tok, comp in zip(main[f"{side}_image"], main["comparison"], strict=True):
            digest = hashlib.sha256(HumanLayout(human).image(tok).read_bytes()).hexdigest()
            comps.setdefault(digest, set()).add(comp)
    assert all(len(v) == 1 for v in comps.values())


def _pixel_digests_of_pngs(data: list[bytes]) -> set[str]:
    import hashlib
    import io

    return {hashlib.sha256(np.asarray(Image.open(io.BytesIO(b)).convert("RGB")).tobytes()).hexdigest() for b in data}


def test_no_shown_image_is_in_the_study_folder_or_its_report(study, human):
    """Blinding: the shown images are rendered on secret seeds, so none of them (by pixels) is one of the
    study's own images, which sit under their run's name in its eval sets and under "PCPO seed 0 (E10)"
    in the report's grid (the same sampler, prompts and seeds 0 ..: before, 36 shown images were in the
    report and 80 of 160 in the eval sets), and nothing in the design's public settings gives the seeds."""
    import base64
    import re as _re

    from pcpo_eval.human.design import SECRET_SEED_FLOOR

    pairs = pd.read_parquet(human / "pairs.parquet")
    shown = _pixel_digests_of_pngs([HumanLayout(human).image(t).read_bytes()
                                    for t in {*pairs["left_image"], *pairs["right_image"]}])
    study_pngs = [p.read_bytes() for p in study.rglob("*.png")]
    report = (study / "report.html").read_text()
    embedded = [base64.b64decode(m) for m in _re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", report)]
    assert len(study_pngs) > 20 and embedded  # the eval sets and the grid are there to compare with
    assert not shown & _pixel_digests_of_pngs(study_pngs + embedded)
    assert pairs["seed"].min() >= SECRET_SEED_FLOOR


def test_a_designs_secrets_are_the_organisers_only(study, human, tmp_path):
    """design.json (the blinding secret), pairs.parquet (the unblinding) and the folder (sets/ named after
    the checkpoints) are the owner's only, whatever the umask; so are a bundle's derived secrets, a new
    SQLite database (raters' tokens) and an export (raters' names). `human serve` warns about older files."""
    import os
    import stat

    from pcpo_eval.human.app import readable_secrets
    from pcpo_eval.human.bundle import make_bundle
    from pcpo_eval.human.db import export_parquet, get_engine, upgrade

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    lay = HumanLayout(human)
    assert mode(lay.design) == mode(lay.pairs) == 0o600 and mode(lay.root) == 0o700
    assert not lay.pending_secret.exists()
    old = os.umask(0o022)
    try:
        make_bundle(human, tmp_path / "serve", log=lambda s: None)
        url = f"sqlite:///{tmp_path / 'new.db'}"
        get_engine(url)
        upgrade(url)
        export_parquet(url, tmp_path / "responses.parquet")
    finally:
        os.umask(old)
    assert mode(HumanLayout(tmp_path / "serve").bundle) == 0o600
    assert mode(tmp_path / "new.db") == 0o600 and mode(tmp_path / "responses.parquet") == 0o600
    assert readable_secrets(lay) == []
    lay.design.chmod(0o644)
    try:
        (warning,) = readable_secrets(lay)
        assert warning.startswith("warning: ") and f"chmod 600 {lay.design}" in warning
    finally:
        lay.design.chmod(0o600)


def test_an_interrupted_design_resumes_on_its_secret_seeds(study, tmp_path, monkeypatch):
    """The secret is written (0600) before anything renders, so a design interrupted after rendering resumes
    on the same seeds and keeps its images; sets left without that secret (an earlier version's, on public
    seeds) are refused by name."""
    import pcpo_eval.human.design as design_mod
    from pcpo_eval.errors import UserError

    out = tmp_path / "h"
    spec = design_mod.parse_design_spec(DESIGN | {"max_prompts": 2, "seeds": 2})
    real = design_mod.build_pairs

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(design_mod, "build_pairs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        design_mod.make_design(study, out, spec, log=lambda s: None)
    lay = HumanLayout(out)
    secret = bytes.fromhex(lay.pending_secret.read_text())
    assert lay.pending_secret.stat().st_mode & 0o777 == 0o600 and not lay.design.exists()
    rendered = {p: p.stat().st_mtime_ns for p in (out / "sets").rglob("*.png")}
    assert rendered
    monkeypatch.setattr(design_mod, "build_pairs", real)
    design = design_mod.make_design(study, out, spec, log=lambda s: None)
    assert design["blinding_secret"] == secret.hex() and not lay.pending_secret.exists()
    assert {p: p.stat().st_mtime_ns for p in (out / "sets").rglob("*.png")} == rendered  # nothing re-rendered
    drawn = design_mod.comparison_seeds(len(design["comparisons"]), 2, "distinct", secret)
    assert set(pd.read_parquet(lay.pairs).query("kind == 'main'")["seed"]) == {s for ss in drawn for s in ss}
    other = tmp_path / "old"
    (other / "sets" / "PCPO_1").mkdir(parents=True)
    with pytest.raises(UserError, match="without its secret"):
        design_mod.make_design(study, other, spec, log=lambda s: None)


def test_a_design_made_before_comparison_seeds_is_kept_or_refused_by_name(study, human, tmp_path):
    """Re-running `human design` on a folder written before the setting (its design.json has no
    comparison_seeds and hashes its settings without it): with `comparison_seeds: shared` it is that
    design (nothing to do); with the new default it is refused, naming the setting."""
    import hashlib

    from pcpo_eval.errors import UserError
    from pcpo_eval.human.design import make_design, parse_design_spec

    old_settings = {"study": str(study.resolve()), **parse_design_spec(DESIGN).to_dict()}
    old_settings.pop("comparison_seeds")
    keep = {k: v for k, v in old_settings.items() if k != "device"}  # the hash as it was computed then
    old_hash = hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]
    design = json.loads((human / "design.json").read_text())
    for key in ("comparison_seeds", "comparison_seed_ranges", "checkpoint_seed_ranges"):
        design.pop(key)
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "design.json").write_text(json.dumps({**design, "settings_hash": old_hash}))
    lines = []
    kept = make_design(study, folder, parse_design_spec(DESIGN | {"comparison_seeds": "shared"}), log=lines.append)
    assert kept["settings_hash"] == old_hash and "nothing to do" in lines[-1]
    with pytest.raises(UserError, match="made before comparison_seeds existed.*comparison_seeds: shared"):
        make_design(study, folder, parse_design_spec(DESIGN), log=lambda s: None)
    assert not (folder / "sets").exists()


def test_a_real_design_serves_from_a_bundle_that_names_no_checkpoint(study, human, tmp_path):
    """`human design` writes designs a bundle can serve (assignment: stratified-keyed); the bundle's
    files hold no checkpoint label, run, comparison, study path or secret, and serve as the design does."""
    import pyarrow.parquet as pq

    from pcpo_eval.human import HumanLayout
    from pcpo_eval.human.bundle import make_bundle
    from pcpo_eval.human.settings import ASSIGNMENT_KEYED, read_settings

    design = json.loads((human / "design.json").read_text())
    assert design["assignment"] == ASSIGNMENT_KEYED
    out = HumanLayout(tmp_path / "serve")
    make_bundle(human, out.root, log=lambda s: None)
    assert read_settings(out) == read_settings(HumanLayout(human))
    pairs = pd.read_parquet(human / "pairs.parquet")
    hidden = {*pairs["left_method"], *pairs["right_method"], *pairs["comparison"],
              *(c["run"] for c in design["checkpoints"] if c.get("run")), design["blinding_secret"], study.name}
    texts = [out.bundle.read_text(), str(pq.read_metadata(out.pairs).metadata),
             " ".join(pd.read_parquet(out.pairs).astype(str).to_numpy().ravel())]
    assert not [h for h in hidden for t in texts if h and h in t]
    assert {p.name for p in out.images.iterdir()} == {f"{t}.png" for t in {*pairs["left_image"], *pairs["right_image"]}}


def test_design_is_deterministic_and_refuses_other_settings(study, human, tmp_path):
    from pcpo_eval.errors import UserError
    from pcpo_eval.human.design import make_design, parse_design_spec

    again, lines = tmp_path / "again", []
    make_design(study, again, parse_design_spec(DESIGN), log=lines.append)
    # progress: a line per rendered checkpoint (k of m) and the image writing
    assert any(line.startswith("[human] rendering checkpoint 1 of ") for line in lines), lines
    assert any(re.match(r"\[human\] images: (\d+) of \1 written", line) for line in lines), lines
    # the same settings in a new folder: a new blinding secret, so other seeds, sides, ids and image names
    # (the design cannot be rebuilt from its settings); the same comparisons, prompts and seed counts
    first, second = pd.read_parquet(human / "pairs.parquet"), pd.read_parquet(again / "pairs.parquet")
    assert not set(first["pair_id"]) & set(second["pair_id"])
    assert not (set(first["left_image"]) | set(first["right_image"])) & (set(second["left_image"]) | set(second["right_image"]))
    main1, main2 = (t[t["kind"] == "main"] for t in (first, second))
    count = ["comparison", "prompt_id"]
    assert main1.groupby(count).size().equals(main2.groupby(count).size())
    assert not set(main1["seed"]) & set(main2["seed"])
    assert not [s for s in set(main2["seed"]) if str(s) in "\n".join(lines)]  # secret seeds stay off the console
    secret = json.loads((again / "design.json").read_text())["blinding_secret"]
    assert len(secret) == 32 and secret != json.loads((human / "design.json").read_text())["blinding_secret"]
    before = (again / "pairs.parquet").read_bytes()
    make_design(study, again, parse_design_spec(DESIGN), log=lambda s: None)  # same settings: nothing to do
    assert (again / "pairs.parquet").read_bytes() == before
    with pytest.raises(UserError, match="already holds another human design"):
        make_design(study, again, parse_design_spec(DESIGN | {"rng_seed": 8}), log=lambda s: None)
    assert (again / "pairs.parquet").read_bytes() == before


def test_named_pairs_and_bad_design_files(study, tmp_path):
    from pcpo_eval.errors import UserError
    from pcpo_eval.human.design import make_design, parse_design_spec

    runs = json.loads((study / "selection.json").read_text())["runs"]
    ddpo = next(r["name"] for r in runs if r["role"] == "baseline")
    ds = parse_design_spec(DESIGN | {"checkpoints": "pairs", "pairs": [[f"{ddpo}@4", "base"]], "max_prompts": 2,
                                     "seeds": 2, "identical": 0, "degraded": 0})
    d = make_design(study, tmp_path / "named", ds, log=lambda s: None)
    assert d["comparisons"] == ["DDPO@4 vs base"] and d["n_pairs"] == 4
    for bad, msg in [({"seeds": 0}, "seeds 0"), ({"colour": 1}, "unknown key 'colour'"),
                     ({"checkpoints": "pairs"}, "pairs: give a non-empty list"),
                     ({"checkpoints": "pairs", "pairs": [["base", "base"]]}, "compared with itself"),
                     ({"per_rater": float("nan")}, "non-finite")]:
        with pytest.raises(UserError, match=msg):
            parse_design_spec(DESIGN | bad)
    with pytest.raises(UserError, match="not in the study"):
        make_design(study, tmp_path / "x", parse_design_spec(DESIGN | {"checkpoints": "pairs",
                                                                        "pairs": [["nope@1", "base"]]}))
    assert not (tmp_path / "x").exists()


def _moved_together_keep_their_examples(study: Path, human: Path, n: int) -> None:
    """The study and design folders copied elsewhere together: the copy's report embeds the copy's example images
    (the paths were absolute: a moved study's report lost them, with no note)."""
    import os
    import shutil

    from pcpo_eval.report.html import write_report

    common = Path(os.path.commonpath([study, human]))
    moved = common / "moved together"
    for folder in (study, human):
        shutil.copytree(folder, moved / folder.relative_to(common))
    html = write_report(moved / study.relative_to(common), figures=False).read_text()
    part = html[html.index('id="human-examples"'):]
    assert part[:part.index("</table>")].count('<img class="pair') == 2 * n
    shutil.rmtree(moved / human.relative_to(common) / "images")
    html = write_report(moved / study.relative_to(common), figures=False).read_text()
    part = html[html.index('id="human-examples"'):]
    assert '<img class="pair' not in part[:part.index("</table>")] and part.count("missing: ") >= 2 * n
    shutil.rmtree(moved)


def test_raters_rate_through_the_app_and_the_analysis_reaches_the_report(study, human, cli):
    from fastapi.testclient import TestClient

    from pcpo_eval.human.app import create_app

    res = cli("human", "raters", human, "--add", "ann", "--add", "ben", "--json", "--base-url", "http://127.0.0.1:8000")
    assert res.returncode == 0, res.stderr
    links = {r["rater"]: r["link"] for r in json.loads(res.stdout)}
    pairs = pd.read_parquet(human / "pairs.parquet").set_index("pair_id")
    with TestClient(create_app(human)) as client:
        for link in links.values():
            path = link.split("8000", 1)[1]
            for _ in range(12):
                page = client.get(path).text
                key = re.search(r'name="key" value="([0-9.a-f]+)"', page)[1]
                pid = shown_pair(client, path.rsplit("/", 1)[1])
                assert pid not in page
                row = pairs.loc[pid]
                choice = row["expected"] or ("left" if row["left_method"].startswith("PCPO") else "right")
                assert client.post(f"{path}/answer", data={"key": key, "choice": choice, "reason": ""},
                                   follow_redirects=False).status_code == 303
            assert "Thank you" in client.get(path).text
    res = cli("human", "export", human)
    assert res.returncode == 0 and "wrote 24 responses" in res.stdout
    # an interim analysis (no --final) shows no labelled image in the study report: raters may still be shown them
    res = cli("human", "analyze", human, "--bootstrap", "0")
    assert res.returncode == 0 and "--final" in res.stdout, res.stderr
    html = (study / "report.html").read_text()
    assert 'id="human-examples-withheld"' in html and 'id="human-examples"' not in html
    interim = json.loads((study / "human.json").read_text())
    assert interim["examples"] == [] and interim["interim"] and interim["looks"]["look"] == 1
    # an interim look is no verdict: every sentence says so, nothing is significant, the report warns
    assert all(c["verdict"].startswith("Interim look 1 (answers so far; not the study's verdict): ")
               and not c["significant"] for c in interim["comparisons"])
    assert 'id="human-looks"' in html and "deciding when to stop from interim looks" in html
    # the analysis of the raters' answers goes into the study's report
    res = cli("human", "analyze", human, "--bootstrap", "50", "--json", "--final")
    assert res.returncode == 0, res.stderr
    analysis = json.loads(res.stdout)
    assert analysis["comparisons"] and analysis["source"] == "database" and "simulated" not in analysis
    # the interim look read the same 24 answers as the final: no look at earlier answers came before it
    assert "interim" not in analysis and analysis["looks"]["interim_before"] == 0
    assert analysis["looks"]["note"] == "no interim analysis of earlier answers was run before this final one"
    assert [x["final"] for x in map(json.loads, (human / "looks.jsonl").read_text().splitlines())] == [False, True]
    # the study's copy is the analysis with raters named by id (shared files) and paths from the study folder
    from pcpo_eval.human.report import deidentified, rebase_examples

    shared = json.loads((study / "human.json").read_text())
    assert shared == rebase_examples(deidentified(analysis), human, study)
    assert any(r["rater"] == "ann" for r in analysis["attention_checks"]["raters"])  # the private analysis names them
    for text in ((study / "human.json").read_text(), (study / "results.json").read_text(),
                 (study / "report.html").read_text()):
        assert '"ann"' not in text and '"ben"' not in text and ">ann<" not in text and ">ben<" not in text
    assert ">rater 1<" in (study / "report.html").read_text()
    assert (human / "analysis.json").stat().st_mode & 0o077 == 0
    assert not any(Path(e["left_image"]).is_absolute() for e in analysis["examples"] + shared["examples"])
    _moved_together_keep_their_examples(study, human, len(analysis["examples"]))
    results = json.loads((study / "results.json").read_text())
    assert results["human"]["comparisons"] == analysis["comparisons"]
    html = (study / "report.html").read_text()
    assert 'id="human"' in html and "Human preference study" in html and "SIMULATED" not in html
    # the human verdict sentences are in the report's first section too
    assert html.index('id="human-verdict"') < html.index('id="spec"')
    # ... scoped to checkpoints of one training run each, the runs named (one seed per arm is no algorithm test)
    scope = html[html.index('id="human-scope"'):html.index('id="spec"')]
    runs = {c["run"] for c in json.loads((human / "design.json").read_text())["checkpoints"] if c.get("run")}
    assert runs and all(r in scope for r in runs) and "not which algorithm trains better" in scope
    assert all(c["verdict"].split(":")[0] in html for c in analysis["comparisons"])
    assert analysis["examples"] and html.count('src="data:image/png;base64,') >= 2 * len(analysis["examples"])
    assert 'id="human-examples-withheld"' not in html
    # each comparison states the win rate it could have detected; the blinding secret is not in the report
    assert "detectable win rate (80% power)" in html and "randomised from the design's private secret" in html
    assert all("detectable at 80% power" in c["verdict"] for c in analysis["comparisons"])
    # one multiplicity family per study: Holm over its comparisons, shown in its own column
    tested = [c for c in analysis["comparisons"] if c["p"] is not None]
    assert "Holm p (study)" in html and all(c["family_size"] == len(tested) for c in analysis["comparisons"])
    # the table shows both tests the verdict's p is the larger of, and that p
    table = html[html.index('id="human-table"'):html.index("</table>", html.index('id="human-table"'))]
    assert "rater-level p (raters)" in table and "verdict p" in table
    for c in tested:
        rl = c["rater_level"]
        assert c["p"] >= rl["p"] and f"({rl['n_raters']})" in table
    secret = json.loads((human / "design.json").read_text())["blinding_secret"]
    assert secret not in html and secret not in json.dumps(results)
    # a rehearsal on simulated raters (planted preference for PCPO) never touches the real results
    sim = human / "sim.parquet"
    pcpo = next(c["label"] for c in json.loads((human / "design.json").read_text())["checkpoints"]
                if c["label"].startswith("PCPO"))
    res = cli("human", "simulate", human, "-o", sim, "--raters", "12", "--per-rater", "25", "--prefer", f"{pcpo}=0.8")
    assert res.returncode == 0 and "SIMULATED" in res.stdout, res.stderr
    assert sim.stat().st_mode & 0o777 == 0o600  # a planted preference's answers follow each pair's side
    real = {p: p.read_bytes() for p in (study / "human.json", study / "results.json", study / "report.html",
                                        human / "analysis.json")}
    res = cli("human", "analyze", human, "--responses", sim, "--bootstrap", "50")
    assert res.returncode == 0, res.stderr
    assert "SIMULATED rehearsal" in res.stdout and all(line.strip().startswith("SIMULATED")
                                                       for line in res.stdout.splitlines()[1:] if line.strip())
    assert {p: p.read_bytes() for p in real} == real
    rehearsal = json.loads((human / "rehearsal" / "analysis.json").read_text())
    assert rehearsal["simulated"] is True and rehearsal["label"].startswith("SIMULATED")
    assert all(c["verdict"].startswith("SIMULATED: ") for c in rehearsal["comparisons"])
    # the study's stats stage keeps the human section when it re-runs
    from pcpo_eval.study.runner import Study
    from pcpo_eval.study.spec import load_spec

    source = json.loads((study / "spec.resolved.json").read_text())["source"]
    Study(load_spec(source), study, log=lambda s: None).run(("stats",))
    assert json.loads((study / "results.json").read_text())["human"]["comparisons"] == analysis["comparisons"]
    # a revoked rater: the answers given before the revocation are kept and the console says so;
    # --exclude-revoked drops them all
    assert cli("human", "raters", human, "--revoke", "ben").returncode == 0
    res = cli("human", "analyze", human, "--bootstrap", "0")  # the study was closed: no interim look now
    assert res.returncode == 2 and "was closed by a --final analysis" in res.stderr, res.stderr
    res = cli("human", "analyze", human, "--bootstrap", "0", "--final")
    assert res.returncode == 0, res.stderr
    assert re.search(r"revoked raters, answers before the revocation kept \(--exclude-revoked drops them\): ben "
                     r"\(revoked 20\S+, 12 answers, 0 dropped\)", res.stdout), res.stdout
    res = cli("human", "analyze", human, "--bootstrap", "0", "--exclude-revoked", "--json", "--final")
    assert res.returncode == 0, res.stderr
    dropped = json.loads(res.stdout)
    assert dropped["counts"]["responses_dropped_revoked"] == 12 and dropped["counts"]["responses_used"] == 12
    assert [r["rater"] for r in dropped["attention_checks"]["raters"]] == ["ann"]


@pytest.mark.parametrize(("args", "msg"), [
    (["human", "design", "{missing}", "--out", "{tmp}/o"], "is not a finished study"),
    (["human", "raters", "{tmp}"], "holds no finished human design"),
    (["human", "serve", "{human}", "--port", "0"], "--port 0"),
    (["human", "analyze", "{human}", "--responses", "{tmp}/none.parquet"], "not found"),
    (["human", "analyze", "{human}", "--responses", "{bad}"], "not a readable Parquet file"),
    (["human", "analyze", "{human}", "--bootstrap", "-1", "--responses", "{bad}"], "--bootstrap -1"),
    (["human", "simulate", "{human}", "-o", "{tmp}/s.parquet", "--prefer", "nobody=0.7"], "--prefer 'nobody=0.7'"),
    (["human", "simulate", "{human}", "-o", "{tmp}/s.parquet", "--prefer", "x=nan"], "--prefer 'x=nan'"),
    (["human", "design", "{missing}", "--out", "{tmp}/o", "--config", "{tmp}/none.yaml"], "not found"),
    (["human", "export", "{human}", "-o", "{tmp}"], "is a folder"),
])
def test_bad_input_is_one_line(cli, human, tmp_path, args, msg):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    before = {p: p.stat().st_mtime_ns for p in human.rglob("*") if p.is_file()}
    fill = {"missing": tmp_path / "nothing", "tmp": tmp_path, "human": human, "bad": bad}
    res = cli(*[a.format(**fill) for a in args])
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], lines
    after = {p: p.stat().st_mtime_ns for p in human.rglob("*") if p.is_file() and p in before}
    assert after == before


def _comparisons(study: Path) -> int:
    from pcpo_eval.human.design import choose_checkpoints, parse_design_spec
    from pcpo_eval.studydir import StudyView

    return len(choose_checkpoints(StudyView.load(study), parse_design_spec(DESIGN))[0])


def test_per_rater_null_on_a_bracket_is_one_error_line_before_rendering(study, cli, tmp_path):
    """F2: with shared seeds every rater seeing every pair would see PCPO's shared image twice: refused,
    nothing written. With distinct seeds (the default) no image is in two comparisons: accepted."""
    if _comparisons(study) < 2:
        pytest.skip("the toy bracket has one comparison here: nothing is shared")
    cfg = tmp_path / "all.yaml"
    cfg.write_text(yaml.safe_dump(DESIGN | {"per_rater": None, "comparison_seeds": "shared"}))
    res = cli("human", "design", study, "--config", cfg, "--out", tmp_path / "all")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: per_rater: null shows every rater every pair") and "own seeds" in lines[0]
    assert "comparison_seeds: distinct" in lines[0]
    assert not (tmp_path / "all" / "sets").exists() and not (tmp_path / "all" / "design.json").exists()
    cfg.write_text(yaml.safe_dump(DESIGN | {"per_rater": None}))
    res = cli("human", "design", study, "--config", cfg, "--out", tmp_path / "distinct")
    assert res.returncode == 0, res.stderr
    design = json.loads((tmp_path / "distinct" / "design.json").read_text())
    assert design["comparison_seeds"] == "distinct" and design["per_rater"] is None


def test_a_per_rater_too_large_or_too_small_is_refused_before_rendering(study, cli, tmp_path):
    """A block with more main pairs than prompts x seeds (with shared seeds: a shared image twice), or one
    the attention checks fill: one error line, and no image set rendered first."""
    if _comparisons(study) < 2:
        pytest.skip("the toy bracket has one comparison here: nothing is shared")
    for name, per_rater, needle in (("big", 10_000, "at most"), ("tiny", 2, "leaves no main pair")):
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump(DESIGN | {"per_rater": per_rater, "comparison_seeds": "shared"}))
        res = cli("human", "design", study, "--config", cfg, "--out", tmp_path / name)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: per_rater") and needle in lines[0], \
            res.stderr
        assert not (tmp_path / name / "sets").exists() and not (tmp_path / name / "design.json").exists()


def test_shipped_design_files_validate():
    from pcpo_eval.human.design import load_design_spec

    files = sorted((ROOT / "analysis" / "human").glob("*.yaml"))
    assert files
    for f in files:
        assert load_design_spec(f).checkpoints in ("bracket", "pairs")


def test_serve_on_a_port_in_use_is_one_line(cli, tmp_path):
    import socket

    from tests.support.human import make_human_dir

    human = make_human_dir(tmp_path / "H", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10).root  # an open study
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        res = cli("human", "serve", human, "--port", port)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: cannot listen on 127.0.0.1:{port}")


def test_a_study_without_recorded_sampler_settings_names_the_fix(study, tmp_path):
    from pcpo_eval.errors import UserError
    from pcpo_eval.human.design import make_design, parse_design_spec

    old = tmp_path / "old_study"
    old.mkdir()
    spec = json.loads((study / "spec.resolved.json").read_text())
    spec.pop("sampling")  # written by pcpo-eval before the sampler settings were recorded
    (old / "spec.resolved.json").write_text(json.dumps(spec))
    (old / "selection.json").write_text((study / "selection.json").read_text())
    with pytest.raises(UserError, match="--stages select"):
        make_design(old, tmp_path / "h", parse_design_spec(DESIGN), log=lambda s: None)
    assert not (tmp_path / "h").exists()
