"""The graded exercise of chapter 11 (ex11_sequence_kl_grpo): references and grading.

Each reference solution of klbook_grader/hidden/ex11_sequence.py is checked against a second,
independent computation (the chapter's library klbook_lib.rlhf.grpo, klbook_lib.seqkl's closed forms,
central finite differences of a numpy double sum). Then ``klbook grade`` must give the master full
marks and the generated student notebook zero.

The exercise is named explicitly (``--exercise``), which keeps these tests independent of the
file names the grader would otherwise infer it from.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import klbook_lib.seqkl as S
from klbook_grader.hidden import bank
from klbook_grader.hidden import ex11_sequence as X
from klbook_lib.rlhf import grpo

REPO = Path(__file__).resolve().parents[2]
EX = "ex11_sequence_kl_grpo"
torch.set_num_threads(1)


def test_registered_with_six_questions_of_mixed_kinds():
    assert EX in bank.exercise_names()
    qs = bank.questions(EX)
    assert [q.id for q in qs] == ["q1", "q2", "q3", "q4", "q5", "q6"]
    assert {q.kind for q in qs} == {"function", "value", "choice"}
    assert sum(q.points for q in qs) == 17
    for q in qs:
        if q.kind == "function":
            assert any(c.public for c in q.cases) and any(not c.public for c in q.cases)


def test_advantages_match_the_library():
    for q in bank.questions(EX)[:1]:
        for c in q.cases:
            rewards, mask, G = c.call_args()
            lib = grpo.token_advantages(grpo.group_advantages(torch.tensor(rewards), int(G)),
                                        torch.tensor(mask)).numpy()
            np.testing.assert_allclose(X.grpo_token_advantages(rewards, mask, G), lib, rtol=1e-10, atol=1e-12)


def test_kl_term_matches_the_library_loss():
    # grpo_loss with zero advantages and beta = 1 is the aggregated k3 term
    q = bank.questions(EX)[1]
    for c in q.cases:
        lp, lq, mask, agg, L = c.call_args()
        B = lp.shape[0]
        loss, _ = grpo.grpo_loss(torch.tensor(lp), torch.tensor(lp), torch.tensor(lq), torch.zeros(B, dtype=torch.float64),
                                 torch.tensor(mask), 1.0, aggregation=agg, max_tokens=int(L))
        assert X.grpo_kl_term(lp, lq, mask, agg, L) == pytest.approx(loss.item(), rel=1e-10, abs=1e-12)
    with pytest.raises(ValueError, match="aggregation"):
        X.grpo_kl_term(np.zeros((1, 1)), np.zeros((1, 1)), np.ones((1, 1)), "mean", 1)


def _kl_two_steps(z, zr):
    """The sequence KL as an explicit double sum over (a, b), numpy."""
    def sm(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    p, q = sm(z), sm(zr)
    V = z.shape[1]
    return sum(p[0, a] * p[1 + a, b] * np.log(p[0, a] * p[1 + a, b] / (q[0, a] * q[1 + a, b]))
               for a in range(V) for b in range(V))


@pytest.mark.parametrize("V", [2, 3, 4])
def test_two_step_gradient_against_finite_differences(V):
    rng = np.random.default_rng(V)
    z, zr = rng.normal(0, 1.5, (V + 1, V)), rng.normal(0, 1.0, (V + 1, V))
    g = X.kl_gradient_two_steps(z, zr)
    eps = 1e-6
    fd = np.zeros_like(z)
    for i in range(V + 1):
        for j in range(V):
            e = np.zeros_like(z); e[i, j] = eps
            fd[i, j] = (_kl_two_steps(z + e, zr) - _kl_two_steps(z - e, zr)) / (2 * eps)
    np.testing.assert_allclose(g, fd, atol=1e-8, rtol=0)


def test_k3_stationary_policy_matches_seqkl_and_is_stationary():
    q, Q, beta = np.array([0.5, 0.3, 0.2]), np.array([1.0, 0.0, 0.5]), 0.2
    pi = X.k3_stationary_policy(q, Q, beta)
    sp = S.sequence_space(3, 1)
    closed = S.fixed_point_logits(sp, torch.tensor(np.log(q))[None], torch.tensor(Q), beta, ("k3", "loss")).exp()
    np.testing.assert_allclose(pi, closed[0].numpy(), atol=1e-12)
    # the update vanishes: pi (Q - V) = beta (pi - q)
    V = float(pi @ Q)
    np.testing.assert_allclose(pi * (Q - V), beta * (pi - q), atol=1e-12)
    assert abs(pi.sum() - 1) < 1e-12


def _grade_cli(path: Path, tmp_path: Path) -> dict:
    out = tmp_path / f"{path.stem}.json"
    proc = subprocess.run([sys.executable, "-m", "klbook_grader.cli", "grade", str(path), "--exercise", EX,
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return {"stdout": proc.stdout, "returncode": proc.returncode, **json.loads(out.read_text())}


def test_master_scores_full_marks_and_the_student_zero(tmp_path):
    master = _grade_cli(REPO / "exercises" / "masters" / f"{EX}.ipynb", tmp_path)
    assert master["exercise"] == EX and master["notes"] == [], master["notes"]
    assert master["score"] == master["max_score"] == 17, master["stdout"]
    assert master["stdout"].strip().splitlines()[-1] == "Score: 17/17"
    stud = _grade_cli(REPO / "exercises" / f"{EX}.ipynb", tmp_path)
    assert stud["notes"] == [] and stud["score"] == 0, stud["stdout"]
    for q in stud["questions"]:
        assert q["points"] == 0
        if q["kind"] == "function":
            assert any("not implemented yet" in m for m in q["messages"]), q
