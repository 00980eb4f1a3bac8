"""Each KL formula is written once in the library, and the one k3 is the accurate one.

k1/k2/k3 live in ``klbook_lib/estimators.py`` (``k*_from_log_ratio``), the categorical KL in
``klbook_lib/divergences.py`` (``kl_from_log_probs``); every other module calls them. The
categorical KL is searched for in the syntax tree (``p * (log p - log q)`` in any spelling),
and the search is shown to find each of the five private copies issue 33 removed when one is
planted back; the places of PPO's clipped surrogate are pinned the same way. The grader's
training tasks are searched too; its hidden answer keys (``klbook_grader/hidden``) are left out
on purpose: they are independent references that the students' answers are compared with.
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


# --------------------------------------------------------------------------- structural search
# The categorical KL and PPO's clipped surrogate are found in the syntax tree, not by a regular
# expression: a weight times a difference of logs whose first log is the log of that weight
# (``p * (log p - log q)``, ``logp.exp() * (logp - logq)``, ``q[m] * (np.log(q[m]) - t[m])``,
# ``p * log(p / q)``, in either order or sign), or scipy's ``rel_entr``; and ``min``/``max`` of
# two terms one of which clips with bounds ``1 - eps`` and ``1 + eps``.
def _call_name(node: ast.AST) -> str:
    f = node.func if isinstance(node, ast.Call) else None
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _log_of(node: ast.AST) -> ast.AST | None:
    """``x`` when ``node`` is ``log(x)``, ``np.log(x)``, ``x.log()``; else ``None``."""
    if isinstance(node, ast.Call) and _call_name(node) == "log":
        if node.args:
            return node.args[0]
        if isinstance(node.func, ast.Attribute):
            return node.func.value
    return None


def _exp_of(node: ast.AST) -> ast.AST | None:
    """``x`` when ``node`` is ``exp(x)``, ``np.exp(x)``, ``x.exp()``; else ``None``."""
    if isinstance(node, ast.Call) and _call_name(node) == "exp":
        if node.args:
            return node.args[0]
        if isinstance(node.func, ast.Attribute):
            return node.func.value
    return None


def _same(a: ast.AST | None, b: ast.AST | None) -> bool:
    return a is not None and b is not None and ast.dump(a) == ast.dump(b)


def _weights_its_log(weight: ast.AST, term: ast.AST) -> bool:
    """Is ``term`` the log of ``weight`` (``log p`` for ``p``; ``logp`` for ``logp.exp()``)?"""
    return _same(_log_of(term), weight) or _same(_exp_of(weight), term)


def _is_categorical_kl(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and _call_name(node) == "rel_entr":
        return True
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return False
    for weight, other in ((node.left, node.right), (node.right, node.left)):
        if isinstance(other, ast.BinOp) and isinstance(other.op, ast.Sub):
            if _weights_its_log(weight, other.left) or _weights_its_log(weight, other.right):
                return True                                   # p * (log p - log q), or -KL
        inner = _log_of(other)
        if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Div) and _same(inner.left, weight):
            return True                                       # p * log(p / q)
    return False


def _one_plus_or_minus(node: ast.AST) -> str | None:
    if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
            and isinstance(node.left, ast.Constant) and node.left.value == 1):
        return "+" if isinstance(node.op, ast.Add) else "-"
    return None


def _is_clipped_surrogate(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and _call_name(node) in ("min", "max", "minimum", "maximum")
            and len(node.args) == 2):
        return False
    for arg in node.args:
        for sub in ast.walk(arg):
            if isinstance(sub, ast.Call) and _call_name(sub) in ("clamp", "clip", "clamp_"):
                bounds = {_one_plus_or_minus(b) for b in [*sub.args, *(k.value for k in sub.keywords)]}
                if {"+", "-"} <= bounds:
                    return True
    return False


def _find(source: str, rel: str, test) -> list[str]:
    """``rel:function`` of every place in ``source`` where ``test`` holds (the innermost
    enclosing function named; ``<module>`` outside any)."""
    tree = ast.parse(source)
    places = []

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            where = node.name
        if test(node):
            places.append(f"{rel}:{where}")
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(tree, "<module>")
    return places


def _everywhere(test) -> list[str]:
    return [p for rel, f in _sources().items() for p in _find(f.read_text(encoding="utf-8"), rel, test)]


# The one home of the categorical KL. The clipped surrogate is still written in four places
# (issue 33 asks for one; merging them changes the PPO loops, deferred): the list pins them,
# so a fifth copy fails.
SURROGATE_PLACES = ["ppo.py:surrogate_loss", "rlhf/grpo.py:grpo_loss", "rlhf/ppo.py:ppo_step",
                    "shape.py:clipped_bandit_runs"]
# the grader's own reference for exercise 3's KL probe, written apart from the library on
# purpose (like its hidden answer keys): the probe compares a student's loss with it
INDEPENDENT_REFERENCES = ["klbook_grader/tasks/cartpole_kl.py:expected_kl_probe"]


def test_categorical_kl_is_written_once():
    places = [p for p in _everywhere(_is_categorical_kl) if p not in INDEPENDENT_REFERENCES]
    # only divergences.py writes it (kl_from_log_probs; kl and js through scipy's rel_entr)
    assert places and all(p.startswith("divergences.py:") for p in places), places


def test_clipped_surrogate_places_are_pinned():
    assert sorted(set(_everywhere(_is_clipped_surrogate))) == sorted(SURROGATE_PLACES)


# the five private rewrites of the categorical KL that issue 33 found, as they were written
# (optimal._kl, shape.forward_kl_objective, vi._plogp_ratio, rlhf.overopt.bon_kl,
# tasks.ppo_kl_project._exact_kl), and the common spellings a new one could take
PLANTED_KL = {
    # (the mask renamed from ``mask`` to ``keep``: the original line is also a line of a reference
    # solution, which `klbook release` refuses to copy into the students' release)
    "optimal.py": "def _kl(p, q):\n    keep = p > 0\n"
                  "    return float(np.sum(p[keep] * (np.log(p[keep]) - np.log(q[keep]))))\n",
    "shape.py": "def forward_kl_objective(pi, pi_ref, r, beta):\n    p, q = pi, pi_ref\n    s = q > 0\n"
                "    return float(p @ r - beta * np.sum(q[s] * (np.log(q[s]) - np.log(p[s]))))\n",
    "vi.py": "def _plogp_ratio(q, log_target):\n    m = q > 0\n"
             "    return float(np.sum(q[m] * (np.log(q[m]) - log_target[m])))\n",
    "rlhf/overopt.py": "def bon_kl(probs, scores, n):\n    q = bon_distribution(probs, scores, n)\n    on = q > 0\n"
                       "    return float(np.sum(q[on] * (np.log(q[on]) - np.log(p[on]))))\n",
    "klbook_grader/tasks/ppo_kl_project.py":
        "def _exact_kl(lp_old, lp_new):\n    return float((lp_old.exp() * (lp_old - lp_new)).sum(-1).mean())\n",
    "seqkl.py": "def kl_a(lp, lq):\n    return (torch.exp(lp) * (lp - lq)).sum(-1)\n"
                "def kl_b(p, q):\n    return (p * torch.log(p / q)).sum()\n"
                "def kl_c(p, q):\n    return -(p * (q.log() - p.log())).sum()\n"
                "def kl_d(p, q):\n    return special.rel_entr(p, q).sum()\n",
}


@pytest.mark.parametrize("rel", sorted(PLANTED_KL))
def test_the_kl_search_finds_each_planted_rewrite(rel):
    """The test above fails on each of the five rewrites planted back where it was (and on
    other spellings): the search finds it in that module's code."""
    path = _sources()[rel]
    planted = path.read_text(encoding="utf-8") + "\n\n" + PLANTED_KL[rel]
    found = _find(planted, rel, _is_categorical_kl)
    new = [p for p in found if p not in _find(path.read_text(encoding="utf-8"), rel, _is_categorical_kl)]
    assert new, f"a KL planted in {rel} was not found"
    assert not any(p.startswith("divergences.py:") for p in new)   # so the test above fails


