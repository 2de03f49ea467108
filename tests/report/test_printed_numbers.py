"""Every place that prints a comparison prints the same, honest numbers (the fourth verdict review).

Found by building study results with the study's own code and reading them as a reviewer would: the
speed-up table printed the hull of a two-piece CI (covering 0%) beside a bold speed-up; p = 0.04997
(significant) and 0.05003 (not) both read "0.05"; a significant CI read "+0.0% to +71%"; the console
rounded +3.5% to +4%; the balance and sampler-offset lines printed CIs without the rule that made them
"no evidence"; a heavy rater's pooled win rate contradicted a bold "Raters preferred A".
"""

from __future__ import annotations

import html as html_lib
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.report.html import _speedup_ci, fmt_p, fmt_pct, render_report
from pcpo_eval.report.summary import speedup_lines
from pcpo_eval.stats.fmt import ci_decimals, p_value, pct, pct_end, pct_interval
from pcpo_eval.stats.verdict import headline, target_status
from pcpo_eval.study import verdicts as sv


def test_p_keeps_its_side_of_alpha():
    assert p_value(0.04997) == "0.04997" and p_value(0.05003) == "0.05"
    assert p_value(0.0496) == "0.0496" and p_value(0.222) == "0.222"
    assert p_value(0.0099996, alpha=0.01) == "0.0099996"
    assert fmt_p(0.04997) == "0.04997" and fmt_p(0.05003) == "0.05" and fmt_p(0.5) == "0.500"
    for p in np.linspace(0.0495, 0.0505, 101):
        assert (float(p_value(p)) < 0.05) == (p < 0.05), p


def test_percentages_keep_the_sign_of_a_ci_end():
    assert pct(0.254) == "+25%" and pct(0.035) == "+3.5%" and pct(None) == "?" and fmt_pct(None) == "–"
    assert pct_end(9.4e-5) == "+0.01%" and pct_end(-2e-6) == "-0.0002%" and pct_end(0.0) == "+0.0%"
    assert pct_interval(-0.92, 11.0, (-0.051, 0.044)) == "-92% to -5.1% or +4.4% to +1100%"
    assert pct_interval(0.1, None) == "+10% to unbounded"
    assert ci_decimals(0.008, 5.8e-5, 0.016) == 4


def _step_table(times_b, times_t, n_epochs=60, gain=0.1, ctrl_t=0.3):
    e, parts = np.arange(1, n_epochs + 1), []
    for arm, times, c0 in (("DDPO", times_b, 0.3), ("PCPO", times_t, ctrl_t)):
        for s, t in enumerate(times):
            ctrl = np.full(n_epochs, c0)
            parts.append(pd.DataFrame({"arm": arm, "cell": "c", "seed": s, "epoch": e,
                                       "reward_mean": ctrl + np.where(e >= t, gain, 0.0), "control_reward_mean": ctrl}))
    return pd.concat(parts, ignore_index=True)


def _results(table, gain_targets=(0.01,), primary=("speedup_gain",)):
    sp = SimpleNamespace(baseline="DDPO", pcpo="PCPO", window=5, targets=[], gain_targets=list(gain_targets),
                         primary=list(primary))
    rows = sv.verdict(sp, table)
    status = target_status(sv.compared_runs(sp, table), [], list(gain_targets), 5)
    offset = sv.sampler_offset(sp, table, rows)
    return {"study": {"name": "t"}, "metrics": [], "verdict": rows, "headline": headline(rows, offset, []),
            "sampler_offset": offset, "targets": status, "speedup": sv.speedup_blocks(sp, rows, status),
            "verdict_notes": []}


def _cells(page: str, table_id: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S).group(1)
    return [[html_lib.unescape(re.sub(r"<.*?>", "", c)).strip() for c in re.findall(r"<t[dh].*?>(.*?)</t[dh]>", tr, re.S)]
            for tr in re.findall(r"<tr.*?>(.*?)</tr>", body, re.S)]


def test_the_speedup_table_prints_both_pieces_of_a_two_piece_ci_and_the_holm_p_of_the_verdict():
    res = _results(_step_table([7, 8, 43], [5, 5, 40]))
    v = next(r for r in res["verdict"] if r["quantity"] == "speedup_gain:0.01")
    assert v["significant"] and v["details"]["ci_gap"][0] is not None
    page = render_report(res)
    row = _cells(page, "speedup-table")[1]
    ci = _speedup_ci(v)
    assert " or " in ci and row[6] == f"{ci} *"  # before: the hull "-92% to +1100%", which covers 0
    # * : its p is bounded by the faster arm's learning test, so the t interval does not decide it alone
    assert 'id="speedup-ci-notes"' in page and "does not decide the row alone" in page
    assert row[7] == fmt_p(v["p_adjusted"])  # before: 3 decimals (0.0455-0.0545 all read 0.05)
    line = speedup_lines(res)[0]
    assert f"-> {pct(v['estimate'])} (Holm p {p_value(v['p_adjusted'])}: significant; detectable {pct(v['mde'])})" in line


