"""Every sentence that reports how an experiment came out is glued from a declared claim
(``klbook_lib.claims``), never typed by hand (issue 35).

The check reads the markdown cells of chapters 3-15 with math, code, roles (so every glued
claim sentence) and link targets removed (``booktools.prose_only``) and counts the sentences
that still use the words an outcome is reported with (higher, lower, no detectable difference,
not settled, undecided, beats, wins, ...). Pages not yet converted carry their count in
``NOT_YET_CONVERTED``: a page may not gain a hand-written verdict, and when one is converted
its number must come down with it (the list only shrinks; an entry at zero is removed).
"""
from __future__ import annotations

import re

import pytest

from booktools import ROOT, markdown_cells, prose_only

CHAPTERS = [p for p in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")) if 3 <= int(p.name[:2]) <= 15]

VERDICT = re.compile(
    r"\b(?:higher|lower|no detectable|not detectable|not settled|(?:do|does|did) not settle|"
    r"undecided|beats?|beaten|wins?|outperforms?|cannot tell|"
    r"(?:do|does|did) not show)\b", re.I)
# words of the same spelling that report no outcome
NOT_A_VERDICT = re.compile(r"\b(?:lower|upper)[ -]bounds?\b|\bhigher[ -]order\b|\blower[ -]triangular\b|"
                           r"\blower[ -]case\b|\bwin[ -]rates?\b|\bclip-higher\b", re.I)

# page -> sentences with a hand-written outcome still on it (2026-12-06); shrink as pages are converted
NOT_YET_CONVERTED: dict[str, int] = {
    "03_trpo_ppo": 3,          # the clip-drift epochs comparison; two false friends ("cannot tell", Pinsker)
    "04_estimating_kl": 3,
    "05_kl_in_practice": 8,    # the spike experiment (bugs 1-7); the gradient-ratio gauge is converted
    "06_rlhf_reverse_kl": 7,
    "08_vi_elbo_dpo": 6,
    "09_choosing_beta": 11,
    "10_other_divergences": 1,
    "12_overoptimisation_distillation": 6,   # distillation and the proxy-rise remark; RL vs proxy converted
    "13_kl_as_a_tool": 1,
    "14_offpolicy_kl": 3,
    "15_exploration_anchors_optimum": 2,     # chiPO vs DPO; the anchors are converted
}


def hand_written_verdicts(markdown: str) -> list[str]:
    """The sentences of ``markdown`` (outside math, code and glued text) that state an outcome."""
    text = NOT_A_VERDICT.sub(" ", prose_only(markdown))
    sentences = re.split(r"(?<=[.!?;:])\s+|\n\s*\n|\n\s*[-*|]", text)
    return [" ".join(s.split()) for s in sentences if VERDICT.search(s)]


def test_the_check_finds_a_planted_hand_written_verdict():
    planted = "Over ten seeds the adaptive rule beats the fixed one; the KL is lower (CI below zero)."
    assert len(hand_written_verdicts(planted)) == 2      # two clauses, each a verdict
    assert hand_written_verdicts("Not settled by these seeds.") == ["Not settled by these seeds."]
    # a glued claim sentence, math and a lower bound are not hand-written verdicts
    assert hand_written_verdicts("Result: {glue:text}`c05_gauge_strong`. The ELBO is a lower bound; "
                                 "$a > b$ when `higher=True`.") == []


def test_a_planted_verdict_on_a_converted_page_fails(tmp_path):
    """The page test itself fails when a hand-written verdict is planted in a converted chapter."""
    import nbformat
    src = next(p for p in CHAPTERS if p.stem.startswith("11_"))
    nb = nbformat.read(src, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("With the KL term the reward is not settled."))
    planted = tmp_path / src.name
    nbformat.write(nb, planted)
    with pytest.raises(AssertionError, match="state an experimental outcome by hand"):
        test_outcomes_are_said_by_glued_claims(planted)


def _page(path):
    return path.stem


@pytest.mark.parametrize("path", CHAPTERS, ids=_page)
def test_outcomes_are_said_by_glued_claims(path):
    found = [v for md in markdown_cells(path) for v in hand_written_verdicts(md)]
    allowed = NOT_YET_CONVERTED.get(path.stem, 0)
    assert len(found) <= allowed, (
        f"{path.stem}: {len(found)} sentences state an experimental outcome by hand (allowed "
        f"{allowed}); declare a klbook_lib.claims.Claim and glue its sentence instead:\n  "
        + "\n  ".join(found))
    assert len(found) == allowed, (
        f"{path.stem}: {len(found)} hand-written outcome sentences left, the allow-list says "
        f"{allowed}: lower NOT_YET_CONVERTED[{path.stem!r}] to {len(found)} (it only shrinks)")


def test_the_allow_list_names_only_chapters():
    assert set(NOT_YET_CONVERTED) <= {p.stem for p in CHAPTERS}
    assert all(v > 0 for v in NOT_YET_CONVERTED.values())