def test_the_search_does_not_flag_what_is_not_a_kl():
    not_kl = ("beta * (chosen_log_ratio - rejected_log_ratio)", "adv * (logp - old_logp)",
              "w * (np.log(q) - np.log(p))", "ratio * adv")
    for src in not_kl:
        assert not any(_is_categorical_kl(n) for n in ast.walk(ast.parse(src))), src


@pytest.mark.parametrize("spelling", [
    "torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)",
    "torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef))",
    "np.minimum(r * a, np.clip(r, 1 - e, 1 + e) * a)",
])
def test_the_surrogate_search_finds_a_planted_clipped_surrogate(spelling):
    rel = "monitor.py"
    path = _sources()[rel]
    planted = path.read_text(encoding="utf-8") + f"\n\ndef my_loss(ratio, adv, eps):\n    return {spelling}\n"
    found = set(_find(planted, rel, _is_clipped_surrogate))
    assert found - set(SURROGATE_PLACES) == {"monitor.py:my_loss"}   # the pinned list would no longer match
    assert not _is_clipped_surrogate(ast.parse("torch.clamp(x, 1 - e, 1 + e)").body[0].value)


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


# --------------------------------------------------------------------------- the replaced calls
# The five private copies issue 33 replaced by kl_from_log_probs, written here as they were
# (p * (log p - log q) on the support), as the reference: each public function that used one
# gives the same number to rounding (the library's form weights by exp(log p), which can
# differ from p in the last bit) and the same infinities.
def _old_kl(p, q) -> float:
    m = p > 0
    if np.any(q[m] == 0):
        return math.inf
    return float(np.sum(p[m] * (np.log(p[m]) - np.log(q[m]))))