def test_the_console_rounds_a_speedup_as_the_report_does():
    res = _results(_step_table([20, 21, 23, 25, 27], [20, 21, 22, 24, 26]), primary=())
    row = res["speedup"][0]["rows"][0]
    assert abs(row["speedup"]) < 0.1
    assert f"-> {pct(row['speedup'])} (" in speedup_lines(res)[0]  # before: "+4%" for +3.5%


def test_the_sampler_offset_line_says_its_p_and_why_a_clear_ci_is_not_significant():
    offset = _results(_step_table([10, 11], [9, 10], ctrl_t=0.35), primary=())["sampler_offset"]["c"]
    # 2 seeds: every per-seed offset is equal, no CI; the exact sign-flip p = 0.5
    # a secondary row of the verdict: its family was not tested (the arms' paired gains are equal in every seed)
    assert not offset["significant"] and offset["gated"] and (
        "p = 0.5, Holm-adjusted p = 1 (secondary); not tested as a secondary row: the primary endpoint (paired_gain) "
        "shows no difference: equal in every seed, 2 seeds" in offset["explains"])
    noisy = _step_table([10, 11], [9, 10], ctrl_t=0.35)
    noisy.loc[noisy.arm == "PCPO", "control_reward_mean"] += np.where(noisy.loc[noisy.arm == "PCPO", "seed"] == 0,
                                                                      0.003, -0.002)
    text = _results(noisy, primary=())["sampler_offset"]["c"]["explains"]
    assert "95% CI" in text and "a t test needs at least 3" in text and "not significant" in text


def test_the_balance_sentence_keeps_signs_and_says_when_nothing_is_detectable():
    from pcpo_eval.stats.runlevel import compare_runs
    from pcpo_eval.study.balance import _balance_sentence

    sp = SimpleNamespace(cells=lambda: ["c"], pcpo="PCPO", baseline="DDPO", select_on="train")
    b, t = [0.80, 0.81], [0.836, 0.8361]
    c = compare_runs(b, t, rng=np.random.default_rng(0), paired=True)
    text = _balance_sentence(sp, "c", c, 0.05, False, c.p, 1, {"baseline": 0, "pcpo": 0})
    assert "a t test needs at least 3" in text
    assert "no imbalance is detectable with 2 seeds per arm: the exact permutation test's smallest p is 0.5" in text
    b, t = np.array([0.8, 0.8, 0.8, 0.8, 0.8]), np.array([0.80001, 0.80005, 0.80009, 0.80013, 0.80017])
    c = compare_runs(1e-3 * b, 1e-3 * t, rng=np.random.default_rng(0), paired=True)
    text = _balance_sentence(sp, "c", c, 0.05, True, c.p, 1, {"baseline": 0, "pcpo": 0})
    ci = re.search(r"CI (\S+) to (\S+),", text)
    assert float(ci.group(1)) > 0 and float(ci.group(2)) > 0, text  # before: "+0.000 to +0.000"


def test_a_heavy_raters_pooled_rate_against_the_verdict_is_said_and_not_bold():
    from pcpo_eval.human.analysis import compare, pooled_agrees, study_family
    from pcpo_eval.report.html import _human_comparison_row

    rng = np.random.default_rng(7)
    rows = []
    for r in range(21):
        n, rate = (1000, 0.2) if r == 0 else (20, 0.75)
        for i in range(n):
            left_a = i % 2 == 0
            chose_a = rng.random() < rate
            rows.append({"rater_id": f"r{r}", "prompt_id": f"p{i % 10}", "pair_id": f"{r}-{i}", "comparison": "A vs B",
                         "left_method": "A" if left_a else "B", "right_method": "B" if left_a else "A",
                         "choice": "left" if chose_a == left_a else "right"})
    c = study_family([compare(pd.DataFrame(rows), "A vs B")])[0]
    assert c["significant"] and c["win_rate_a"] < 0.5 and c["rater_level"]["mean_win_rate"] > 0.5
    assert not pooled_agrees(c)
    assert c["verdict"].startswith("Raters preferred A over B (the mixed model and the raters' own win rates")
    assert "points the other way" in c["verdict"]
    assert _human_comparison_row(c)["bold_rate"] is False


@pytest.mark.parametrize("p", [0.04997, 0.05003])
def test_the_sentence_p_keeps_its_side_of_alpha(p):
    from pcpo_eval.stats.verdict import Verdict, _p_text

    v = Verdict("c", "paired_gain", "DDPO", "PCPO", 0.1, 0.0, 0.2, 5, 5, p, True, "", p < 0.05, "", True,
                family="primary", p_adjusted=p)
    assert _p_text(v, 0.05) == f"; p = {p_value(p)}, Holm-adjusted p = {p_value(p)} (primary)"
    assert (float(p_value(p)) < 0.05) == (p < 0.05)


