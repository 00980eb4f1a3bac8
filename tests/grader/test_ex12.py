"""Exercise 12 ("over-optimisation and distillation"): reference solutions against independent
computations, and the master, the student stub and plausible wrong answers under the grader.

The references (plain numpy in klbook_grader/hidden/ex12.py) are checked against brute-force
enumeration of every n-tuple of draws and every subset of a pool, against torch.distributions on
padded batches, and against klbook_lib.rlhf.overopt / distill, which have their own tests.
"""
from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from klbook_grader import student
from klbook_grader.grader import grade
from klbook_grader.hidden import bank, ex12
from klbook_lib.rlhf import distill, overopt

REPO = Path(__file__).resolve().parents[2]
EX = "ex12_overoptimisation_distillation"


def test_registered_with_mixed_kinds():
    qs = bank.questions(EX)
    assert [q.id for q in qs] == ["q1", "q2", "q3", "q4", "q5", "q6"]
    assert {q.kind for q in qs} == {"function", "value", "choice"}
    assert sum(q.points for q in qs) == 18
    for q in qs:
        if q.kind == "function":
            assert sum(not c.public for c in q.cases) >= 4, q.id


def test_bon_kl_reference_against_enumeration_and_the_library():
    rng = np.random.default_rng(0)
    for _ in range(15):
        K = int(rng.integers(2, 5))
        p = rng.dirichlet(np.ones(K))
        s = rng.integers(0, 3, K).astype(float)
        n = int(rng.integers(1, 5))
        q = np.zeros(K)
        for tup in itertools.product(range(K), repeat=n):          # every n-tuple of draws
            prob = np.prod(p[list(tup)])
            best = max(s[i] for i in tup)
            winners = [i for i in tup if s[i] == best]
            for i in winners:
                q[i] += prob / len(winners)
        on = q > 0
        brute = float(np.sum(q[on] * np.log(q[on] / p[on])))
        assert ex12.bon_kl(p, s, n) == pytest.approx(brute, abs=1e-12)
        assert ex12.bon_kl(p, s, n) == pytest.approx(overopt.bon_kl(p, s, n), abs=1e-12)
    # zero-probability outcomes and the continuous limit
    assert ex12.bon_kl([0.0, 0.5, 0.5], [5.0, 1.0, 2.0], 3) == pytest.approx(overopt.bon_kl([0, 0.5, 0.5], [5, 1, 2], 3))
    assert ex12.bon_kl(np.full(5000, 2e-4), np.arange(5000.0), 8) == pytest.approx(overopt.bon_kl_bound(8), abs=2e-3)


def test_bon_expected_reference_is_the_subset_mean():
    rng = np.random.default_rng(1)
    for m, n in ((6, 1), (6, 3), (7, 7), (8, 4)):
        sel, val = rng.normal(size=m), rng.normal(size=m)
        subsets = list(itertools.combinations(range(m), n))
        brute = np.mean([val[max(sub, key=lambda i: sel[i])] for sub in subsets])
        assert ex12.bon_expected(sel, val, n) == pytest.approx(brute, abs=1e-12)
        assert ex12.bon_expected(sel, val, n) == pytest.approx(overopt.bon_estimate(sel, val, [n])[0], abs=1e-12)


def test_sequence_reverse_kl_reference_against_torch_distributions():
    rng = np.random.default_rng(2)
    s, t = rng.normal(0, 2, (3, 5, 4)), rng.normal(0, 2, (3, 5, 4))
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=float)
    kl = kl_divergence(Categorical(logits=torch.tensor(s)), Categorical(logits=torch.tensor(t))).numpy()
    expected = (kl * mask).sum(1)
    assert np.allclose(ex12.sequence_reverse_kl(s, t, mask), expected, atol=1e-12)
    lib = distill.token_divergence(torch.tensor(s), torch.tensor(t), torch.tensor(mask), "reverse").sum(1).numpy()
    assert np.allclose(ex12.sequence_reverse_kl(s, t, mask), lib, atol=1e-12)
    # pads holding huge logits change nothing; huge real logits do not overflow
    s2, t2 = s.copy(), t.copy()
    s2[mask == 0], t2[mask == 0] = 1e5, -1e5
    assert np.allclose(ex12.sequence_reverse_kl(s2, t2, mask), expected, atol=1e-12)
    assert np.isfinite(ex12.sequence_reverse_kl(800 * s, 800 * t, mask)).all()


def test_q4_fit_matches_the_library_fit():
    d = np.sqrt([overopt.bon_kl_bound(n) for n in ex12.Q4_N])
    fit = overopt.fit_bon(d, ex12.Q4_GOLD)
    alpha, beta, d_star = ex12.fit_bon_and_peak()
    assert (alpha, beta) == (pytest.approx(fit.alpha, abs=1e-12), pytest.approx(fit.beta, abs=1e-12))
    assert d_star == pytest.approx(fit.peak()[0], abs=1e-12)
    assert d[0] < d_star < d[-1] + 0.5          # the data bend: the peak is near the measured range


def test_master_scores_full_marks_and_the_stub_zero():
    master = grade(REPO / "exercises" / "masters" / f"{EX}.ipynb")
    assert master["notes"] == [] and master["score"] == master["max_score"] == 18, master
    stub = grade(REPO / "exercises" / f"{EX}.ipynb")
    assert stub["notes"] == [] and stub["score"] == 0, stub
    assert not student.stale_files() or all(p.name != f"{EX}.ipynb" for p in student.stale_files())


def _with_cell(source_start: str, new_source: str, tmp_path: Path) -> Path:
    nb = nbformat.read(REPO / "exercises" / "masters" / f"{EX}.ipynb", as_version=4)
    wrong = copy.deepcopy(nb)
    for cell in wrong.cells:
        if cell.cell_type == "code" and cell.source.startswith(source_start):
            cell.source = new_source
    path = tmp_path / f"{EX}.ipynb"
    nbformat.write(wrong, path)
    return path


def test_wrong_answers_get_partial_credit_only(tmp_path):
    """The formula log n - (n-1)/n is right only without ties; a KL that ignores the mask fails padded rows."""
    path = _with_cell("def bon_kl", "def bon_kl(probs, scores, n):\n    return math.log(n) - (n - 1) / n\n", tmp_path)
    q1 = next(q for q in grade(path)["questions"] if q["id"] == "q1")
    assert 0 < q1["points"] < q1["max_points"], q1
    path = _with_cell("def sequence_reverse_kl",
                      "def sequence_reverse_kl(student_logits, teacher_logits, mask):\n"
                      "    s = np.asarray(student_logits, float); t = np.asarray(teacher_logits, float)\n"
                      "    lq = s - s.max(-1, keepdims=True); lq -= np.log(np.exp(lq).sum(-1, keepdims=True))\n"
                      "    lp = t - t.max(-1, keepdims=True); lp -= np.log(np.exp(lp).sum(-1, keepdims=True))\n"
                      "    return (np.exp(lq) * (lq - lp)).sum(-1).sum(-1)\n", tmp_path)
    q3 = next(q for q in grade(path)["questions"] if q["id"] == "q3")
    assert 0 < q3["points"] < q3["max_points"], q3


def test_the_notebook_data_of_q4_are_the_graders():
    nb = nbformat.read(REPO / "exercises" / "masters" / f"{EX}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("NS = "))
    scope = {"np": np}
    exec(cell.source, scope)
    assert scope["NS"].tolist() == ex12.Q4_N and scope["GOLD"].tolist() == ex12.Q4_GOLD
