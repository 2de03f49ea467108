"""Prompt sets: DDPO built-ins against ddpo-pytorch's rules, user files, id checks, CLIP filter."""

from __future__ import annotations

import pandas as pd
import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.prompts import (
    ACTIVITIES,
    CLIP_MAX_TOKENS,
    REGISTRY,
    SIMPLE_ANIMALS,
    approx_clip_token_count,
    clip_token_counter,
    load_prompts,
    nouns_activities,
    simple_animals,
)


def test_simple_animals_matches_ddpo_asset():
    ps = simple_animals()
    assert len(ps) == 45 and len(set(ps.prompts)) == 45
    assert ps.prompt_ids == tuple(range(45))
    # first and last lines of ddpo_pytorch/assets/simple_animals.txt
    assert ps.prompts[:5] == ("cat", "dog", "horse", "monkey", "rabbit")
    assert ps.prompts[-3:] == ("gorilla", "hedgehog", "kangaroo")


def test_nouns_activities_matches_ddpo_prompt_fn():
    """ddpo-pytorch: f"{inflect.engine().a(noun)} {activity}", enumerated animal-major."""
    inflect = pytest.importorskip("inflect")
    ie = inflect.engine()
    expected = [f"{ie.a(a)} {act}" for a in SIMPLE_ANIMALS for act in ACTIVITIES]
    ps = nouns_activities()
    assert list(ps.prompts) == expected
    assert len(ps) == 135 and ps.prompt_ids == tuple(range(135))
    assert ps.prompts[60] == "an ant washing the dishes"
    assert ACTIVITIES == ("washing the dishes", "riding a bike", "playing chess")


def test_toy_prompts_follow_toy_world():
    from pcpo_eval.toy import data
    ps = load_prompts("toy")
    assert list(ps.prompts) == list(data.TOY_PROMPTS) and len(ps) == 45


def test_registry_names():
    assert set(REGISTRY) == {"simple_animals", "nouns_activities", "toy"}
    with pytest.raises(UserError, match="simple_animals"):
        load_prompts("no_such_set")