def test_a_t_interval_the_permutation_test_overrules_is_marked():
    """3 vs 4 unpaired runs, one PCPO run among the baseline's: Welch's interval excludes 0 (+2.6% to +81%) but
    the exact relabelling test's p is 3/35 = 0.086, so the row is "no evidence". An A/A study printed "speed-up +33%, 95% CI +4.1% to
    +78%" beside p 0.114 with nothing saying which decides; now the sentence and both tables say it."""
    e, parts = np.arange(1, 41), []
    for arm, seeds, times in (("DDPO", (0, 1, 2), (20, 22, 24)), ("PCPO", (10, 11, 12, 13), (14, 15, 16, 21))):
        for s, t in zip(seeds, times, strict=True):
            ctrl = np.full(40, 0.3)
            parts.append(pd.DataFrame({"arm": arm, "cell": "c", "seed": s, "epoch": e,
                                       "reward_mean": ctrl + np.where(e >= t, 0.1, 0.0), "control_reward_mean": ctrl}))
    res = _results(pd.concat(parts, ignore_index=True))
    v = next(r for r in res["verdict"] if r["quantity"] == "speedup_gain:0.01")
    assert not v["paired"] and not v["significant"] and v["p"] >= 0.05 and v["ci_low"] > 0  # the interval excludes 0
    assert "that is the t interval, which does not decide this row alone" in v["sentence"]
    page = render_report(res)
    verdict_row = next(r for r in _cells(page, "verdict-table") if "gain 0.01" in r[1])
    assert verdict_row[5].endswith(" *") and 'id="verdict-ci-notes"' in page
    speed_row = _cells(page, "speedup-table")[1]
    assert speed_row[6].endswith(" *") and 'id="speedup-ci-notes"' in page


def test_a_significant_slowdown_is_not_called_undetectable():
    """A frozen arm against a learning one: the slow-down is significant, and its MDE is undefined (a speed-up
    would exceed the largest the window allows). Before, the sentence said "no speed-up is detectable at 80%
    power" beside the significant -48%, and the table printed "none" beside the bold cell."""
    res = _results(_step_table([6, 7, 9], [99, 99, 99], n_epochs=16), primary=("speedup_gain",))
    v = next(r for r in res["verdict"] if r["quantity"] == "speedup_gain:0.01")
    assert v["significant"] and v["estimate"] < 0 and v["mde"] is None
    assert "PCPO reaches gain 0.01 later than DDPO" in v["sentence"] and "detectable" not in v["sentence"]
    # seeds over the uncertainty of the spread 3 seeds measured (11 at that spread taken as the truth)
    assert "a 25% speed-up needs 24 seeds per arm" in v["sentence"] and v["details"]["seeds_for_reference"] == 24
    row = _cells(render_report(res), "speedup-table")[1]
    assert row[5] == pct(v["estimate"]) and row[8] == "–"


def test_runs_that_reach_a_target_at_the_last_epoch_and_runs_that_never_do_are_said_to_count_alike():
    """Every baseline run reaches the gain target at the last compared epoch, no PCPO run ever does: both count
    that epoch, so the row has no test. Before, "every run of both arms takes the same number of epochs" beside
    "(1/3 not reached)", and the console printed "+0.0% (not tested)" as if a 0 had been measured."""
    res = _results(_step_table([16, 16, 16], [99, 99, 99], n_epochs=16), primary=("paired_gain",))
    v = next(r for r in res["verdict"] if r["quantity"] == "speedup_gain:0.01")
    assert not v["estimable"] and "counts as epoch 16, the last compared one, like a run that reaches it there" \
        in v["reason"]
    (line,) = [x for x in speedup_lines(res) if "gain 0.01" in x]
    assert "not estimable: the per-seed differences in epochs are all 0" in line and "not tested" not in line


def test_the_detectable_column_says_none_as_the_speedup_table_does():
    """An estimable speed-up row without an MDE printed "–" in the verdict table (elsewhere: not estimable) and
    "none" in the speed-up table (a review); both say "none" now, and "–" stays for a found or not estimable row."""
    from pcpo_eval.report.html import verdict_row

    row = {"quantity": "speedup_gain:0.02", "estimable": True, "significant": False, "mde": None}
    assert verdict_row(row)["mde"] == "none"
    assert verdict_row({**row, "significant": True})["mde"] == "–"
    assert verdict_row({**row, "estimable": False})["mde"] == "–"
    assert verdict_row({**row, "mde": 0.25})["mde"] == "+25%"
    assert verdict_row({**row, "quantity": "paired_gain", "mde": 0.04})["mde"] == "±0.04"
