"""Each KL formula is written once in the library, and the one k3 is the accurate one.

k1/k2/k3 live in ``klbook_lib/estimators.py`` (``k*_from_log_ratio``), the categorical KL in
``klbook_lib/divergences.py`` (``kl_from_log_probs``); every other module calls them. The
grader's hidden answer keys (``klbook_lib/grading/hidden``) are left out on purpose: they are
independent references that the students' answers are compared with.
"""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import mpmath
import numpy as np
import pytest
import torch

from klbook_lib import estimators as E
from klbook_lib.divergences import kl_from_log_probs, kl_from_logits

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "klbook_lib"
GRADER = REPO / "klbook_grader"


def _sources(hidden: bool = False) -> dict[str, Path]:
    """Every module of the book's library (named relative to ``klbook_lib/``) and of the
    grader (``klbook_grader/...``); the grader's answer keys (``klbook_grader/hidden``) only
    if ``hidden``."""
    out = {f.relative_to(LIB).as_posix(): f for f in sorted(LIB.rglob("*.py"))}
    out.update({f.relative_to(REPO).as_posix(): f for f in sorted(GRADER.rglob("*.py"))
                if hidden or "hidden" not in f.relative_to(GRADER).parts})
    return out


def _library_code() -> dict[str, list[str]]:
    """Code lines of every library module but the answer keys: docstrings and comments dropped
    (``ast.unparse`` also writes every expression in one canonical spelling)."""
    out = {}
    for rel, f in _sources().items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        out[rel] = ast.unparse(tree).splitlines()
    return out