def test_txt_file_skips_blank_lines(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a red cube\n\n  a blue ball  \n")
    ps = load_prompts(f)
    assert ps.prompts == ("a red cube", "a blue ball") and ps.prompt_ids == (0, 1)


def test_csv_and_parquet_with_ids(tmp_path):
    df = pd.DataFrame({"prompt_id": [7, 3, 11], "prompt": ["x", "y", "z"]})
    df.to_csv(tmp_path / "p.csv", index=False)
    df.to_parquet(tmp_path / "p.parquet", index=False)
    for name in ("p.csv", "p.parquet"):
        ps = load_prompts(tmp_path / name)
        assert ps.prompt_ids == (7, 3, 11) and ps.prompts == ("x", "y", "z")
    pd.DataFrame({"prompt": ["u", "v"]}).to_csv(tmp_path / "noid.csv", index=False)
    assert load_prompts(tmp_path / "noid.csv").prompt_ids == (0, 1)


@pytest.mark.parametrize(
    "content, match",
    [
        ("prompt_id,prompt\n1,a\n1,b\n", "duplicate prompt_id 1"),
        ("prompt_id,prompt\n", "no prompts"),
        ("", "no prompts"),
        ("text\nhello\n", "no 'prompt' column"),
        ("prompt_id,prompt\n1.5,a\n", "whole number"),
        ("prompt_id,prompt\n1,a\n2,b\nx,c\n", "data row 3 has prompt_id 'x'"),
        ("prompt_id,prompt\n1,a\n,b\n", "data row 2 has no prompt_id"),
        ("prompt_id,prompt\n-1,a\n", "out of range"),
        ("prompt_id,prompt\n1,\n", "empty prompt"),
        ('prompt_id,prompt\n1,a\n2,"   "\n', "data row 2 has an empty prompt"),  # blank: was rendered as a prompt
    ],
)
def test_bad_csv_files_are_one_line_user_errors(tmp_path, content, match):
    f = tmp_path / "bad.csv"
    f.write_text(content)
    with pytest.raises(UserError, match=match) as info:
        load_prompts(f)
    assert "\n" not in str(info.value)


def test_empty_txt_and_missing_file(tmp_path):
    (tmp_path / "e.txt").write_text("\n \n")
    with pytest.raises(UserError, match="no prompts"):
        load_prompts(tmp_path / "e.txt")
    with pytest.raises(UserError, match="not found"):
        load_prompts(tmp_path / "missing.txt")


def test_clip_counter_exact_on_known_prompts():
    count, name = clip_token_counter()
    assert name == "open_clip-bpe"
    # OpenAI CLIP BPE: every common word below is one token; "," and "!" are separate pieces.
    assert count("a photo of a cat") == 2 + 5
    assert count("a photo of a cat, please!") == 2 + 8


def test_filter_boundary_at_77_tokens_and_reports_drops(tmp_path):
    fits = " ".join(["cat"] * 75)  # 75 + start + end = 77 tokens
    too_long = " ".join(["cat"] * 76)  # 78 tokens
    f = tmp_path / "p.txt"
    f.write_text(f"short one\n{fits}\n{too_long}\nanother\n")
    ps = load_prompts(f, max_tokens=CLIP_MAX_TOKENS)
    assert ps.prompts == ("short one", fits, "another")
    assert ps.prompt_ids == (0, 1, 3)  # ids keep their file rows
    assert ps.n_dropped == 1 and ps.token_counter == "open_clip-bpe"
    limited = load_prompts(f, max_tokens=CLIP_MAX_TOKENS, limit=2)
    assert limited.prompt_ids == (0, 1) and limited.n_dropped == 1 and limited.n_limited == 1


@pytest.mark.parametrize(
    "text",
    ["a photo of a cat", "Ünïcødé —— 3.14 stuff", "hello_world it's 2024!!", "antidisestablishmentarianism"],
)
def test_approx_counter_is_a_lower_bound(text):
    count, _ = clip_token_counter()
    assert approx_clip_token_count(text) <= count(text)


def test_everything_filtered_is_an_error(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text(" ".join(["cat"] * 100) + "\n")
    with pytest.raises(UserError, match="exceed"):
        load_prompts(f, max_tokens=77)


# ---------------------------------------------------------------------------------------------
# Public datasets: tiny synthetic files in the shapes of the real ones; nothing is downloaded
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def prompt_caches(tmp_path, monkeypatch):
    """Every prompt / HF cache root in an empty temp dir, every PCPO_PROMPTS_* variable unset."""
    import pcpo_eval.prompts as P

    for ds in P.DATASETS.values():
        monkeypatch.delenv(ds.env_var, raising=False)
    for var in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("PCPO_PROMPTS_DIR", str(tmp_path / "pcpo"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def _hub_dataset(root, repo, files: dict, rev="r1"):
    base = root / "hf" / "hub" / ("datasets--" + repo.replace("/", "--"))
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_text(text)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(rev)
    return snap


def test_every_dataset_entry_is_complete():
    from pcpo_eval.prompts import DATASETS, REGISTRY

    assert set(DATASETS) >= {"hpdv2", "hpdv2_test", "pickapic_train", "pickapic_test", "pickapic_sfw",
                             "ocr_train", "ocr_test", "mjhq30k", "coco2017_val", "drawbench"}
    assert not set(DATASETS) & set(REGISTRY)
    for ds in DATASETS.values():
        assert ds.env_var == "PCPO_PROMPTS_" + ds.name.upper()
        assert ds.files and ds.obtain and ds.paper and ds.description
        assert "l." in ds.paper or "not used" in ds.paper, ds.name  # cites the .tex line
        if ds.hf_repo:
            assert f"hf download {ds.hf_repo}" in ds.obtain and "--repo-type dataset" in ds.obtain
    assert DATASETS["pickapic_test"].paper_count == 2048
    assert (DATASETS["mjhq30k"].max_tokens, DATASETS["mjhq30k"].limit) == (77, 5000)
    assert DATASETS["coco2017_val"].paper_count == 5000


def test_absent_dataset_is_one_line_naming_the_variable(prompt_caches):
    from pcpo_eval.prompts import load_prompts

    for name in ("mjhq30k", "hpdv2", "pickapic_sfw"):
        with pytest.raises(UserError) as exc:
            load_prompts(name)
        msg = str(exc.value)
        assert "\n" not in msg and f"PCPO_PROMPTS_{name.upper()}" in msg and "not found" in msg
    with pytest.raises(UserError, match="hf download playgroundai/MJHQ-30K meta_data.json"):
        load_prompts("mjhq30k")


def test_bad_env_var_is_an_error_not_a_fallback(prompt_caches, monkeypatch):
    from pcpo_eval.prompts import load_prompts

    good = prompt_caches / "pcpo" / "ocr_test"
    good.mkdir(parents=True)
    (good / "test.txt").write_text('a sign that says "hi"\n')
    monkeypatch.setenv("PCPO_PROMPTS_OCR_TEST", str(prompt_caches / "nowhere"))
    with pytest.raises(UserError, match="PCPO_PROMPTS_OCR_TEST .*nowhere.*fix it"):
        load_prompts("ocr_test")
    monkeypatch.delenv("PCPO_PROMPTS_OCR_TEST")
    assert load_prompts("ocr_test").prompts == ('a sign that says "hi"',)


def test_mjhq_from_hub_snapshot_applies_paper_filter(prompt_caches):
    import json

    from pcpo_eval.prompts import load_prompts

    long = " ".join(["word"] * 80)  # > 77 CLIP tokens with either counter
    meta = {f"img{i:03d}": {"category": "people", "prompt": long if i % 3 == 0 else f"prompt {i}"} for i in range(9)}
    _hub_dataset(prompt_caches, "playgroundai/MJHQ-30K", {"meta_data.json": json.dumps(meta)})
    ps = load_prompts("mjhq30k")
    assert ps.prompts == tuple(f"prompt {i}" for i in range(9) if i % 3)
    assert ps.prompt_ids == (1, 2, 4, 5, 7, 8) and ps.n_dropped == 3
    assert len(load_prompts("mjhq30k", limit=2)) == 2
    assert len(load_prompts("mjhq30k", max_tokens=1000)) == 9  # explicit arguments override the paper's


def test_coco_first_caption_per_image_in_image_order(prompt_caches):
    import json

    from pcpo_eval.prompts import load_prompts

    doc = {
        "images": [{"id": 139}, {"id": 285}, {"id": 632}],
        "annotations": [
            {"image_id": 285, "id": 1, "caption": "A big bear.  "},
            {"image_id": 139, "id": 2, "caption": "A room with\na TV."},
            {"image_id": 285, "id": 3, "caption": "second caption of 285"},
            {"image_id": 632, "id": 4, "caption": "A bedroom."},
        ],
    }
    folder = prompt_caches / "pcpo" / "coco2017_val" / "annotations"
    folder.mkdir(parents=True)
    (folder / "captions_val2017.json").write_text(json.dumps(doc))
    ps = load_prompts("coco2017_val")
    assert ps.prompts == ("A room with a TV.", "A big bear.", "A bedroom.") and ps.prompt_ids == (0, 1, 2)


def test_hpdv2_test_json_deduplicates_and_txt_sets(prompt_caches, monkeypatch):
    import json

    from pcpo_eval.prompts import load_prompts

    rows = [{"prompt": "a cat", "image_path": ["0.jpg"]}, {"prompt": "a dog"}, {"prompt": "a cat"}]
    _hub_dataset(prompt_caches, "ymhao/HPDv2", {"test.json": json.dumps(rows)})
    assert load_prompts("hpdv2_test").prompts == ("a cat", "a dog")
    f = prompt_caches / "dance_prompts.txt"
    f.write_text("first prompt\n\n second  prompt \n")
    monkeypatch.setenv("PCPO_PROMPTS_HPDV2", str(f))
    assert load_prompts("hpdv2").prompts == ("first prompt", "second prompt")


def test_drawbench_parquet_csv_and_arrow_cache(prompt_caches, monkeypatch):
    import pandas as pd
    import pyarrow as pa

    from pcpo_eval.prompts import load_prompts

    rows = pd.DataFrame({"Prompts": ["A red colored car.", "A black colored car."], "Category": ["Colors"] * 2})
    # datasets-library Arrow cache: <HF_DATASETS_CACHE>/<org>___<name>/<config>/<version>/<hash>/<name>-train.arrow
    arrow_dir = prompt_caches / "dcache" / "sayakpaul___drawbench" / "default" / "0.0.0" / "abc"
    arrow_dir.mkdir(parents=True)
    table = pa.Table.from_pandas(rows, preserve_index=False)
    with pa.OSFile(str(arrow_dir / "drawbench-train.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(prompt_caches / "dcache"))
    assert load_prompts("drawbench").prompts == ("A red colored car.", "A black colored car.")
    # the hub snapshot (parquet) comes before the Arrow cache
    snap = _hub_dataset(prompt_caches, "sayakpaul/drawbench", {})
    (snap / "data").mkdir()
    rows.iloc[::-1].to_parquet(snap / "data" / "train-00000-of-00001.parquet")
    assert load_prompts("drawbench").prompts[0] == "A black colored car."
    # a CSV without a prompt column is one line
    bad = prompt_caches / "bad.csv"
    bad.write_text("x,y\n1,2\n")
    monkeypatch.setenv("PCPO_PROMPTS_DRAWBENCH", str(bad))
    with pytest.raises(UserError, match="none of the columns Prompts"):
        load_prompts("drawbench")


def test_prompts_command_lists_every_set(prompt_caches):
    import json

    import typer
    from typer.testing import CliRunner

    from pcpo_eval.generate.commands import register
    from pcpo_eval.prompts import DATASETS, REGISTRY

    folder = prompt_caches / "pcpo" / "pickapic_test"
    folder.mkdir(parents=True)
    (folder / "test.txt").write_text("a\nb\nc\n")
    app = typer.Typer()
    register(app)
    res = CliRunner().invoke(app, ["prompts", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)["prompt_sets"]}
    assert set(rows) == set(REGISTRY) | set(DATASETS)
    assert rows["pickapic_test"]["found"] and rows["pickapic_test"]["n_prompts"] == 3
    assert rows["pickapic_test"]["paper_count"] == 2048
    assert not rows["mjhq30k"]["found"] and rows["mjhq30k"]["n_prompts"] is None
    assert any("datasets--playgroundai--MJHQ-30K" in s for s in rows["mjhq30k"]["searched"])
    table = CliRunner().invoke(app, ["prompts"]).output
    assert "[found  ] pickapic_test    3 prompts; paper used 2048" in table
    assert "obtain: hf download playgroundai/MJHQ-30K meta_data.json --repo-type dataset" in table
    assert "[found  ] simple_animals   45 prompts" in table
    bad = CliRunner().invoke(app, ["prompts", "nope"])
    assert bad.exit_code != 0 and "unknown prompt set 'nope'" in str(bad.exception)
