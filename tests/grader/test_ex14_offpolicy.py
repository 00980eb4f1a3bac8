"""Exercise 14 on off-policy KL: the reference solutions (plain loops, in
klbook_grader/hidden/ex14_offpolicy.py) against autograd and the chapter's library
(klbook_lib.offpolicy), which the references do not call. Grading of the master and the stub is in
tests/grader/test_exercises.py, the classic wrong answers in tests/grader/test_exercise_traps.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from klbook_lib import offpolicy, seqkl
from klbook_grader.hidden import bank
from klbook_grader.hidden import ex14_offpolicy as ex

EX = "ex14_offpolicy_kl"


def _t(x):
    return torch.tensor(np.asarray(x, float), dtype=torch.float64)


def test_registered_with_mixed_kinds_and_explained_letters():
    qs = bank.questions(EX)
    assert [q.id for q in qs] == [f"q{i}" for i in range(1, 8)]
    assert {q.kind for q in qs} == {"function", "choice"}
    assert sum(q.points for q in qs) == 19
    for q in qs:
        if q.kind == "function":
            assert any(c.core for c in q.cases) and sum(not c.public for c in q.cases) >= 3, q.id
        else:
            assert set(q.explain) == set("ABCD") - {q.ref}


def test_attached_k3_reference_against_autograd():
    """Every case of q1: the loss and the gradient of its sum, by autograd on an attached ratio."""
    q1 = next(q for q in bank.questions(EX) if q.id == "q1")
    for case in q1.cases:
        lp, lo, lr, m = (np.asarray(a, float) for a in case.args)
        mask = torch.tensor(m > 0)
        x = _t(lp).requires_grad_(True)
        # pads may hold -inf (the hidden cases plant it): compute on zeros there, so that the
        # masked-out branch has no NaN gradient for torch.where to pass back
        zero = torch.zeros(())
        xs, los, lrs = (torch.where(mask, v, zero) for v in (x, _t(lo), _t(lr)))
        rho = torch.exp(xs - los)
        k3 = torch.exp(lrs - xs) - (lrs - xs) - 1
        loss = torch.where(mask, rho * k3, zero)
        (g,) = torch.autograd.grad(loss.sum(), x)
        ref = ex.attached_k3_probe(lp, lo, lr, m)
        assert np.allclose(ref[0], loss.detach().numpy(), rtol=1e-10, atol=1e-12)
        assert np.allclose(ref[1], g.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("correction", ex.CORRECTIONS)
def test_is_weights_reference_against_the_library(correction):
    space = seqkl.sequence_space(3, 3, eos=0)
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(space.n_prefixes, 3, generator=gen, dtype=torch.float64)
    zs = z + 0.8 * torch.randn(space.n_prefixes, 3, generator=gen, dtype=torch.float64)
    lp, ls = seqkl.token_logprobs(space, z), seqkl.token_logprobs(space, zs)
    m = space.mask.double().numpy()
    C = 1.7
    lib = offpolicy.correction_weights(space, z, zs, correction, C).numpy()
    ref = ex.is_weights(lp.numpy(), np.where(m > 0, ls.numpy(), -np.inf), m, correction, C)
    assert np.allclose(ref, lib, rtol=1e-10, atol=1e-14)


def test_ess_and_gspo_references_against_the_library():
    space = seqkl.sequence_space(3, 3, eos=0)
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(space.n_prefixes, 3, generator=gen, dtype=torch.float64)
    zs = z + 0.5 * torch.randn(space.n_prefixes, 3, generator=gen, dtype=torch.float64)
    index = torch.arange(space.n_sequences)
    lib = offpolicy.batch_mismatch_metrics(space, z, zs, index)["ess_seq"]
    lp, ls = seqkl.token_logprobs(space, z), seqkl.token_logprobs(space, zs)
    m = space.mask.double().numpy()
    assert ex.sequence_ess(lp.numpy(), ls.numpy(), m) == pytest.approx(lib, rel=1e-10)
    assert np.allclose(ex.gspo_ratio(lp.numpy(), ls.numpy(), m),
                       offpolicy.gspo_ratio(lp, ls, space.mask).numpy(), rtol=1e-10)
    # the overflow case: every log W shifted by 800 (on the first token, always real) leaves the ESS
    shifted = lp.numpy().copy()
    shifted[:, 0] += 800.0
    assert ex.sequence_ess(shifted, ls.numpy(), m) == pytest.approx(lib, rel=1e-9)


def test_tv_keep_reference_against_the_library():
    rng = np.random.default_rng(7)
    q = rng.uniform(0.001, 0.999, (40, 9))
    p = np.clip(q + rng.normal(0, 0.3, q.shape), 0.0, 1.0)
    a = rng.choice([-1.0, 0.0, 2.0], q.shape)
    for low, high in ((0.2, 0.2), (0.1, 0.3)):
        lib = offpolicy.trust_region_mask(_t(p), _t(q), _t(a), "tv", low, high).double().numpy()
        assert np.array_equal(ex.tv_keep(p, q, a, low, high), lib)


def test_two_exercises_numbered_14_are_told_apart_by_their_full_names():
    from pathlib import Path

    from klbook_grader.grader import GraderError, find_exercise
    from klbook_grader.start import StartError, resolve

    nb = {"metadata": {}}
    assert find_exercise(Path("alice/ex14_offpolicy_kl.ipynb"), nb, None)[0] == EX
    assert find_exercise(Path("ex14_review-bob.ipynb"), nb, None)[0] == "ex14_review"
    assert find_exercise(Path("ex04.ipynb"), nb, None)[0] == "ex04_estimating_kl"
    with pytest.raises(GraderError, match="several exercises"):
        find_exercise(Path("ex14.ipynb"), nb, None)
    assert resolve("ex14_offpolicy_kl") == EX
    with pytest.raises(StartError, match="several exercises"):
        resolve("14")
