"""Reward-matched checkpoint selection and bracketing over run directories (contract layout)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.stats.select import select_checkpoints
from pcpo_eval.stats.speedup import moving_average


def _make_run(root: Path, name: str, rewards, save_every: int = 20, with_log: bool = True) -> Path:
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    epochs = np.arange(1, len(rewards) + 1)
    if with_log:
        pd.DataFrame({"epoch": epochs, "reward_mean": rewards, "clipfrac": 0.0}).to_parquet(
            run / "log.parquet"
        )
    for e in epochs[save_every - 1 :: save_every]:
        d = run / "checkpoints" / f"epoch_{e:04d}"
        d.mkdir()
        (d / "checkpoint.json").write_text(
            json.dumps({"epoch": int(e), "reward_mean": float(rewards[e - 1])})
        )
    return run


def _ramp(n, slope, noise_seed=None):
    r = 5.0 + slope * np.arange(1, n + 1)
    if noise_seed is not None:
        r = r + np.random.default_rng(noise_seed).normal(0, 0.05, n)
    return r


def test_first_reaching_checkpoint_and_gap(tmp_path):
    rewards = _ramp(120, 0.02, noise_seed=0)
    run = _make_run(tmp_path, "base", rewards)
    sel = select_checkpoints([run], target=6.0, window=5)
    c = sel.choices[0]
    sm = moving_average(rewards, 5)
    saved = np.arange(20, 121, 20)
    first = saved[np.argmax(sm[saved - 1] >= 6.0)]
    assert c.reached and c.epoch == first
    assert c.reward == pytest.approx(sm[first - 1])
    assert c.gap == pytest.approx(sm[first - 1] - 6.0)
    assert c.path.endswith(f"epoch_{first:04d}")


def test_nearest_when_not_reached(tmp_path):
    run = _make_run(tmp_path, "slow", _ramp(100, 0.005))
    sel = select_checkpoints([run], target=9.0)
    c = sel.choices[0]
    assert not c.reached and c.epoch == 100 and c.gap < 0


def test_bracketing_like_the_human_study(tmp_path):
    # PCPO reaches its reward by epoch 120; the baseline crosses it between its checkpoints 180 and 240
    pcpo = _make_run(tmp_path, "pcpo", _ramp(240, 0.02), save_every=60)
    base = _make_run(tmp_path, "base", _ramp(300, 0.0115), save_every=60)
    sel = select_checkpoints([base], target=7.3, reference=pcpo)
    assert sel.reference is not None and sel.reference.epoch == 120
    b = sel.brackets[0]
    assert (b.below.epoch, b.above.epoch) == (180, 240)
    assert b.below.reward < sel.reference.reward <= b.above.reward
    md = sel.to_markdown()
    assert "Bracketing" in md and "| 180," in md


def test_checkpoint_json_fallback_without_log(tmp_path):
    run = _make_run(tmp_path, "nolog", _ramp(60, 0.05), with_log=False)
    c = select_checkpoints([run], target=6.5).choices[0]
    assert "unsmoothed" in c.reward_source and c.epoch == 40


def test_cli_select_json(tmp_path, cli):
    a = _make_run(tmp_path, "a", _ramp(100, 0.02))
    b = _make_run(tmp_path, "b", _ramp(100, 0.03))
    r = cli("select", a, b, "--target", "6.2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    # smoothed ramp 5 + s (e - 2) reaches 6.2 at epoch 62 (a) and 42 (b): next saved 80 and 60
    assert [x["epoch"] for x in d["runs"]] == [80, 60]
    assert all(x["reached"] for x in d["runs"])


def test_cli_select_bad_input(tmp_path, cli):
    r = cli("select", tmp_path / "missing", "--target", "1")
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli("select", tmp_path / "empty", "--target", "1")
    assert r.returncode == 2 and "no saved checkpoints" in r.stderr
    run = _make_run(tmp_path, "badlog", _ramp(40, 0.1))
    pd.DataFrame({"epoch": [1, 2], "reward": [1.0, 2.0]}).to_parquet(run / "log.parquet")
    r = cli("select", run, "--target", "1")
    assert r.returncode == 2 and "lacks column 'reward_mean'" in r.stderr


def test_a_target_is_reached_over_full_windows_only_as_the_speedup_counts(tmp_path):
    """A frozen policy (reward noise around 5.0, every epoch saved) whose first epoch happens to cross
    the target is not matched there: its first epochs carry partial averages (shown, never "reached"),
    so with the target 5.1 it is matched at the first full-window epoch that reaches it, or not at all.
    The same rule as time to target (stats.speedup.first_eligible), over 200 noise draws."""
    from pcpo_eval.stats.select import bracket, run_checkpoints
    from pcpo_eval.stats.speedup import epochs_to_target

    early, agree = 0, 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        rewards = 5.0 + rng.normal(0, 0.1, 30)
        rewards[0] = 5.3  # a noisy first epoch above the target
        run = _make_run(tmp_path / str(seed), "frozen", rewards, save_every=1)
        c = select_checkpoints([run], target=5.1, window=5).choices[0]
        early += c.reached and c.epoch < 5
        t = epochs_to_target(rewards, 5.1, window=5, epochs=np.arange(1, 31))
        agree += (c.epoch if c.reached else None) == (None if t.censored else t.epoch)
    assert early == 0 and agree == 200
    cks, source = run_checkpoints(run, 5)
    assert [c.full_window for c in cks[:5]] == [False] * 4 + [True] and "full windows only" in source
    assert cks[0].reward == pytest.approx(5.3)  # the partial average is still what is shown
    b = bracket(cks, 5.25)  # the first epoch's 5.3 does not make epoch 1 the crossing
    assert b.above is None or b.above.epoch >= 5


def test_a_run_shorter_than_the_window_says_why_it_reached_nothing(tmp_path):
    """4 logged epochs, window 5: the nearest checkpoint's partial average is above the target, yet not
    reached; the table and JSON say it is a partial window, and what to do."""
    run = _make_run(tmp_path, "short", np.array([0.70, 0.76, 0.77, 0.78]), save_every=1)
    sel = select_checkpoints([run], target=0.75, window=5)
    c = sel.choices[0]
    assert not c.reached and not c.full_window and c.reward >= 0.75
    md = sel.to_markdown()
    assert "| no (partial window) |" in md and "pass a smaller --window" in md
    assert sel.to_dict()["runs"][0]["full_window"] is False
    again = select_checkpoints([run], target=0.75, window=3).choices[0]
    assert again.reached and again.epoch == 4 and again.full_window  # epoch 3: 0.743, epoch 4: 0.770


def test_a_log_missing_epochs_is_smoothed_over_epochs_not_rows(tmp_path):
    """A log merged by hand after a crash lacks epochs 6-9: the trailing window of epoch 10 holds only its own
    value, so its mean is partial and cannot reach a target (before, it averaged rows 6-10, i.e. epochs 2-10,
    and counted a full window). Without gaps the means are moving_average's, bit for bit."""
    from pcpo_eval.stats.select import run_checkpoints, trailing_by_epoch

    values = np.random.default_rng(3).normal(size=40)
    means, full = trailing_by_epoch(np.arange(1, 41), values, 5)
    assert np.array_equal(np.array(list(means.values())), moving_average(values, 5))
    assert [e for e, f in full.items() if not f] == [1, 2, 3, 4]
    rewards = np.r_[np.full(5, 0.1), np.full(4, np.nan), np.full(3, 1.0)]  # epochs 6-9 missing
    run = _make_run(tmp_path, "gappy", np.nan_to_num(rewards), save_every=1)
    log = pd.read_parquet(run / "log.parquet")
    log[log["epoch"].isin([1, 2, 3, 4, 5, 10, 11, 12])].to_parquet(run / "log.parquet")
    for d in (run / "checkpoints").iterdir():
        if int(d.name.split("_")[1]) in (6, 7, 8, 9):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
    cks, _ = run_checkpoints(run, window=5)
    by = {c.epoch: c for c in cks}
    assert by[10].reward == pytest.approx(1.0) and not by[10].full_window  # epochs 6-10: one logged value
    assert by[5].full_window and by[5].reward == pytest.approx(0.1)
    sel = select_checkpoints([run], target=0.9, window=5)
    assert not sel.choices[0].reached  # no full window ever reaches 0.9: epochs 10-12 follow a gap


def test_a_gain_match_is_not_printed_as_a_reward(tmp_path):
    """``select --on gain`` printed "Target reward 0.04" and a "Reward" column over gains (a review)."""
    from pcpo_eval.stats.select import Selection, matched_noun

    assert matched_noun("gain") == "gain" and matched_noun("eval") == "validation reward" and matched_noun("train") == "reward"
    md = Selection(0.04, 5, (), None, (), (), "gain").to_markdown()
    assert md.startswith("Target gain 0.04 (smoothed, window 5)") and "| Run | Epoch | Gain | Gap | Reached |" in md
    assert Selection(0.8, 5, (), None, ()).to_markdown().startswith("Target reward 0.8")
