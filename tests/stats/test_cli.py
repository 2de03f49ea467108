"""``pcpo-eval lmm``: output and one-line errors (exit code 2) for each kind of bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest


@pytest.fixture(scope="module")
def scores(tmp_path_factory):
    rng = np.random.default_rng(0)
    rows = []
    peff = rng.normal(0, 2, 10)
    for p in range(10):
        for alg in ("base", "pcpo"):
            for batch in (128, 256):
                rows.append((p, alg, batch, 50 + peff[p] - 3 * (alg == "pcpo") + rng.normal(0, 1)))
    df = pd.DataFrame(rows, columns=["prompt", "algorithm", "batch", "fid"])
    df["batch"] = df["batch"].astype(str)
    df["lpips"] = 0.5 + 0.01 * (df.algorithm == "pcpo") + rng.normal(0, 0.01, len(df))
    d = tmp_path_factory.mktemp("lmm")
    df.to_csv(d / "scores.csv", index=False)
    df.to_parquet(d / "scores.parquet")
    return d


def test_lmm_json(scores, cli):
    r = cli(
        "lmm",
        scores / "scores.parquet",
        "--formula",
        "fid ~ algorithm * batch",
        "--group",
        "prompt",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["fixed"]) == {
        "(Intercept)",
        "algorithm[T.pcpo]",
        "batch[T.256]",
        "algorithm[T.pcpo]:batch[T.256]",
    }
    assert d["coding"] == "treatment" and d["reference_levels"] == {"algorithm": "base", "batch": "128"}
    assert d["converged"] is True and d["n_groups"] == {"prompt": 10}
    assert d["fixed"]["algorithm[T.pcpo]"]["estimate"] < 0


def test_lmm_text_sum_coding_qq_and_out(scores, cli, tmp_path):
    qq, out = tmp_path / "qq.png", tmp_path / "res.json"
    r = cli(
        "lmm",
        scores / "scores.csv",
        "--formula",
        "fid ~ algorithm * batch",
        "--group",
        "prompt",
        "--coding",
        "sum",
        "--qq",
        qq,
        "--output",
        out,
    )
    assert r.returncode == 0, r.stderr
    assert "Coding: sum" in r.stdout and "Satterthwaite" in r.stdout
    assert qq.is_file() and json.loads(out.read_text())["coding"] == "sum"


def test_lmm_several_responses_adjusted(scores, cli):
    r = cli(
        "lmm",
        scores / "scores.csv",
        "--formula",
        "y ~ algorithm",
        "--group",
        "prompt",
        "--response",
        "fid",
        "--response",
        "lpips",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["metrics"]) == {"fid", "lpips"}
    a = d["adjusted"]["fid"]["algorithm[T.pcpo]"]
    assert a["p"] <= a["p_bh"] <= a["p_holm"] <= 1


def test_lmm_crossed_groups(scores, cli):
    r = cli(
        "lmm",
        scores / "scores.csv",
        "--formula",
        "fid ~ algorithm",
        "--group",
        "prompt",
        "--group",
        "batch",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n_groups"] == {"prompt": 10, "batch": 2}


@pytest.mark.parametrize(
    ("mutate", "args", "message"),
    [
        (
            None,
            ["--formula", "fid ~ algorithm * nosuch", "--group", "prompt"],
            "column 'nosuch' that is not in the data",
        ),
        (
            None,
            ["--formula", "missing ~ algorithm", "--group", "prompt"],
            "column 'missing' that is not in the data",
        ),
        (None, ["--formula", "fid ~ algorithm", "--group", "nosuch"], "grouping column 'nosuch'"),
        (lambda d: d.assign(fid=3.0), ["--formula", "fid ~ algorithm", "--group", "prompt"], "is constant"),
        (lambda d: d.assign(fid=d.fid * 1e300), ["--formula", "fid ~ algorithm", "--group", "prompt"],
         "whose squares overflow float64; rescale it"),
        (
            lambda d: d.assign(prompt=1),
            ["--formula", "fid ~ algorithm", "--group", "prompt"],
            "only one level",
        ),
        (
            lambda d: d.assign(fid=d.fid.where(d.index != 3)),
            ["--formula", "fid ~ algorithm", "--group", "prompt"],
            "column 'fid' has 1 missing",
        ),
        (
            lambda d: d.assign(algorithm=d.algorithm.where(d.index != 5)),
            ["--formula", "fid ~ algorithm", "--group", "prompt"],
            "column 'algorithm' has 1 missing",
        ),
        (
            lambda d: d.assign(prompt=d.prompt.where(d.index != 5)),
            ["--formula", "fid ~ algorithm", "--group", "prompt"],
            "column 'prompt' has 1 missing",
        ),
        (
            None,
            ["--formula", "fid ~ algorithm", "--group", "prompt", "--coding", "helmert"],
            "unknown coding 'helmert'",
        ),
        (None, ["--formula", "fid algorithm", "--group", "prompt"], "has no '~'"),
        (None, ["--formula", "algorithm ~ batch", "--group", "prompt"], "is not numeric"),
    ],
)
def test_lmm_bad_input(scores, cli, tmp_path, mutate, args, message):
    df = pd.read_csv(scores / "scores.csv")
    if mutate is not None:
        df = mutate(df)
    path = tmp_path / "d.csv"
    df.to_csv(path, index=False)
    r = cli("lmm", path, *args)
    assert r.returncode == 2, r.stdout
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert message in r.stderr


@pytest.mark.parametrize("formula", [
    "fid ~ algorithm + __import__('os').system('touch {marker}')",
    "fid ~ algorithm + exec(\"open('{marker}', 'w')\")",
    "fid ~ algorithm.__class__",
])
def test_lmm_formula_runs_no_code(scores, cli, tmp_path, formula):
    """patsy evaluates formula terms as Python: a formula (e.g. in a shared study spec) must not run
    code. Only data columns, arithmetic and the listed functions pass."""
    marker = tmp_path / "pwned"
    r = cli("lmm", scores / "scores.csv", "--formula", formula.format(marker=marker), "--group", "prompt")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert not marker.exists()


def test_lmm_formula_keeps_its_functions(scores, cli):
    r = cli("lmm", scores / "scores.csv", "--formula", "fid ~ C(algorithm) + np.sqrt(np.abs(lpips)) + I(lpips ** 2)",
            "--group", "prompt", "--json")
    assert r.returncode == 0, r.stderr


def test_lmm_bad_file(cli, tmp_path):
    r = cli("lmm", tmp_path / "x.csv", "--formula", "y ~ x", "--group", "g")
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "x.txt").write_text("a")
    r = cli("lmm", tmp_path / "x.txt", "--formula", "y ~ x", "--group", "g")
    assert r.returncode == 2 and ".csv or .parquet" in r.stderr