def _dists(seed: int, n: int = 200):
    rng = np.random.default_rng(seed)
    for t in range(n):
        k = int(rng.integers(2, 12))
        p, q = rng.dirichlet(np.ones(k)), rng.dirichlet(np.ones(k))
        if t % 3 == 0:                               # a zero in pi: 0 log 0
            p[rng.integers(k)] = 0.0
            p /= p.sum()
        if t % 5 == 0:                               # a zero in pi_ref: +inf where pi > 0
            q[rng.integers(k)] = 0.0
            q /= q.sum()
        yield p, q, rng.normal(size=k), float(rng.uniform(0.05, 3.0))


def test_optimal_and_shape_objectives_give_the_numbers_of_their_old_kl():
    from klbook_lib import optimal, shape

    n_inf = 0
    for p, q, r, beta in _dists(1):
        kl = _old_kl(p, q)
        want = -math.inf if math.isinf(kl) else float(p @ r - beta * kl)
        got = optimal.objective(p, q, r, beta)
        n_inf += math.isinf(want)
        assert got == want or got == pytest.approx(want, rel=1e-12, abs=1e-14), (got, want)
        kl_f = _old_kl(q, p)                          # forward: KL(pi_ref || pi)
        want_f = -math.inf if math.isinf(kl_f) else float(p @ r - beta * kl_f)
        got_f = shape.forward_kl_objective(p, q, r, beta)
        assert got_f == want_f or got_f == pytest.approx(want_f, rel=1e-12, abs=1e-14), (got_f, want_f)
    assert n_inf > 0                                  # the infinite case was exercised
    # maximise_objective's KL to the optimum
    q = np.array([0.5, 0.3, 0.2])
    r = np.array([1.0, 0.0, -1.0])
    h = optimal.maximise_objective(q, r, 0.5, steps=30, seed=0)
    pi_star = optimal.optimal_policy(q, r, 0.5)
    assert h["kl_to_optimum"][-1] == pytest.approx(_old_kl(h["pi"], pi_star), rel=1e-12, abs=1e-15)


def test_vi_and_best_of_n_give_the_numbers_of_their_old_kl():
    from scipy.special import logsumexp

    from klbook_lib import vi
    from klbook_lib.rlhf import overopt

    model = vi.squared_latent_model()
    rng = np.random.default_rng(2)
    for t in range(30):
        q = rng.dirichlet(np.ones(model.K))
        if t % 2:
            q[:10] = 0.0
            q /= q.sum()
        x = float(rng.normal())
        lj = model.log_joint(x)
        m = q > 0
        old = float(np.sum(q[m] * (np.log(q[m]) - lj[m])))
        assert vi.elbo(q, model, x) == pytest.approx(-old, rel=1e-12)
        post = lj - logsumexp(lj)
        old_kl = float(np.sum(q[m] * (np.log(q[m]) - post[m])))
        assert vi.kl_to_posterior(q, model, x) == pytest.approx(old_kl, rel=1e-12, abs=1e-14)
    for p, _, s, _ in _dists(3, 60):
        p = np.where(p > 0, p, 1e-3)
        p /= p.sum()
        s = np.round(s) if rng.random() < 0.5 else s   # ties too
        n = int(rng.integers(1, 9))
        old = _old_kl(overopt.bon_distribution(p, s, n), p)
        assert overopt.bon_kl(p, s, n) == pytest.approx(old, rel=1e-12, abs=1e-15)


def test_one_per_token_wrapper():
    """seqkl.kl_estimates and rlhf.rewards.kl_per_token were the same wrapper under two names:
    one function now, estimators.kl_per_token (rlhf.rewards re-exports it for the chapters)."""
    from klbook_lib import seqkl
    from klbook_lib.rlhf import rewards

    assert rewards.kl_per_token is E.kl_per_token
    assert not hasattr(seqkl, "kl_estimates")
    lp = torch.tensor([[-0.2, -1.5, -3.0]], dtype=torch.float64)
    ref = torch.tensor([[-0.7, -0.4, -3.0]], dtype=torch.float64)
    l = lp - ref
    for name, want in (("k1", l), ("k2", l ** 2 / 2), ("k3", torch.exp(-l) - 1 + l)):
        assert torch.allclose(E.kl_per_token(lp, ref, name), want, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="ref_logprobs"):
        E.kl_per_token(lp, ref[:, :2], "k1")
    with pytest.raises(ValueError, match="estimator"):
        E.kl_per_token(lp, ref, "k4")


def test_the_tabular_mathematics_does_not_import_the_trainers():
    """shape.py (chapter 15's tabular mathematics) took dpo_loss from dpo.py, the RLHF trainer's
    module; the formula now lives in objectives.py, which dpo.py re-exports."""
    from klbook_lib import dpo, objectives, shape

    imported = set()
    for node in ast.walk(ast.parse((LIB / "shape.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert "objectives" in imported and not {"dpo", "rlhf", "klbook_lib.dpo"} & imported, imported
    assert shape.dpo_loss is objectives.dpo_loss is dpo.dpo_loss
