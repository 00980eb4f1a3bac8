"""The graded questions of every exercise notebook, with public and hidden test cases.

A question is one of three kinds:

``function``  the student writes a function ``name``; it is called on every case's
              arguments and compared with the reference within ``rtol``/``atol``;
              points are shared equally among the cases (partial credit).
``value``     the student assigns a number or array to the variable ``name``.
``choice``    the student assigns one letter (multiple choice) to ``name``.

Public cases are shown by ``check()`` in the notebook (their expected values are
shipped in ``public_cases.json``); hidden cases are used only by the grader.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from klbook_lib.grading.compare import encode
from klbook_lib.grading.hidden import reference as R


@dataclass(frozen=True)
class Case:
    args: tuple
    public: bool = False
    why: str = ""
    torch: bool = False        # pass array arguments as torch tensors

    def encoded_args(self) -> list:
        """The arguments as plain data; arrays marked ``torch`` arrive as float64 tensors."""
        out = []
        for a in self.args:
            enc = encode(np.asarray(a, dtype=float) if isinstance(a, np.ndarray) else a)
            if self.torch and enc["t"] == "array":
                enc["lib"] = "torch"
            out.append(enc)
        return out

    def call_args(self) -> list:
        return [np.array(a, dtype=float) if isinstance(a, np.ndarray) else a for a in self.args]


@dataclass(frozen=True)
class Question:
    id: str
    title: str
    kind: str                   # "function" | "value" | "choice"
    name: str
    points: int
    ref: Any                    # function, zero-argument function (value) or the letter (choice)
    cases: tuple = ()
    rtol: float = 1e-6
    atol: float = 1e-9
    options: str = "ABCD"

    def expected(self) -> Any:
        if self.kind == "function":
            return [np.asarray(self.ref(*c.call_args()), dtype=float) for c in self.cases]
        if self.kind == "value":
            return np.asarray(self.ref(), dtype=float)
        return self.ref


def _pub(*args, why="", torch=False):
    return Case(tuple(args), public=True, why=why, torch=torch)


def _hid(*args, torch=False):
    return Case(tuple(args), public=False, torch=torch)


def _simplex(rng, k, zeros=0):
    p = rng.dirichlet(np.ones(k))
    if zeros:
        p[rng.choice(k, zeros, replace=False)] = 0.0
        p /= p.sum()
    return p


A = np.array


def _ex01() -> list[Question]:
    rng = np.random.default_rng(101)
    kl_cases = [
        _pub(A([0.5, 0.5]), A([0.9, 0.1]), why="two outcomes"),
        _pub(A([0.2, 0.3, 0.5]), A([0.2, 0.3, 0.5]), why="identical distributions"),
        _pub(A([0.0, 0.4, 0.6]), A([0.1, 0.3, 0.6]), why="p has a zero: 0 log 0 = 0"),
        _pub(A([0.5, 0.5, 0.0]), A([1.0, 0.0, 0.0]), why="q is zero where p is not"),
    ] + [_hid(_simplex(rng, k), _simplex(rng, k)) for k in (3, 5, 10, 50)] + [
        _hid(_simplex(rng, 6, zeros=2), _simplex(rng, 6)),
        _hid(A([0.0, 0.0, 1.0]), A([0.25, 0.25, 0.5])),
        _hid(A([0.3, 0.7, 0.0, 0.0]), A([0.3, 0.0, 0.4, 0.3])),
        _hid(A([1e-12, 1 - 1e-12]), A([0.5, 0.5])),
    ]
    logit_cases = [
        _pub(A([[0.0, 1.0, 2.0]]), A([[2.0, 1.0, 0.0]]), why="one row"),
        _pub(A([[1000.0, 0.0, -1000.0]]), A([[999.0, 0.0, 0.0]]), why="huge logits"),
        _pub(A([[5.0, 5.0], [0.0, 3.0]]), A([[105.0, 105.0], [0.0, 3.0]]), why="shifted logits: KL 0"),
    ] + [_hid(rng.normal(0, s, (4, 7)), rng.normal(0, s, (4, 7))) for s in (1.0, 10.0)] + [
        _hid(A([[-800.0, 800.0, 0.0], [700.0, 701.0, -5.0]]), A([[0.0, 0.0, 0.0], [-700.0, 0.0, 1.0]])),
        _hid(rng.normal(0, 3, (2, 3, 5)), rng.normal(0, 3, (2, 3, 5))),
    ]
    return [
        Question("q1", "kl_categorical", "function", "kl_categorical", 4, R.kl_categorical,
                 tuple(kl_cases), rtol=1e-6, atol=1e-9),
        Question("q2", "KL from logits, numerically stable", "function", "kl_from_logits", 4,
                 R.kl_from_logits, tuple(logit_cases), rtol=1e-6, atol=1e-8),
        Question("q3", "KL between two Gaussians", "value", "answer_q3", 2,
                 lambda: R.gaussian_kl(0.0, 1.0, 1.0, 2.0), rtol=0.0, atol=1e-3),
        Question("q4", "Properties of KL", "choice", "answer_q4", 2, "C"),
    ]


def _ex02() -> list[Question]:
    rng = np.random.default_rng(202)
    fit_cases = [
        _pub(A([0.5, 0.5]), A([-3.0, 3.0]), A([1.0, 1.0]), why="symmetric bimodal target"),
        _pub(A([1.0]), A([2.0]), A([0.5]), why="a single Gaussian fits itself"),
        _pub(A([0.8, 0.2]), A([0.0, 5.0]), A([1.0, 0.5]), why="unequal weights"),
    ]
    for k in (2, 3, 5):
        fit_cases.append(_hid(rng.dirichlet(np.ones(k)), rng.normal(0, 4, k), rng.uniform(0.3, 2, k)))
    mix = ([0.5, 0.5], [-3.0, 3.0], [1.0, 1.0])
    return [
        Question("q1", "Which direction is mode seeking?", "choice", "answer_q1", 2, "B"),
        Question("q2", "The forward-KL Gaussian fit", "function", "forward_kl_gaussian_fit", 4,
                 R.forward_kl_gaussian_fit, tuple(fit_cases), rtol=1e-6, atol=1e-9),
        Question("q3", "Reverse KL of two candidate fits", "value", "answer_q3", 3,
                 lambda: [R.reverse_kl_gauss_to_mixture(3.0, 1.0, *mix),
                          R.reverse_kl_gauss_to_mixture(*R.forward_kl_gaussian_fit(*mix), *mix)],
                 rtol=0.0, atol=1e-3),
        Question("q4", "Covering every mode of an expert", "choice", "answer_q4", 2, "A"),
    ]


def _ex03() -> list[Question]:
    rng = np.random.default_rng(303)
    adapt = [
        _pub(1.0, 0.05, 0.01, why="KL far above target"),
        _pub(1.0, 0.001, 0.01, why="KL far below target"),
        _pub(0.5, 0.012, 0.01, why="KL near target"),
        _hid(0.3, 0.0149, 0.01), _hid(0.3, 0.0151, 0.01), _hid(0.3, 0.0068, 0.01),
        _hid(0.3, 0.0066, 0.01), _hid(2.0, 1.0, 0.02), _hid(2.0, 0.0, 0.02),
    ]
    prop = [
        _pub(0.2, 6.0, 6.0, 256, 10000, why="KL on target"),
        _pub(0.2, 12.0, 6.0, 256, 10000, why="KL twice the target: error clipped to 0.2"),
        _hid(0.2, 3.0, 6.0, 256, 10000), _hid(0.1, 6.6, 6.0, 512, 10000),
        _hid(0.05, 5.7, 6.0, 64, 1000), _hid(1.0, 100.0, 6.0, 10000, 10000),
    ]
    clip = [
        _pub(A([1.0, 1.5, 0.5]), A([1.0, 1.0, 1.0]), 0.2, why="positive advantages"),
        _pub(A([1.0, 1.5, 0.5]), A([-1.0, -1.0, -1.0]), 0.2, why="negative advantages"),
        _hid(rng.lognormal(0, 0.3, 20), rng.normal(0, 1, 20), 0.2),
        _hid(rng.lognormal(0, 0.5, 20), rng.normal(0, 2, 20), 0.1),
        _hid(A([0.8, 1.2, 0.8, 1.2]), A([2.0, 2.0, -2.0, -2.0]), 0.2),
    ]
    return [
        Question("q1", "PPO's adaptive KL coefficient", "function", "adaptive_beta_update", 3,
                 R.adaptive_beta_update, tuple(adapt)),
        Question("q2", "The proportional KL controller", "function", "proportional_beta_update", 3,
                 R.proportional_beta_update, tuple(prop)),
        Question("q3", "The clipped surrogate objective", "function", "ppo_clip_objective", 3,
                 R.ppo_clip_objective, tuple(clip)),
        Question("q4", "Gradient through a clipped sample", "choice", "answer_q4", 2, "B"),
        Question("q5", "What TRPO constrains", "choice", "answer_q5", 2, "A"),
    ]


def _ex04() -> list[Question]:
    rng = np.random.default_rng(404)
    k3_cases = [
        _pub(A([0.0, 0.0]), why="identical log-probabilities"),
        _pub(A([0.5, -0.5, 2.0]), why="a few log-ratios"),
        _pub(A([1e-9, -1e-9]), why="tiny log-ratios: k3 is about lr^2/2"),
        _hid(rng.normal(0, 0.1, 50)), _hid(rng.normal(0, 2, 50)), _hid(A([-30.0, -5.0, 5.0, 10.0])),
    ]
    est_cases = [
        _pub(A([0.1, -0.2, 0.3, -0.4]), why="four samples"),
        _pub(A([0.0]), why="one sample, no difference"),
        _hid(rng.normal(-0.05, 0.3, 200)), _hid(rng.normal(-1.0, 1.5, 1000)),
    ]
    return [
        Question("q1", "The k3 estimator", "function", "k3", 3, R.k3, tuple(k3_cases),
                 rtol=1e-6, atol=1e-12),
        Question("q2", "Averages of k1, k2 and k3", "function", "kl_estimates", 3, R.kl_estimates,
                 tuple(est_cases), rtol=1e-6, atol=1e-12),
        Question("q3", "The bias of k2 for two Gaussians", "value", "answer_q3", 3,
                 lambda: R.k2_bias_gaussian(0.5), rtol=0.0, atol=1e-5),
        Question("q4", "Which estimator can be negative?", "choice", "answer_q4", 2, "A"),
        Question("q5", "Which loss has the forward-KL gradient?", "choice", "answer_q5", 2, "C"),
    ]


def _ex05() -> list[Question]:
    rng = np.random.default_rng(505)
    diag = [
        _pub(A([-1.0, -2.0]), A([-1.0, -2.0]), 0.2, why="no change"),
        _pub(A([-0.9, -2.5, -1.0]), A([-1.0, -2.0, -1.3]), 0.2, why="a small update"),
    ]
    for s in (0.05, 0.3):
        old = rng.normal(-2, 0.5, 64)
        diag.append(_hid(old + rng.normal(0, s, 64), old, 0.2))
    diag.append(_hid(A([-0.1, -5.0, -3.0]), A([-3.0, -0.2, -3.0]), 0.1))
    stop = [
        _pub([0.001, 0.004, 0.02, 0.03], 0.01, why="stops after the third epoch"),
        _pub([0.001, 0.002], 0.01, why="never stops early"),
        _hid([0.0149, 0.0151], 0.01), _hid([0.2, 0.1], 0.01), _hid([], 0.01),
        _hid([0.01, 0.014, 0.016, 0.02, 0.05], 0.01),
    ]
    return [
        Question("q1", "A dashboard of KL statistics", "function", "kl_diagnostics", 4,
                 R.kl_diagnostics, tuple(diag), rtol=1e-6, atol=1e-10),
        Question("q2", "Early stopping on KL", "function", "epochs_before_stop", 3,
                 R.epochs_before_stop, tuple(stop), rtol=0.0, atol=0.0),
        Question("q3", "A sudden KL jump", "choice", "answer_q3", 2, "A"),
        Question("q4", "A negative KL estimate", "choice", "answer_q4", 2, "D"),
    ]


def _ex06() -> list[Question]:
    rng = np.random.default_rng(606)
    shaped = [
        _pub(A([1.0]), A([[-1.0, -2.0]]), A([[-1.0, -2.0]]), 0.1, why="policy equals reference"),
        _pub(A([2.0, 0.0]), A([[-0.5, -0.5], [-3.0, -1.0]]), A([[-1.0, -1.0], [-1.0, -1.0]]), 0.5,
             why="two sequences"),
        _hid(rng.normal(0, 1, 8), rng.normal(-2, 1, (8, 6)), rng.normal(-2, 1, (8, 6)), 0.05),
        _hid(rng.normal(0, 1, 3), rng.normal(-2, 1, (3, 1)), rng.normal(-2, 1, (3, 1)), 1.0),
    ]
    return [
        Question("q1", "The KL-shaped sequence reward", "function", "kl_shaped_reward", 4,
                 R.kl_shaped_reward, tuple(shaped)),
        Question("q2", "The optimal policy of a KL-regularised bandit", "value", "answer_q2", 3,
                 lambda: R.optimal_policy([0.5, 0.3, 0.2], [1.0, 2.0, 0.0], 0.5), rtol=0.0, atol=1e-4),
        Question("q3", "Not a reason for reverse KL", "choice", "answer_q3", 2, "D"),
        Question("q4", "A coefficient that is too small", "choice", "answer_q4", 2, "B"),
    ]


def _ex07() -> list[Question]:
    rng = np.random.default_rng(707)
    tok = [
        _pub(A([1.0]), A([[-1.0, -2.0, -0.5]]), A([[-1.0, -2.0, -0.5]]), A([[1.0, 1.0, 1.0]]), 0.1,
             why="policy equals reference"),
        _pub(A([2.0, -1.0]), A([[-1.0, -1.0, -1.0], [-0.5, -2.0, -9.0]]),
             A([[-2.0, -1.0, -1.5], [-1.0, -1.0, -1.0]]), A([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), 0.2,
             why="second sequence is padded"),
    ]
    for b, t in ((4, 6), (3, 9)):
        mask = (np.arange(t)[None, :] < rng.integers(1, t + 1, b)[:, None]).astype(float)
        tok.append(_hid(rng.normal(0, 1, b), rng.normal(-2, 1, (b, t)), rng.normal(-2, 1, (b, t)), mask, 0.05))
    gae_cases = [
        _pub(A([1.0, 1.0, 1.0]), A([0.0, 0.0, 0.0]), 1.0, 1.0, why="no discount, zero values"),
        _pub(A([0.0, 0.0, 1.0]), A([0.5, 0.5, 0.5]), 0.9, 0.95, why="reward at the end"),
        _hid(rng.normal(0, 1, 10), rng.normal(0, 1, 10), 0.99, 0.95),
        _hid(rng.normal(0, 1, 7), rng.normal(0, 1, 7), 1.0, 0.0),
        _hid(A([5.0]), A([2.0]), 0.99, 0.9),
    ]
    lp = np.log(A([0.6, 0.2, 0.1, 0.1]))
    lr = np.log(A([0.25, 0.25, 0.25, 0.25]))
    return [
        Question("q1", "Per-token rewards", "function", "per_token_rewards", 4,
                 R.per_token_rewards, tuple(tok)),
        Question("q2", "Generalised advantage estimation", "function", "gae", 3, R.gae,
                 tuple(gae_cases)),
        Question("q3", "Exact per-token KL over the vocabulary", "value", "answer_q3", 2,
                 lambda: R.kl_from_logprobs(lp, lr), rtol=0.0, atol=1e-4),
        Question("q4", "Summing per-token log-ratios", "choice", "answer_q4", 2, "A"),
    ]


def _ex08() -> list[Question]:
    rng = np.random.default_rng(808)
    dpo = [
        _pub(A([-1.0]), A([-1.0]), A([-1.0]), A([-1.0]), 0.1, why="no preference yet: log 2", torch=True),
        _pub(A([-1.0, -5.0]), A([-3.0, -2.0]), A([-2.0, -4.0]), A([-2.0, -4.0]), 0.5, why="two pairs",
             torch=True),
        _pub(A([-10.0]), A([-1.0]), A([-1.0]), A([-1500.0]), 1.0, why="huge margin: no inf or NaN",
             torch=True),
        _hid(*(rng.normal(-20, 5, 16) for _ in range(4)), 0.1, torch=True),
        _hid(A([0.0, -3000.0]), A([-3000.0, 0.0]), A([0.0, 0.0]), A([0.0, 0.0]), 1.0, torch=True),
    ]
    elbo = [
        _pub(np.log(A([0.1, 0.3])), A([0.25, 0.75]), why="q is the exact posterior"),
        _pub(np.log(A([0.1, 0.3])), A([0.5, 0.5]), why="a wrong q"),
        _pub(np.log(A([0.2, 0.2, 0.1])), A([0.0, 1.0, 0.0]), why="q puts zero on some z"),
        _hid(rng.normal(-3, 1, 6), _simplex(rng, 6)), _hid(rng.normal(-3, 1, 6), _simplex(rng, 6, 3)),
    ]
    return [
        Question("q1", "The DPO loss", "function", "dpo_loss", 4, R.dpo_loss, tuple(dpo),
                 rtol=1e-6, atol=1e-9),
        Question("q2", "The ELBO of a discrete latent", "function", "elbo_discrete", 3,
                 R.elbo_discrete, tuple(elbo)),
        Question("q3", "DPO's implicit preference probability", "value", "answer_q3", 2,
                 lambda: float(1 / (1 + np.exp(-0.1 * ((-12.0 + 15.0) - (-14.0 + 13.0))))),
                 rtol=0.0, atol=1e-4),
        Question("q4", "What maximising the ELBO minimises", "choice", "answer_q4", 2, "A"),
    ]


def _ex09() -> list[Question]:
    rng = np.random.default_rng(909)
    opt = [
        _pub(A([0.5, 0.5]), A([0.0, 0.0]), 1.0, why="equal rewards: pi* = pi_ref"),
        _pub(A([0.5, 0.3, 0.2]), A([1.0, 0.0, 0.0]), 1.0, why="one better action"),
        _pub(A([0.25, 0.25, 0.5]), A([1.0, 2.0, 0.0]), 1e-3, why="tiny beta: no overflow"),
        _hid(_simplex(rng, 5), rng.normal(0, 1, 5), 0.3), _hid(_simplex(rng, 8), rng.normal(0, 3, 8), 1e-4),
        _hid(_simplex(rng, 4), rng.normal(0, 1, 4), 100.0),
    ]
    frontier = [
        _pub(A([0.5, 0.5]), A([1.0, 0.0]), A([1.0]), why="one beta"),
        _hid(A([0.5, 0.3, 0.2]), A([1.0, 2.0, 0.0]), A([0.1, 0.5, 2.0, 10.0])),
        _hid(_simplex(rng, 6), rng.normal(0, 1, 6), A([0.05, 0.2, 1.0])),
    ]
    return [
        Question("q1", "The optimal policy for a given beta", "function", "optimal_policy", 3,
                 R.optimal_policy, tuple(opt), rtol=1e-6, atol=1e-9),
        Question("q2", "The reward-KL frontier", "function", "kl_reward_frontier", 3,
                 R.kl_reward_frontier, tuple(frontier), rtol=1e-6, atol=1e-9),
        Question("q3", "The beta that hits a KL budget", "value", "answer_q3", 3,
                 lambda: R.beta_for_kl([0.5, 0.3, 0.2], [1.0, 2.0, 0.0], 0.1), rtol=1e-3, atol=0.0),
        Question("q4", "What an adaptive controller does above target", "choice", "answer_q4", 2, "A"),
    ]


def _ex10() -> list[Question]:
    rng = np.random.default_rng(1010)
    pairs_pub = [
        (A([0.5, 0.5]), A([0.5, 0.5]), "identical distributions"),
        (A([1.0, 0.0]), A([0.0, 1.0]), "disjoint supports"),
        (A([0.2, 0.3, 0.5]), A([0.4, 0.4, 0.2]), "three outcomes"),
    ]
    hidden = [(_simplex(rng, 5), _simplex(rng, 5)), (_simplex(rng, 8, 3), _simplex(rng, 8, 2)),
              (A([0.3, 0.7, 0.0]), A([0.0, 0.0, 1.0]))]
    js = [_pub(p, q, why=w) for p, q, w in pairs_pub] + [_hid(p, q) for p, q in hidden]
    tv = [_pub(p, q, why=w) for p, q, w in pairs_pub] + [_hid(p, q) for p, q in hidden]
    w1 = [
        _pub(A([0.0, 1.0, 2.0]), A([1.0, 0.0, 0.0]), A([0.0, 0.0, 1.0]), why="all mass moved by 2"),
        _pub(A([0.0, 1.0]), A([0.5, 0.5]), A([0.5, 0.5]), why="identical"),
        _hid(np.sort(rng.normal(0, 3, 7)), _simplex(rng, 7), _simplex(rng, 7)),
        _hid(A([-1.0, 0.0, 0.5, 4.0]), A([0.1, 0.2, 0.3, 0.4]), A([0.4, 0.3, 0.2, 0.1])),
    ]
    return [
        Question("q1", "Jensen-Shannon divergence", "function", "js_divergence", 3, R.js_divergence,
                 tuple(js), rtol=1e-6, atol=1e-9),
        Question("q2", "Total variation distance", "function", "tv_distance", 2, R.tv_distance,
                 tuple(tv), rtol=1e-6, atol=1e-9),
        Question("q3", "Wasserstein-1 on a line", "function", "wasserstein1", 3, R.wasserstein1,
                 tuple(w1), rtol=1e-6, atol=1e-9),
        Question("q4", "Disjoint supports", "choice", "answer_q4", 2, "C"),
    ]


def _ex11() -> list[Question]:
    rng = np.random.default_rng(1111)
    cases = [
        _pub(np.log(A([[0.5, 0.5]])), np.log(A([[0.9, 0.1]])), why="one row"),
        _pub(A([[-np.inf, 0.0]]), np.log(A([[0.3, 0.7]])), why="log p = -inf contributes 0"),
        _hid(*(np.log(np.stack([_simplex(rng, 5) for _ in range(4)])) for _ in range(2))),
        _hid(A([[0.0, -np.inf, -np.inf], [np.log(0.5), np.log(0.5), -np.inf]]),
             np.log(A([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]))),
        _hid(A([[np.log(0.5), np.log(0.5)]]), A([[0.0, -np.inf]])),
    ]
    return [
        Question("q1", "Why PPO and TRPO constrain KL", "choice", "answer_q1", 2, "B"),
        Question("q2", "A consequence of asymmetry", "choice", "answer_q2", 2, "C"),
        Question("q3", "KL from log-probabilities, batched", "function", "kl_from_logprobs", 4,
                 R.kl_from_logprobs, tuple(cases), rtol=1e-6, atol=1e-9),
        Question("q4", "Reading a KL spike", "choice", "answer_q4", 2, "D"),
        Question("q5", "When forward KL is the right choice", "choice", "answer_q5", 2, "B"),
    ]


_BUILDERS: dict[str, Callable[[], list[Question]]] = {
    "ex01_kl_definition": _ex01, "ex02_forward_reverse": _ex02, "ex03_trpo_ppo": _ex03,
    "ex04_estimating_kl": _ex04, "ex05_kl_in_practice": _ex05, "ex06_rlhf_reverse_kl": _ex06,
    "ex07_token_level_kl": _ex07, "ex08_vi_elbo_dpo": _ex08, "ex09_choosing_beta": _ex09,
    "ex10_other_divergences": _ex10, "ex11_review": _ex11,
}


def exercise_names() -> list[str]:
    return list(_BUILDERS)


def questions(exercise: str) -> list[Question]:
    if exercise not in _BUILDERS:
        raise ValueError(f"exercise: unknown exercise {exercise!r}")
    return _BUILDERS[exercise]()
