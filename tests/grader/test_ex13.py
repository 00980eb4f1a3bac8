"""Exercise 13 ("KL as a tool"): reference solutions against independent computations, and
the master, the student stub and a plausible wrong answer under the grader.

The references are checked against scipy (relative entropy to the uniform distribution),
klbook_lib.monitor.batch_mean (the library's vectorised per-episode average) and the closed
form of the two-action entropy. The grading runs go through the sandbox as a student's would.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from scipy.special import rel_entr

from klbook_lib import monitor
from klbook_grader import student
from klbook_grader.grader import grade
from klbook_grader.hidden import bank
from klbook_grader.hidden import ex13

REPO = Path(__file__).resolve().parents[2]
EX = "ex13_kl_as_a_tool"


def test_registered_with_mixed_kinds():
    qs = bank.questions(EX)
    assert [q.id for q in qs] == ["q1", "q2", "q3", "q4", "q5"]
    assert {q.kind for q in qs} == {"function", "value", "choice"}
    assert sum(q.points for q in qs) == 13
    for q in qs:
        if q.kind == "function":
            assert sum(not c.public for c in q.cases) >= 4, q.id


def test_kl_to_uniform_reference_against_scipy():
    rng = np.random.default_rng(0)
    for shape, scale in (((7, 3), 1.0), ((4, 9), 8.0), ((2, 3, 5), 2.0)):
        z = rng.normal(0, scale, shape)
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        expected = rel_entr(p, np.full_like(p, 1 / shape[-1])).sum(-1)
        assert np.allclose(ex13.kl_to_uniform(z), expected, atol=1e-12)
    # huge logits: deterministic, log|A|
    assert ex13.kl_to_uniform(np.array([[1000.0, 0.0, 0.0, 0.0]]))[0] == pytest.approx(math.log(4))
    assert ex13.kl_to_uniform(np.zeros((1, 5)))[0] == pytest.approx(0.0, abs=1e-15)


def test_episode_average_reference_against_the_library():
    rng = np.random.default_rng(1)
    for T, N, p in ((6, 3, 0.3), (1, 4, 0.5), (10, 1, 0.2), (4, 4, 1.0), (5, 2, 0.0)):
        v, d = rng.random((T, N)), rng.random((T, N)) < p
        lib = monitor.batch_mean(torch.tensor(v), torch.tensor(d), by="episode")
        assert ex13.episode_average(v, d.astype(float)) == pytest.approx(lib, abs=1e-12)
    # nothing ends: the plain mean
    v = rng.random((5, 3))
    assert ex13.episode_average(v, np.zeros((5, 3))) == pytest.approx(v.mean(), abs=1e-12)


def test_gauge_probability_solves_the_two_action_equation():
    p = ex13.gauge_probability(0.5)
    entropy = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert math.log(2) - entropy == pytest.approx(0.5, abs=1e-12)
    assert 0.5 < p < 1
    # the chapter's exercise 13.1 (0.3 nats) lies between the uniform policy and this one
    assert 0.5 < ex13.gauge_probability(0.3) < p


def test_master_scores_full_marks_and_the_stub_zero():
    master = grade(REPO / "exercises" / "masters" / f"{EX}.ipynb")
    assert master["notes"] == [] and master["score"] == master["max_score"] == 13, master
    stub = grade(REPO / "exercises" / f"{EX}.ipynb")
    assert stub["notes"] == [] and stub["score"] == 0, stub
    assert not student.stale_files() or all(p.name != f"{EX}.ipynb" for p in student.stale_files())


def test_a_per_sample_average_gets_partial_credit_only(tmp_path):
    """The hidden cases tell the per-episode average from the per-sample one."""
    nb = nbformat.read(REPO / "exercises" / "masters" / f"{EX}.ipynb", as_version=4)
    wrong = copy.deepcopy(nb)
    for cell in wrong.cells:
        if cell.cell_type == "code" and cell.source.startswith("def episode_average"):
            cell.source = ("def episode_average(values, done):\n"
                           "    return float(np.mean(values))\n")
    path = tmp_path / f"{EX}.ipynb"
    nbformat.write(wrong, path)
    result = grade(path)
    q2 = next(q for q in result["questions"] if q["id"] == "q2")
    assert 0 < q2["points"] < q2["max_points"], q2
    assert result["score"] == 13 - q2["max_points"] + q2["points"]
