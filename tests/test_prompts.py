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
        ("prompt_id,prompt\n1.5,a\n", "whole numbers"),
        ("prompt_id,prompt\n-1,a\n", "out of range"),
        ("prompt_id,prompt\n1,\n", "empty prompt"),
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