def _places(pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return [f"{name}:{i + 1}" for name, lines in _library_code().items()
            for i, line in enumerate(lines) if rx.search(line)]


def test_k3_is_written_once():
    # expm1(x) - x (or + x for the negated ratio) is k3; only estimators.py may write it
    k3_places = _places(r"expm1\(\s*(-?\s*\w+)\s*\)\s*[-+]\s*\w+")
    # (one function, k3_from_log_ratio: a torch line and a numpy line)
    assert k3_places and all(p.startswith("estimators.py:") for p in k3_places), k3_places
    assert len(k3_places) <= 2, k3_places
    # the rounding-prone form (ratio - 1) - log_ratio appears nowhere
    assert _places(r"\(\s*ratio\s*-\s*1(\.0)?\s*\)\s*-\s*\w*log") == []
    # nor its other spellings, exp(lr) - 1 - lr
    assert _places(r"(\.exp\(\)|exp\(\s*\w+\s*\))\s*-\s*1(\.0)?\s*\)?\s*-\s*\w+") == []


def test_categorical_kl_is_written_once():
    # p * (log p - log q) over a vocabulary or action set: only divergences.py
    places = _places(r"(\bp\w*|\.exp\(\))\s*\*\s*\(\s*\w*log\w*\s*-\s*\w*log\w*\s*\)")
    assert places and all(p.startswith("divergences.py:") for p in places), places


def _module_aliases(tree: ast.AST) -> set[str]:
    """Names a module binds to other modules of the library (``from . import rewards as R``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith(("klbook_lib", "klbook_grader"))):
            for a in node.names:
                names.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(("klbook_lib", "klbook_grader")):
                    names.add(a.asname or a.name.split(".")[0])
    return names


def test_no_module_uses_another_modules_private_names():
    bad = []
    for rel, f in _sources(hidden=True).items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{rel}:{node.lineno}: from {node.module} import {a.name}")
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{rel}:{node.lineno}: {node.value.id}.{node.attr}")
    assert bad == [], bad


# --------------------------------------------------------------------------- accuracy of k3
def _k3_reference(x: float) -> float:
    """expm1(x) - x in 60-digit arithmetic (mpmath), for the float64/float32 value x."""
    with mpmath.workdps(60):
        v = mpmath.mpf(x)
        return float(mpmath.expm1(v) - v)


LOG_RATIOS = [1e-12, 1e-9, 1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0, 5.0,
              -1e-12, -1e-9, -1e-6, -1e-4, -1e-2, -0.1, -1.0, -5.0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_k3_accurate_at_tiny_log_ratios(dtype):
    """|k3 - exact| <= 4 eps (|lr| + k3): the error of expm1(lr) - lr is a few ulps of lr.

    Near lr = 0, k3 ~ lr^2 / 2 is far below eps * |lr|, so this is the accuracy the subtraction
    allows; the naive (exp(lr) - 1) - lr is off by about eps (one ulp of 1), which at
    |lr| = 1e-4 in float32 is more than twice k3 itself.
    """
    eps = torch.finfo(dtype).eps
    x = torch.tensor(LOG_RATIOS, dtype=dtype)
    got = E.k3_from_log_ratio(x)
    naive = (torch.exp(x) - 1) - x
    for xi, g, n in zip(x.tolist(), got.tolist(), naive.tolist()):
        ref = _k3_reference(xi)
        assert g >= 0.0
        assert abs(g - ref) <= 4 * eps * (abs(xi) + ref), (xi, g, ref)
    # the control: the naive form fails the same bound somewhere in this range
    bad = [xi for xi, n in zip(x.tolist(), naive.tolist())
           if abs(n - _k3_reference(xi)) > 4 * eps * (abs(xi) + _k3_reference(xi))]
    assert bad, "the naive form should lose k3 to rounding near 0"
    # float64: relative error below 1e-6 wherever |lr| >= 1e-9
    if dtype == torch.float64:
        for xi, g in zip(x.tolist(), got.tolist()):
            if abs(xi) >= 1e-9:
                assert g == pytest.approx(_k3_reference(xi), rel=1e-6)


def test_k3_numpy_and_torch_agree_and_checked_form_uses_it():
    lr = np.array([-3.0, -1e-7, 0.0, 2e-5, 0.7])
    assert np.array_equal(E.k3_from_log_ratio(lr), E.k3_from_log_ratio(torch.tensor(lr)).numpy())
    logp = np.log(np.array([0.2, 0.3, 0.5]))
    logq = np.log(np.array([0.25, 0.25, 0.5]))
    assert np.array_equal(E.k3(logp, logq), E.k3_from_log_ratio(logq - logp))
    assert np.array_equal(E.k1(logp, logq), -(logq - logp))
    assert np.array_equal(E.k2(logp, logq), 0.5 * (logq - logp) ** 2)


def test_k3_gradient_is_expm1():
    lr = torch.tensor([-2.0, -1e-3, 1e-3, 0.5], dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(E.k3_from_log_ratio(lr).sum(), lr)
    assert torch.allclose(g, torch.expm1(lr.detach()), rtol=1e-12, atol=1e-15)


def test_estimate_from_log_ratio_dispatches_and_rejects_unknown_names():
    lr = torch.tensor([0.3, -0.2])
    for name, f in (("k1", E.k1_from_log_ratio), ("k2", E.k2_from_log_ratio), ("k3", E.k3_from_log_ratio)):
        assert torch.equal(E.estimate_from_log_ratio(lr, name), f(lr))
    with pytest.raises(ValueError, match="estimator"):
        E.estimate_from_log_ratio(lr, "k4")


# --------------------------------------------------------------------------- the categorical KL
def test_kl_from_log_probs_against_torch_distributions_and_zero_mass():
    from torch.distributions import Categorical, kl_divergence

    g = torch.Generator().manual_seed(3)
    a = torch.randn(20, 7, generator=g, dtype=torch.float64) * 3
    b = torch.randn(20, 7, generator=g, dtype=torch.float64) * 3
    ref = kl_divergence(Categorical(logits=a), Categorical(logits=b))
    got = kl_from_log_probs(torch.log_softmax(a, -1), torch.log_softmax(b, -1))
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-14)
    assert np.allclose(kl_from_log_probs(torch.log_softmax(a, -1).numpy(), torch.log_softmax(b, -1).numpy()),
                       ref.numpy(), rtol=1e-12, atol=1e-14)
    # P = 0 contributes 0 even where Q = 0; P > 0 with Q = 0 is +inf
    lp = torch.tensor([[0.0, -math.inf]])
    assert kl_from_log_probs(lp, torch.tensor([[-math.log(2), -math.log(2)]])).item() == pytest.approx(math.log(2))
    assert kl_from_log_probs(lp, lp).item() == 0.0
    assert math.isinf(kl_from_log_probs(torch.tensor([[-math.log(2), -math.log(2)]]), lp).item())
    # the checked front end agrees and the estimators' reference is the same function
    assert torch.equal(kl_from_logits(a, b), got)
    assert torch.equal(E.exact_kl_categorical(a, b), got)
