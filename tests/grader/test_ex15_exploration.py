"""Exercise 15 on exploration, anchors and the shape of the optimum.

The reference solutions (plain loops, in klbook_grader/hidden/ex15_exploration.py) are checked
against the chapter's library (klbook_lib.shape, klbook_lib.optimal), which they do not call, and
against scipy, torch and finite differences; the public check() passes the master; ``klbook start
ex15`` and the grader find the exercise by its number; and classic wrong answers, graded by the real
grader in its sandbox, lose their points. That the master scores full marks and the student copy
zero is tested for every registered exercise, this one included, in tests/grader/test_exercises.py.
"""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from scipy.special import rel_entr, softmax
from scipy.stats import entropy as scipy_entropy

from klbook_lib import optimal, shape
from klbook_grader import checker_for
from klbook_grader.grader import grade
from klbook_grader.hidden import bank
from klbook_grader.hidden import ex15_exploration as ex

from grading_helpers import replace_function

EX = "ex15_exploration_anchors_optimum"
MASTER = Path(__file__).resolve().parents[2] / "exercises" / "masters" / f"{EX}.ipynb"


def _cases(qid):
    return next(q for q in bank.questions(EX) if q.id == qid).cases


def _master_cells() -> list[str]:
    nb = nbformat.read(MASTER, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_registered_with_mixed_kinds_and_explained_letters():
    qs = bank.questions(EX)
    assert EX in bank.exercise_names()          # so tests/grader/test_exercises.py grades master and stub
    assert [q.id for q in qs] == [f"q{i}" for i in range(1, 9)]
    assert {q.kind for q in qs} == {"function", "value", "choice"}
    assert sum(q.points for q in qs) == 21
    for q in qs:
        if q.kind == "function":
            assert any(c.core for c in q.cases) and sum(not c.public for c in q.cases) >= 3, q.id
            assert all(c.probe for c in q.cases if not c.public), q.id
        elif q.kind == "choice":
            assert set(q.explain) == set("ABCD") - {q.ref}


# ---------------------------------------------------------------- references against independent ones
def test_optimal_policy_reference_against_scipy_and_the_library():
    for case in _cases("q1"):
        q, r, beta = case.args
        ref = ex.optimal_policy(q, r, beta)
        with np.errstate(divide="ignore"):
            logits = np.where(q > 0, np.log(np.where(q > 0, q, 1.0)), -np.inf) + r / beta
        assert np.allclose(ref, softmax(logits, axis=-1), rtol=1e-10, atol=1e-15)
        assert np.allclose(ref.sum(-1), 1.0) and np.all(ref[q == 0] == 0)
        if np.max(np.abs(r)) / beta < 50:       # the library's form is fine without overflow
            lib = np.stack([optimal.optimal_policy(q[b], r[b], beta) for b in range(q.shape[0])])
            assert np.allclose(ref, lib, rtol=1e-10, atol=1e-15)


def test_the_q2_answer_is_the_libraries_ratio():
    q = next(q for q in bank.questions(EX) if q.id == "q2")
    assert q.expected() == pytest.approx(shape.optimal_ratio([0.3, 0.1, 0.6], [0.5, 0.8, 0.0], 0.2, 0, 1),
                                         rel=1e-12)
    pi = ex.optimal_policy(np.array([[0.3, 0.1, 0.6]]), np.array([[0.5, 0.8, 0.0]]), 0.2)[0]
    assert q.expected() == pytest.approx(pi[0] / pi[1], rel=1e-12)


def test_clip_higher_reference_against_torch():
    for case in _cases("q3"):
        lp, lo, a, m, e_lo, e_hi = case.args
        mask = torch.tensor(m > 0)
        lpt, lot, at = (torch.tensor(np.where(m > 0, x, 0.0)) for x in (lp, lo, a))
        rho = torch.exp(lpt - lot)
        want = torch.where(mask, torch.minimum(rho * at, rho.clamp(1 - e_lo, 1 + e_hi) * at), torch.zeros(()))
        assert np.allclose(ex.clip_higher_surrogate(lp, lo, a, m, e_lo, e_hi), want.numpy(), rtol=1e-12, atol=1e-14)


def test_clip_higher_gradient_flows_where_the_chapter_says():
    """A token with A > 0 keeps its gradient while rho < 1 + eps_high, one with A < 0 while
    rho > 1 - eps_low (by finite differences of the reference in log pi)."""
    rho = np.array([0.5, 0.79, 0.81, 1.0, 1.27, 1.29, 3.0])
    lo = np.log(np.full(rho.size, 0.1))[None]
    lp = lo + np.log(rho)[None]
    m = np.ones_like(lp)
    for sign in (1.0, -1.0):
        a = np.full_like(lp, sign)
        h = 1e-6
        g = (ex.clip_higher_surrogate(lp + h, lo, a, m, 0.2, 0.28)
             - ex.clip_higher_surrogate(lp - h, lo, a, m, 0.2, 0.28)) / (2 * h)
        moves = np.abs(g[0]) > 1e-6
        expect = rho < 1.28 if sign > 0 else rho > 0.8
        assert np.array_equal(moves, expect), (sign, g)


def test_entropy_probe_reference_against_the_library_and_finite_differences():
    for case in _cases("q4"):
        z, d = case.args
        ref = ex.entropy_probe(z, d)
        p, p1 = softmax(z, axis=-1), softmax(z + d, axis=-1)
        h0 = np.array([scipy_entropy(row) for row in p])
        h1 = np.array([scipy_entropy(row) for row in p1])
        assert np.allclose(ref[0], h0, rtol=1e-10, atol=1e-12)
        assert np.allclose(ref[1], h1 - h0, rtol=1e-8, atol=1e-11)
        if np.all(np.isfinite(z)):
            zt, dt = torch.tensor(z), torch.tensor(d)
            assert np.allclose(ref[0], shape.entropy(zt).numpy(), rtol=1e-10, atol=1e-12)
            assert np.allclose(ref[2], shape.entropy_rate(zt, dt).numpy(), rtol=1e-8, atol=1e-11)
            if np.abs(z).max() < 50:
                t = 1e-6
                fd = (shape.entropy(zt + t * dt) - shape.entropy(zt - t * dt)).numpy() / (2 * t)
                assert np.allclose(ref[2], fd, rtol=1e-5, atol=1e-8)


def test_ema_anchor_reference_against_torch_distributions():
    from torch.distributions import Categorical, kl_divergence

    for case in _cases("q5"):
        th, alpha, period = case.args
        thetas = torch.tensor(th)
        anchor, want = thetas[0].clone(), []
        for k in range(len(thetas)):
            if k and k % period == 0:
                anchor = alpha * thetas[k] + (1 - alpha) * anchor
            want.append(float(kl_divergence(Categorical(logits=thetas[k]), Categorical(logits=anchor))))
        assert np.allclose(ex.ema_anchor_kl(th, alpha, period), want, rtol=1e-9, atol=1e-12)


def test_ema_anchor_special_cases():
    rng = np.random.default_rng(0)
    th = np.cumsum(rng.normal(0, 0.5, (9, 4)), axis=0)
    reset = ex.ema_anchor_kl(th, 1.0, 3)                 # alpha = 1: KL 0 at steps 0, 3, 6
    assert np.allclose(reset[[0, 3, 6]], 0.0, atol=1e-15) and np.all(reset[[1, 2, 4, 5, 7, 8]] > 1e-4)
    fixed = ex.ema_anchor_kl(th, 0.5, 100)               # no update in the run: the KL to theta_0
    p = softmax(th, axis=-1)
    assert np.allclose(fixed, rel_entr(p, p[0]).sum(-1), rtol=1e-10, atol=1e-14)


def test_preference_loss_reference_against_the_library():
    for case in _cases("q6"):
        w, lo, rw, rl, beta, link = case.args
        ref = ex.preference_loss(w, lo, rw, rl, beta, link)
        t = [torch.tensor(x) for x in (w, lo, rw, rl)]
        lib = np.array([float(shape.preference_loss(*(x[i:i + 1] for x in t), beta, link))
                        for i in range(len(w))])
        assert np.allclose(ref, lib, rtol=1e-9, atol=1e-12), (link, ref, lib)
    with pytest.raises(ValueError, match="link"):
        ex.preference_loss([0.0], [0.0], [0.0], [0.0], 0.1, "ipo")


# ---------------------------------------------------------------- the notebook and its name
def test_public_check_passes_the_master():
    ns: dict = {}
    for src in _master_cells():
        if not src.startswith("check("):
            exec(compile(src, "<master>", "exec"), ns)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        checker_for(EX)(_ns=ns)
    text = out.getvalue()
    assert "FAILED" not in text and "could not run" not in text, text
    for q in bank.questions(EX):
        if q.kind == "function":
            n = sum(c.public for c in q.cases)
            assert re.search(rf"^{q.id} .*: {n}/{n} public cases pass", text, re.M), (q.id, text)
        else:
            assert re.search(rf"^{q.id} .*: answer", text, re.M), (q.id, text)


def test_start_and_the_grader_find_ex15_by_its_number(tmp_path):
    from klbook_grader.grader import find_exercise
    from klbook_grader.start import resolve, start

    assert resolve("ex15") == resolve("15") == EX
    path = start("ex15", tmp_path)
    assert path.name == f"{EX}.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["klbook"] == {"exercise": EX, "role": "student"}
    assert find_exercise(Path("alice/ex15.ipynb"), {"metadata": {}}, None)[0] == EX


# ---------------------------------------------------------------- classic wrong answers
# (question, function, wrong body, the probe of a failing hidden case, whether the question scores 0)
TRAPS = {
    "Z sums exp(r / beta) only": ("q1", "optimal_policy", '''def optimal_policy(pi_ref, r, beta):
    w = np.exp(np.asarray(r, float) / beta)
    return np.asarray(pi_ref, float) * w / w.sum(axis=-1, keepdims=True)    # the wrong normaliser
''', "a non-uniform reference: what Z sums", True),
    "pi* overflows": ("q1", "optimal_policy", '''def optimal_policy(pi_ref, r, beta):
    w = np.asarray(pi_ref, float) * np.exp(np.asarray(r, float) / beta)     # no shift: inf / inf
    return w / w.sum(axis=-1, keepdims=True)
''', "r / beta of several hundred (overflow)", False),
    "exp(beta r)": ("q1", "optimal_policy", '''def optimal_policy(pi_ref, r, beta):
    s = np.log(np.asarray(pi_ref, float) + 1e-300) + beta * np.asarray(r, float)   # beta on the wrong side
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)
''', "a non-uniform reference: what Z sums", True),
    "eps_high with the wrong sign": ("q3", "clip_higher_surrogate", '''def clip_higher_surrogate(logp, old_logp, advantage, mask, eps_low, eps_high):
    m = np.asarray(mask, float) > 0
    rho = np.exp(np.where(m, np.asarray(logp, float) - np.where(m, np.asarray(old_logp, float), 0.0), 0.0))
    a = np.where(m, np.asarray(advantage, float), 0.0)
    clipped = np.minimum(np.maximum(rho, 1 - eps_low), 1 - eps_high)     # 1 - eps_high as the top
    return np.where(m, np.minimum(rho * a, clipped * a), 0.0)
''', "eps_low = 0.1, eps_high = 0.3: which bound is which, a padded batch", True),
    "the bounds swapped": ("q3", "clip_higher_surrogate", '''def clip_higher_surrogate(logp, old_logp, advantage, mask, eps_low, eps_high):
    m = np.asarray(mask, float) > 0
    rho = np.exp(np.where(m, np.asarray(logp, float) - np.where(m, np.asarray(old_logp, float), 0.0), 0.0))
    a = np.where(m, np.asarray(advantage, float), 0.0)
    clipped = np.clip(rho, 1 - eps_high, 1 + eps_low)                     # eps_low on top
    return np.where(m, np.minimum(rho * a, clipped * a), 0.0)
''', "eps_low = 0.1, eps_high = 0.3: which bound is which, a padded batch", True),
    "the clip without the min": ("q3", "clip_higher_surrogate", '''def clip_higher_surrogate(logp, old_logp, advantage, mask, eps_low, eps_high):
    m = np.asarray(mask, float) > 0
    rho = np.exp(np.where(m, np.asarray(logp, float) - np.where(m, np.asarray(old_logp, float), 0.0), 0.0))
    a = np.where(m, np.asarray(advantage, float), 0.0)
    return np.where(m, np.clip(rho, 1 - eps_low, 1 + eps_high) * a, 0.0)   # no pessimistic minimum
''', "the pessimistic minimum: A < 0 with the ratio above the range, A > 0 below it", True),
    "E[log pi delta], not the covariance": ("q4", "entropy_probe", '''def entropy_probe(logits, delta):
    z, d = np.asarray(logits, float), np.asarray(delta, float)
    def ls(x):
        return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    def h(x):
        lp = ls(x); p = np.exp(lp)
        return -np.where(p > 0, p * np.where(p > 0, lp, 0.0), 0.0).sum(-1)
    lp = np.where(np.isfinite(z), ls(z), 0.0)
    p = np.exp(ls(z))
    return np.stack([h(z), h(z + d) - h(z), -(p * lp * d).sum(-1)])       # not centred
''', "a step whose mean under pi is not 0: a covariance, not E[log pi * delta]", True),
    "0 log 0 = nan": ("q4", "entropy_probe", '''def entropy_probe(logits, delta):
    z, d = np.asarray(logits, float), np.asarray(delta, float)
    def ls(x):
        return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    def h(x):
        lp = ls(x)
        return -(np.exp(lp) * lp).sum(-1)                                 # 0 * -inf = nan
    lp = ls(z); p = np.exp(lp)
    cov = (p * (lp - (p * lp).sum(-1, keepdims=True)) * (d - (p * d).sum(-1, keepdims=True))).sum(-1)
    return np.stack([h(z), h(z + d) - h(z), -cov])
''', "a masked action (logit -inf)", False),
    "the anchor mixes probabilities": ("q5", "ema_anchor_kl", '''def ema_anchor_kl(thetas, alpha, period):
    th = np.asarray(thetas, float)
    P = np.exp(th - th.max(1, keepdims=True)); P /= P.sum(1, keepdims=True)
    anchor, out = P[0].copy(), []
    for k in range(len(P)):
        if k >= 1 and k % period == 0:
            anchor = alpha * P[k] + (1 - alpha) * anchor                  # in probabilities, not logits
        out.append(np.sum(P[k] * (np.log(P[k]) - np.log(anchor))))
    return np.array(out)
''', "period 1: the anchor moves every step, in logits", True),
    "alpha weighs the old anchor": ("q5", "ema_anchor_kl", '''def ema_anchor_kl(thetas, alpha, period):
    th = np.asarray(thetas, float)
    ls = lambda z: z - z.max() - np.log(np.exp(z - z.max()).sum())
    anchor, out = th[0].copy(), []
    for k in range(len(th)):
        if k >= 1 and k % period == 0:
            anchor = (1 - alpha) * th[k] + alpha * anchor                 # alpha on the wrong side
        out.append(np.sum(np.exp(ls(th[k])) * (ls(th[k]) - ls(anchor))))
    return np.array(out)
''', "alpha = 0.3 every 4 steps: which side alpha weighs", True),
    "the KL the wrong way round": ("q5", "ema_anchor_kl", '''def ema_anchor_kl(thetas, alpha, period):
    th = np.asarray(thetas, float)
    ls = lambda z: z - z.max() - np.log(np.exp(z - z.max()).sum())
    anchor, out = th[0].copy(), []
    for k in range(len(th)):
        if k >= 1 and k % period == 0:
            anchor = alpha * th[k] + (1 - alpha) * anchor
        out.append(np.sum(np.exp(ls(anchor)) * (ls(anchor) - ls(th[k]))))   # KL(anchor || pi)
    return np.array(out)
''', "alpha = 0.3 every 4 steps: which side alpha weighs", True),
    "chiPO's link is z": ("q6", "preference_loss", '''def preference_loss(logp_w, logp_l, ref_w, ref_l, beta, link):
    lw = np.asarray(logp_w, float) - np.asarray(ref_w, float)
    ll = np.asarray(logp_l, float) - np.asarray(ref_l, float)
    pw, pl = (lw, ll) if link == "dpo" else (np.exp(lw), np.exp(ll))      # z, not z + log z
    return np.logaddexp(0.0, -beta * (pw - pl))
''', "chiPO on random pairs: the link", True),
    "log sigmoid overflows": ("q6", "preference_loss", '''def preference_loss(logp_w, logp_l, ref_w, ref_l, beta, link):
    lw = np.asarray(logp_w, float) - np.asarray(ref_w, float)
    ll = np.asarray(logp_l, float) - np.asarray(ref_l, float)
    pw, pl = (lw, ll) if link == "dpo" else (np.exp(lw) + lw, np.exp(ll) + ll)
    return -np.log(1.0 / (1.0 + np.exp(-beta * (pw - pl))))               # exp overflows
''', "margins of several hundred (overflow)", False),
}

# one wrong function per question in each grading (the questions are independent), three gradings
ROUNDS = {
    "first": ("Z sums exp(r / beta) only", "eps_high with the wrong sign", "E[log pi delta], not the covariance",
              "the anchor mixes probabilities", "chiPO's link is z"),
    "second": ("pi* overflows", "the clip without the min", "0 log 0 = nan", "alpha weighs the old anchor",
               "log sigmoid overflows"),
    "third": ("exp(beta r)", "the bounds swapped", "the KL the wrong way round"),
}


def test_every_trap_is_graded():
    assert sorted(v for r in ROUNDS.values() for v in r) == sorted(TRAPS)
    for r in ROUNDS.values():
        qids = [TRAPS[v][0] for v in r]
        assert len(set(qids)) == len(qids)


@pytest.mark.parametrize("round_", sorted(ROUNDS))
def test_classic_mistakes_lose_their_points(tmp_path, round_):
    cells = [c for c in _master_cells() if not c.startswith("check(")]
    trapped = {}
    for variant in ROUNDS[round_]:
        qid, name, body, probe, core = TRAPS[variant]
        cells = replace_function(cells, name, body)
        trapped[qid] = (variant, probe, core)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = tmp_path / f"{EX}.ipynb"
    nbformat.write(nb, path)
    result = grade(path)
    assert result["notes"] == [], result["notes"]
    for q in result["questions"]:
        if q["id"] not in trapped:
            assert q["points"] == q["max_points"], (round_, q)
            continue
        variant, probe, core = trapped[q["id"]]
        assert q["points"] < q["max_points"], (variant, q)
        assert any(f"probes: {probe}" in m for m in q["messages"][1:]), (variant, q["messages"])
        if core:
            assert q["points"] == 0 and "no points: core case" in q["messages"][0], (variant, q)
