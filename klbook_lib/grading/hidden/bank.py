"""The graded questions of every exercise notebook, with public and hidden test cases.

A question is one of three kinds:

``function``  the student writes a function ``name``; it is called on every case's
              arguments and compared with the reference within ``rtol``/``atol``;
              points are shared equally among the cases (partial credit).
``value``     the student assigns a number or array to the variable ``name``.
``choice``    the student assigns one letter (multiple choice) to ``name``.

Public cases are shown by ``check()`` in the notebook (their expected values are
shipped in ``public_cases.json``); hidden cases are used only by the grader. A hidden
case may say what it ``probe``s (a classic mistake it catches, never its answer); the
feedback names it.

Outcome-graded cases (the end-to-end tasks of :mod:`klbook_lib.tasks`) carry a ``judge``:
the student's function trains something in the sandbox and returns plain data (trained
parameters, a history); the judge evaluates it here, in the grader's process, with its
own code (it runs the returned policy itself) and returns a credit in [0, 1] with a
message. ``full_marks_at`` lets a question give full marks before every case passes
(e.g. 3 of 4 training seeds), so that a correct solution does not lose points to the
rare seed on which training is slow.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from klbook_lib.grading import compare
from klbook_lib.grading.compare import encode
from klbook_lib.grading.hidden import reference as R


@dataclass(frozen=True)
class Case:
    args: tuple
    public: bool = False
    why: str = ""
    torch: bool = False        # pass array arguments as torch tensors
    probe: str = ""            # what a hidden case tests (shown in the feedback, not the answer)
    judge: Callable | None = None   # outcome-graded: judge(plain result) -> (credit, message)

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


def plain(data: Any) -> Any:
    """Encoded answer data as Python values: arrays as float64 numpy arrays, lists as lists."""
    if not isinstance(data, dict):
        raise TypeError("malformed answer data")
    t = data.get("t")
    if t == "list":
        return [plain(x) for x in data.get("v", [])]
    if t in ("num", "bool", "array"):
        return compare.to_numeric(data)
    if t == "str":
        return str(data.get("v", ""))
    if t == "none":
        return None
    raise TypeError(f"a value of type {data.get('type', t)}")


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
    # Limits of the sandbox for this question (None: the grader's defaults). ``timeout`` is
    # seconds per call of the student's function (or to read a value); ``memory_mb`` raises
    # the address-space limit of the sandbox's processes (one limit per run: the largest).
    timeout: float | None = None
    memory_mb: int | None = None
    # klbook_lib modules the sandbox offers for this question (e.g. "klbook_lib.ppo" for a task
    # that trains with the book's PPO); by default only the public checker and runtime.
    library: tuple = ()
    # Full marks once the cases' credits add up to this many (None: all cases).
    full_marks_at: int | None = None
    # What check() runs for an outcome-graded question in the student's notebook: dicts with
    # the function's "args", the task "module" and its "judge" (called with "kwargs").
    public_checks: tuple = ()

    def expected(self) -> Any:
        if self.kind == "function":
            return [np.asarray(self.ref(*c.call_args()), dtype=float) if c.judge is None
                    else np.asarray(np.nan) for c in self.cases]
        if self.kind == "value":
            return np.asarray(self.ref(), dtype=float)
        return self.ref

    def judge_case(self, case: Case, expected: Any, got: Any) -> tuple[float, str]:
        """Credit in [0, 1] and a message for one case's answer (the grader calls this)."""
        if case.judge is not None:
            try:
                credit, why = case.judge(plain(got))
            except Exception as exc:  # noqa: BLE001 - a malformed result scores 0, never crashes
                return 0.0, f"the result could not be evaluated: {type(exc).__name__}: {exc}"
            return float(min(1.0, max(0.0, credit))), why
        ok, why = compare.compare_numeric(expected, got, self.rtol, self.atol, reveal=case.public)
        return (1.0 if ok else 0.0), why


def _outcome(*args, **kwargs):
    raise RuntimeError("an outcome-graded question has no reference value")


def _pub(*args, why="", torch=False):
    return Case(tuple(args), public=True, why=why, torch=torch)


def _hid(*args, torch=False, probe=""):
    return Case(tuple(args), public=False, torch=torch, probe=probe)


def _task(*args, judge, probe=""):
    return Case(tuple(args), public=False, probe=probe, judge=judge)


def _lazy_judge(module: str, name: str, **kwargs) -> Callable:
    """A judge from a task module, imported only when a result is judged (they import torch)."""
    def judge(result):
        import importlib

        return getattr(importlib.import_module(module), name)(result, **kwargs)
    return judge


def _simplex(rng, k, zeros=0):
    p = rng.dirichlet(np.ones(k))
    if zeros:
        p[rng.choice(k, zeros, replace=False)] = 0.0
        p /= p.sum()
    return p


A = np.array


REL = dict(rtol=1e-3, atol=0.0)     # hand-computed numbers: three significant figures


def _ex01() -> list[Question]:
    rng = np.random.default_rng(101)
    kl_cases = [
        _pub(A([0.5, 0.5]), A([0.9, 0.1]), why="two outcomes"),
        _pub(A([0.2, 0.3, 0.5]), A([0.2, 0.3, 0.5]), why="identical distributions"),
        _pub(A([0.0, 0.4, 0.6]), A([0.1, 0.3, 0.6]), why="p has a zero: 0 log 0 = 0"),
        _pub(A([0.5, 0.5, 0.0]), A([1.0, 0.0, 0.0]), why="q is zero where p is not"),
    ] + [_hid(_simplex(rng, k), _simplex(rng, k)) for k in (3, 5, 10, 50)] + [
        _hid(_simplex(rng, 6, zeros=2), _simplex(rng, 6), probe="zeros in p"),
        _hid(A([0.0, 0.0, 1.0]), A([0.25, 0.25, 0.5]), probe="zeros in p"),
        _hid(A([0.3, 0.7, 0.0, 0.0]), A([0.3, 0.0, 0.4, 0.3]), probe="q = 0 where p > 0"),
        _hid(A([1e-12, 1 - 1e-12]), A([0.5, 0.5]), probe="a probability of 1e-12"),
    ]
    logit_cases = [
        _pub(A([[0.0, 1.0, 2.0]]), A([[2.0, 1.0, 0.0]]), why="one row"),
        _pub(A([[1000.0, 0.0, -1000.0]]), A([[999.0, 0.0, 0.0]]), why="huge logits"),
        _pub(A([[5.0, 5.0], [0.0, 3.0]]), A([[105.0, 105.0], [0.0, 3.0]]), why="shifted logits: KL 0"),
    ] + [_hid(rng.normal(0, s, (4, 7)), rng.normal(0, s, (4, 7))) for s in (1.0, 10.0)] + [
        _hid(A([[-800.0, 800.0, 0.0], [700.0, 701.0, -5.0]]), A([[0.0, 0.0, 0.0], [-700.0, 0.0, 1.0]]),
             probe="logits of size 800: exp overflows"),
        _hid(rng.normal(0, 3, (2, 3, 5)), rng.normal(0, 3, (2, 3, 5)), probe="a 3-d batch"),
    ]
    return [
        Question("q1", "kl_categorical", "function", "kl_categorical", 4, R.kl_categorical,
                 tuple(kl_cases), rtol=1e-6, atol=1e-9),
        Question("q2", "KL from logits, numerically stable", "function", "kl_from_logits", 4,
                 R.kl_from_logits, tuple(logit_cases), rtol=1e-6, atol=1e-8),
        Question("q3", "KL between two Gaussians", "value", "answer_q3", 2,
                 lambda: R.gaussian_kl(0.0, 1.0, 1.0, 2.0), **REL),
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
        fit_cases.append(_hid(rng.dirichlet(np.ones(k)), rng.normal(0, 4, k), rng.uniform(0.3, 2, k),
                              probe="the variance includes the spread of the means"))
    mix = ([0.5, 0.5], [-3.0, 3.0], [1.0, 1.0])
    return [
        Question("q1", "Which direction is mode seeking?", "choice", "answer_q1", 2, "B"),
        Question("q2", "The forward-KL Gaussian fit", "function", "forward_kl_gaussian_fit", 4,
                 R.forward_kl_gaussian_fit, tuple(fit_cases), rtol=1e-6, atol=1e-9),
        Question("q3", "Reverse KL of two candidate fits", "value", "answer_q3", 3,
                 lambda: [R.reverse_kl_gauss_to_mixture(3.0, 1.0, *mix),
                          R.reverse_kl_gauss_to_mixture(*R.forward_kl_gaussian_fit(*mix), *mix)],
                 **REL),
        Question("q4", "Covering every mode of an expert", "choice", "answer_q4", 2, "A"),
    ]


CARTPOLE_LIBRARY = ("klbook_lib.ppo", "klbook_lib.envs", "klbook_lib.monitor",
                    "klbook_lib.tasks")


def _ex03() -> list[Question]:
    rng = np.random.default_rng(303)
    adapt = [
        _pub(1.0, 0.05, 0.01, why="KL far above target"),
        _pub(1.0, 0.001, 0.01, why="KL far below target"),
        _pub(0.5, 0.012, 0.01, why="KL near target"),
        _hid(0.3, 0.0149, 0.01, probe="just inside the band"), _hid(0.3, 0.0151, 0.01, probe="just above the band"),
        _hid(0.3, 0.0068, 0.01, probe="just inside the band"), _hid(0.3, 0.0066, 0.01, probe="just below the band"),
        _hid(2.0, 1.0, 0.02), _hid(2.0, 0.0, 0.02, probe="a KL of exactly 0"),
    ]
    prop = [
        _pub(0.2, 6.0, 6.0, 256, 10000, why="KL on target"),
        _pub(0.2, 12.0, 6.0, 256, 10000, why="KL twice the target: error clipped to 0.2"),
        _hid(0.2, 3.0, 6.0, 256, 10000, probe="the error clipped from below"), _hid(0.1, 6.6, 6.0, 512, 10000),
        _hid(0.05, 5.7, 6.0, 64, 1000), _hid(1.0, 100.0, 6.0, 10000, 10000),
    ]
    clip = [
        _pub(A([1.0, 1.5, 0.5]), A([1.0, 1.0, 1.0]), 0.2, why="positive advantages"),
        _pub(A([1.0, 1.5, 0.5]), A([-1.0, -1.0, -1.0]), 0.2, why="negative advantages"),
        _hid(rng.lognormal(0, 0.3, 20), rng.normal(0, 1, 20), 0.2),
        _hid(rng.lognormal(0, 0.5, 20), rng.normal(0, 2, 20), 0.1),
        _hid(A([0.8, 1.2, 0.8, 1.2]), A([2.0, 2.0, -2.0, -2.0]), 0.2, probe="ratios on the edge of the clip range"),
        _hid(A([0.5, 1.5, 0.5, 1.5]), A([2.0, 2.0, -2.0, -2.0]), 0.2,
             probe="ratios outside the clip range, both signs of the advantage (the clip and the min)"),
    ]
    hess = [
        _pub(A([0.0, 0.0]), why="two equal logits"),
        _pub(A([1.0, 2.0, 3.0]), why="three actions"),
        _hid(rng.normal(0, 1, 5)), _hid(rng.normal(0, 3, 8)),
        _hid(A([1000.0, 999.0, -1000.0]), probe="logits of size 1000: exp overflows"),
        _hid(A([30.0, 0.0, 0.0, 0.0]), probe="a nearly deterministic policy"),
    ]
    def _batch(n, k, s_new, s_old):
        old = rng.normal(0, 1, (n, k))
        return old + rng.normal(0, s_new, (n, k)), old, rng.integers(0, k, n).astype(float), rng.normal(0, 1, n)
    pen = [
        _pub(A([[0.0, 0.0], [1.0, -1.0]]), A([[0.0, 0.0], [1.0, -1.0]]), A([0.0, 1.0]), A([1.0, -2.0]), 0.5, 0.2,
             why="pi_theta = pi_old: ratio 1, KL 0", torch=True),
        _pub(A([[0.3, 0.0], [0.0, 0.2]]), A([[0.0, 0.0], [0.0, 0.0]]), A([0.0, 1.0]), A([1.0, -1.0]), 1.0, 0.2,
             why="a small step", torch=True),
        _hid(*_batch(16, 2, 0.05, 1.0), 1.0, 0.2, torch=True),
        _hid(*_batch(32, 4, 0.8, 1.0), 0.1, 0.2, torch=True,
             probe="a policy that moved beyond the clip range (the clip and the min)"),
        _hid(A([[2.0, -1.0, 0.0], [0.0, 3.0, -2.0]]), A([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), A([0.0, 2.0]),
             A([0.0, 0.0]), 2.0, 0.2, torch=True,
             probe="zero advantages: only the KL term, whose direction matters"),
        _hid(*_batch(64, 3, 0.3, 1.0), 0.7, 0.3, torch=True, probe="a mean over states, not a sum"),
    ]
    seeds = (0, 1, 3, 4)
    train = [_task(s, judge=_lazy_judge("klbook_lib.tasks.cartpole_kl", "judge", eval_seed=900_000 + s),
                   probe=f"training seed {s}") for s in seeds]
    return [
        Question("q1", "PPO's adaptive KL coefficient", "function", "adaptive_beta_update", 3,
                 R.adaptive_beta_update, tuple(adapt)),
        Question("q2", "The proportional KL controller", "function", "proportional_beta_update", 3,
                 R.proportional_beta_update, tuple(prop)),
        Question("q3", "The clipped surrogate objective", "function", "ppo_clip_objective", 3,
                 R.ppo_clip_objective, tuple(clip)),
        Question("q4", "Gradient through a clipped sample", "choice", "answer_q4", 2, "B"),
        Question("q5", "What TRPO constrains", "choice", "answer_q5", 2, "A"),
        Question("q6", "The Fisher matrix is the Hessian of KL", "function", "kl_hessian", 3,
                 R.kl_hessian_autograd, tuple(hess), rtol=1e-6, atol=1e-10),
        Question("q7", "A KL-penalty PPO loss", "function", "kl_penalty_loss", 4, R.kl_penalty_loss,
                 tuple(pen), rtol=1e-6, atol=1e-10),
        Question("q8", "Train CartPole with your loss and your beta rule", "function", "train_cartpole", 6,
                 _outcome, tuple(train), timeout=30.0, library=CARTPOLE_LIBRARY, full_marks_at=3,
                 public_checks=(dict(args=[100], module="klbook_lib.tasks.cartpole_kl", judge="judge", kwargs={'eval_seed': 7}, why="training seed 100"),)),
    ]


def _ex04() -> list[Question]:
    rng = np.random.default_rng(404)
    k3_cases = [
        _pub(A([0.0, 0.0]), why="identical log-probabilities"),
        _pub(A([0.5, -0.5, 2.0]), why="a few log-ratios"),
        _pub(A([1e-9, -1e-9]), why="tiny log-ratios: k3 is about lr^2/2"),
        _hid(rng.normal(0, 0.1, 50)), _hid(rng.normal(0, 2, 50)),
        _hid(A([-30.0, -5.0, 5.0, 10.0]), probe="large log-ratios of both signs"),
    ]
    est_cases = [
        _pub(A([0.1, -0.2, 0.3, -0.4]), why="four samples"),
        _pub(A([0.0]), why="one sample, no difference"),
        _hid(rng.normal(-0.05, 0.3, 200)), _hid(rng.normal(-1.0, 1.5, 1000)),
    ]
    grads = [
        _pub(A([0.0, 0.0]), A([0.0, 0.0]), why="p = q: every gradient is 0"),
        _pub(A([1.0, 0.0, -1.0]), A([0.0, 0.0, 0.0]), why="three tokens, uniform reference"),
        _hid(rng.normal(0, 1, 5), rng.normal(0, 1, 5)),
        _hid(rng.normal(0, 2, 10), rng.normal(0, 2, 10)),
        _hid(A([4.0, 0.0, 0.0]), A([0.0, 0.0, 4.0]), probe="a policy far from its reference"),
        _hid(A([1000.0, 1001.0, 0.0]), A([0.0, 0.0, 0.0]), probe="logits of size 1000: exp overflows"),
    ]
    return [
        Question("q1", "The k3 estimator", "function", "k3", 3, R.k3, tuple(k3_cases),
                 rtol=1e-6, atol=1e-12),
        Question("q2", "Averages of k1, k2 and k3", "function", "kl_estimates", 3, R.kl_estimates,
                 tuple(est_cases), rtol=1e-6, atol=1e-12),
        Question("q3", "The bias of k2 for two Gaussians", "value", "answer_q3", 3,
                 lambda: R.k2_bias_gaussian(0.5), **REL),
        Question("q4", "Which estimator can be negative?", "choice", "answer_q4", 2, "A"),
        Question("q5", "Which loss has the forward-KL gradient?", "choice", "answer_q5", 2, "C"),
        Question("q6", "Expected gradients of k1, k2, k3 in the reward and in the loss", "function",
                 "kl_gradients", 4, R.kl_gradients_autograd, tuple(grads), rtol=1e-6, atol=1e-10),
    ]


TOKEN_TRAINER_LIBRARY = ("klbook_lib.seqkl", "klbook_lib.tasks")


@functools.lru_cache(maxsize=1)
def _trainer_probes() -> tuple:
    """Hidden inputs for the parts of exercise 5's trainer, from the toy problem's responses."""
    from klbook_lib.tasks import token_trainer as tt

    rng = np.random.default_rng(5050)
    sp = tt.space()
    # responses of every length, as a batch the trainer would see (right-padded)
    lengths = sp.mask.sum(1).numpy()
    pools = [np.nonzero(lengths == n)[0] for n in (1, 2, 3, 4)]
    idx = np.concatenate([rng.choice(p, 2, replace=len(p) < 2) for p in pools])
    tokens, rows, mask = (sp.sequences[idx].numpy().astype(float), sp.prefix_index[idx].numpy().astype(float),
                          sp.mask[idx].numpy().astype(float))
    logits = rng.normal(0, 1.5, (sp.n_prefixes, sp.vocab_size))
    logp = np.where(mask > 0, -rng.uniform(0.1, 2.0, mask.shape), 0.0)
    ref_logp = np.where(mask > 0, -rng.uniform(0.1, 2.0, mask.shape), 0.0)
    new_logp = np.where(mask > 0, logp + rng.normal(0, 0.3, mask.shape), 0.0)
    adv = np.where(mask > 0, rng.normal(0, 1, mask.shape), 0.0)
    n = len(idx)
    return (
        _hid("token_logprobs", logits, tokens, rows, mask, tt.TEMPERATURE, torch=True,
             probe="log-probabilities of sampled tokens"),
        _hid("sequence_rewards", rng.normal(0, 1, n), logp, ref_logp, mask, tt.BETA, torch=True,
             probe="the KL term of the reward of responses of different lengths"),
        _hid("place_on_last_token", rng.normal(0, 1, n), mask, torch=True,
             probe="where each response's reward is paid"),
        _hid("ppo_loss", new_logp, logp, adv, mask, 0.2, torch=True,
             probe="the clipped surrogate of a policy that has moved"),
        _task("train", 11, judge=_lazy_judge("klbook_lib.tasks.token_trainer", "judge_trust_region"),
              probe="a training run: the clip acts and every update stays small"),
        _task("train", 12, judge=_lazy_judge("klbook_lib.tasks.token_trainer", "judge_objective"),
              probe="a training run: the objective it reaches"),
    )


def _trainer_reference(part, *args):
    if part == "train":
        return _outcome()
    return R.trainer_part(part, *args)


def _ex05() -> list[Question]:
    rng = np.random.default_rng(505)
    diag = [
        _pub(A([-1.0, -2.0]), A([-1.0, -2.0]), 0.2, why="no change"),
        _pub(A([-0.9, -2.5, -1.0]), A([-1.0, -2.0, -1.3]), 0.2, why="a small update"),
    ]
    for s in (0.05, 0.3):
        old = rng.normal(-2, 0.5, 64)
        diag.append(_hid(old + rng.normal(0, s, 64), old, 0.2))
    diag.append(_hid(A([-0.1, -5.0, -3.0]), A([-3.0, -0.2, -3.0]), 0.1, probe="large log-ratios"))
    # ratios in the gaps: 1.21 and 1.215 exceed 1 + eps but not exp(eps) = 1.2214; 0.81 is above
    # 1 - eps but below exp(-eps) = 0.8187. Clipped by |r - 1|: 2 of 5; by |log r|: 1 of 5.
    gap = np.log(A([1.21, 1.215, 0.81, 0.95, 1.0]))
    diag.append(_hid(gap - 1.0, np.full(5, -1.0), 0.2,
                     probe="ratios between 1 + eps and exp(eps), and between exp(-eps) and 1 - eps"))
    stop = [
        _pub([0.001, 0.004, 0.02, 0.03], 0.01, why="stops after the third epoch"),
        _pub([0.001, 0.002], 0.01, why="never stops early"),
        _hid([0.0149, 0.0151], 0.01, probe="just above 1.5 x target"), _hid([0.2, 0.1], 0.01),
        _hid([], 0.01, probe="no epoch at all"),
        _hid([0.01, 0.014, 0.016, 0.02, 0.05], 0.01),
    ]
    return [
        Question("q1", "A dashboard of KL statistics", "function", "kl_diagnostics", 4,
                 R.kl_diagnostics, tuple(diag), rtol=1e-6, atol=1e-10),
        Question("q2", "Early stopping on KL", "function", "epochs_before_stop", 3,
                 R.epochs_before_stop, tuple(stop), rtol=0.0, atol=0.0),
        Question("q3", "A sudden KL jump", "choice", "answer_q3", 2, "A"),
        Question("q4", "A negative KL estimate", "choice", "answer_q4", 2, "D"),
        Question("q5", "Debug the broken trainer", "function", "run_probe", 12, _trainer_reference,
                 _trainer_probes(), rtol=1e-6, atol=1e-9, timeout=20.0, library=TOKEN_TRAINER_LIBRARY,
                 public_checks=(dict(args=['train', 100], module="klbook_lib.tasks.token_trainer", judge="judge_trust_region", kwargs={}, why="a training run (seed 100): trust region"),
                                dict(args=['train', 100], module="klbook_lib.tasks.token_trainer", judge="judge_objective", kwargs={}, why="a training run (seed 100): objective"))),
    ]


def _ex06() -> list[Question]:
    rng = np.random.default_rng(606)
    shaped = [
        _pub(A([1.0]), A([[-1.0, -2.0]]), A([[-1.0, -2.0]]), 0.1, why="policy equals reference"),
        _pub(A([2.0, 0.0]), A([[-0.5, -0.5], [-3.0, -1.0]]), A([[-1.0, -1.0], [-1.0, -1.0]]), 0.5,
             why="two sequences"),
        _hid(rng.normal(0, 1, 8), rng.normal(-2, 1, (8, 6)), rng.normal(-2, 1, (8, 6)), 0.05,
             probe="the KL summed over tokens, not averaged"),
        _hid(rng.normal(0, 1, 3), rng.normal(-2, 1, (3, 1)), rng.normal(-2, 1, (3, 1)), 1.0),
    ]
    return [
        Question("q1", "The KL-shaped sequence reward", "function", "kl_shaped_reward", 4,
                 R.kl_shaped_reward, tuple(shaped)),
        Question("q2", "The optimal policy of a KL-regularised bandit", "value", "answer_q2", 3,
                 lambda: R.optimal_policy([0.5, 0.3, 0.2], [1.0, 2.0, 0.0], 0.5), **REL),
        Question("q3", "Not a reason for reverse KL", "choice", "answer_q3", 2, "D"),
        Question("q4", "A coefficient that is too small", "choice", "answer_q4", 2, "B"),
    ]


MICRO_RLHF_LIBRARY = ("klbook_lib.rlhf", "klbook_lib.tasks")


def _padded_mask(rng, b, t, lo=1):
    return (np.arange(t)[None, :] < rng.integers(lo, t + 1, b)[:, None]).astype(float)


def _ex07() -> list[Question]:
    rng = np.random.default_rng(707)
    tok = [
        _pub(A([[-1.0, -2.0, -0.5]]), A([[-1.0, -2.0, -0.5]]), A([1.0]), A([[1.0, 1.0, 1.0]]), 0.1,
             why="policy equals reference"),
        _pub(A([[-1.0, -1.0, -1.0], [-0.5, -2.0, -9.0]]), A([[-2.0, -1.0, -1.5], [-1.0, -1.0, -1.0]]),
             A([2.0, -1.0]), A([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), 0.2, why="second sequence is padded"),
    ]
    for b, t in ((4, 6), (3, 9)):
        tok.append(_hid(rng.normal(-2, 1, (b, t)), rng.normal(-2, 1, (b, t)), rng.normal(0, 1, b),
                        _padded_mask(rng, b, t), 0.05))
    lp = np.where(_padded_mask(rng, 4, 7) > 0, rng.normal(-2, 1, (4, 7)), -np.inf)
    m = (lp > -np.inf).astype(float)
    tok.append(_hid(lp, rng.normal(-2, 1, (4, 7)), rng.normal(0, 1, 4), m, 0.1,
                    probe="-inf log-probabilities on padded positions"))
    left = A([[0.0, 0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    tok.append(_hid(rng.normal(-2, 1, (3, 5)), rng.normal(-2, 1, (3, 5)), rng.normal(0, 1, 3), left, 0.1,
                    probe="left-padded rows: the last real token comes from the mask"))
    full = _padded_mask(rng, 3, 5)
    full[1] = 0.0
    tok.append(_hid(rng.normal(-2, 1, (3, 5)), rng.normal(-2, 1, (3, 5)), rng.normal(0, 1, 3), full, 0.1,
                    probe="a fully padded row (no response token)"))
    gae_cases = [
        _pub(A([1.0, 1.0, 1.0]), A([0.0, 0.0, 0.0]), 1.0, 1.0, why="no discount, zero values"),
        _pub(A([0.0, 0.0, 1.0]), A([0.5, 0.5, 0.5]), 0.9, 0.95, why="reward at the end"),
        _hid(rng.normal(0, 1, 10), rng.normal(0, 1, 10), 0.99, 0.95),
        _hid(rng.normal(0, 1, 7), rng.normal(0, 1, 7), 1.0, 0.0, probe="lambda = 0: one-step TD errors"),
        _hid(A([5.0]), A([2.0]), 0.99, 0.9, probe="a single step"),
        _hid(rng.normal(0, 1, 300), rng.normal(0, 1, 300), 0.95, 0.9, probe="gamma < 1 on a long sequence"),
    ]
    def _junk(mask, x):
        return np.where(mask > 0, x, 1e6)
    mg = []
    m1 = A([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    mg.append(_pub(A([[0.0, 0.0, 1.0, 0.0], [0.5, -1.0, 0.0, 0.0]]), A([[0.1, 0.2, 0.3, 0.0], [0.0, 0.5, 0.0, 0.0]]),
                   m1, 1.0, 0.95, why="two right-padded rows"))
    m2 = _padded_mask(rng, 5, 8)
    mg.append(_hid(rng.normal(0, 1, (5, 8)) * m2, rng.normal(0, 1, (5, 8)) * m2, m2, 1.0, 0.95))
    m3 = _padded_mask(rng, 4, 6)
    mg.append(_hid(_junk(m3, rng.normal(0, 1, (4, 6))), _junk(m3, rng.normal(0, 1, (4, 6))), m3, 1.0, 0.95,
                   probe="junk rewards and values on padded positions"))
    m4 = _padded_mask(rng, 3, 5)
    m4[2] = 0.0
    mg.append(_hid(rng.normal(0, 1, (3, 5)) * m4, rng.normal(0, 1, (3, 5)) * m4, m4, 0.99, 0.9,
                   probe="a fully padded row (no response token)"))
    m5 = _padded_mask(rng, 3, 200, lo=150)
    mg.append(_hid(rng.normal(0, 1, (3, 200)) * m5, rng.normal(0, 1, (3, 200)) * m5, m5, 0.95, 0.9,
                   probe="gamma < 1 on long sequences"))
    lp3 = np.log(A([0.6, 0.2, 0.1, 0.1]))
    lr3 = np.log(A([0.25, 0.25, 0.25, 0.25]))
    train = [_task(s, judge=_lazy_judge("klbook_lib.tasks.micro_rlhf", "judge_rlhf", eval_seed=700_000 + s),
                   probe=f"training seed {s}") for s in (0, 1, 2, 3)]
    return [
        Question("q1", "Per-token rewards", "function", "per_token_rewards", 4,
                 R.per_token_rewards, tuple(tok)),
        Question("q2", "Generalised advantage estimation", "function", "gae", 3, R.gae,
                 tuple(gae_cases)),
        Question("q3", "Exact per-token KL over the vocabulary", "value", "answer_q3", 2,
                 lambda: R.kl_from_logprobs(lp3, lr3), **REL),
        Question("q4", "Summing per-token log-ratios", "choice", "answer_q4", 2, "A"),
        Question("q5", "GAE on a padded batch", "function", "masked_gae", 4, R.masked_gae, tuple(mg)),
        Question("q6", "Train a micro GPT-2 with your reward and your GAE", "function", "train_rlhf", 6,
                 _outcome, tuple(train), timeout=40.0, library=MICRO_RLHF_LIBRARY, full_marks_at=3,
                 public_checks=(dict(args=[100], module="klbook_lib.tasks.micro_rlhf", judge="judge_rlhf", kwargs={'eval_seed': 7}, why="training seed 100"),)),
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
        _hid(A([0.0, -3000.0]), A([-3000.0, 0.0]), A([0.0, 0.0]), A([0.0, 0.0]), 1.0, torch=True,
             probe="margins of +-3000: -log(sigmoid) computed naively overflows"),
    ]
    elbo = [
        _pub(np.log(A([0.1, 0.3])), A([0.25, 0.75]), why="q is the exact posterior"),
        _pub(np.log(A([0.1, 0.3])), A([0.5, 0.5]), why="a wrong q"),
        _pub(np.log(A([0.2, 0.2, 0.1])), A([0.0, 1.0, 0.0]), why="q puts zero on some z"),
        _hid(rng.normal(-3, 1, 6), _simplex(rng, 6)),
        _hid(rng.normal(-3, 1, 6), _simplex(rng, 6, 3), probe="q(z) = 0 for some z"),
    ]
    grad = [
        _pub(A([0.0, 0.0]), A([0.0, 0.0]), [0], [1], 1.0, why="one pair, policy = reference"),
        _pub(A([1.0, 0.0, -1.0]), A([0.0, 0.0, 0.0]), [0, 2], [1, 1], 0.5, why="two pairs"),
        _hid(rng.normal(0, 1, 6), rng.normal(0, 1, 6), [0, 1, 2, 3], [5, 4, 3, 2], 0.1,
             probe="a response chosen in one pair and rejected in another"),
        _hid(rng.normal(0, 2, 8), rng.normal(0, 2, 8), [1, 1, 1], [2, 2, 2], 0.3, probe="repeated pairs"),
        _hid(A([3000.0, 0.0, 0.0]), A([0.0, 0.0, 0.0]), [0, 1], [1, 0], 1.0,
             probe="logits of size 3000: exp overflows"),
    ]
    train = [_task(s, judge=_lazy_judge("klbook_lib.tasks.micro_rlhf", "judge_dpo", eval_seed=800_000 + s),
                   probe=f"training seed {s}") for s in (0, 1, 2, 3)]
    return [
        Question("q1", "The DPO loss", "function", "dpo_loss", 4, R.dpo_loss, tuple(dpo),
                 rtol=1e-6, atol=1e-9),
        Question("q2", "The ELBO of a discrete latent", "function", "elbo_discrete", 3,
                 R.elbo_discrete, tuple(elbo)),
        Question("q3", "DPO's implicit preference probability", "value", "answer_q3", 2,
                 lambda: float(1 / (1 + np.exp(-0.1 * ((-12.0 + 15.0) - (-14.0 + 13.0))))), **REL),
        Question("q4", "What maximising the ELBO minimises", "choice", "answer_q4", 2, "A"),
        Question("q5", "The DPO gradient of a categorical policy", "function", "dpo_logit_gradient", 4,
                 R.dpo_logit_gradient_autograd, tuple(grad), rtol=1e-6, atol=1e-10),
        Question("q6", "Train a micro GPT-2 with your DPO loss", "function", "train_dpo", 6,
                 _outcome, tuple(train), timeout=40.0,
                 library=MICRO_RLHF_LIBRARY + ("klbook_lib.dpo",), full_marks_at=3,
                 public_checks=(dict(args=[100], module="klbook_lib.tasks.micro_rlhf", judge="judge_dpo", kwargs={'eval_seed': 7}, why="training seed 100"),)),
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
                 lambda: R.beta_for_kl([0.5, 0.3, 0.2], [1.0, 2.0, 0.0], 0.1), **REL),
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
             np.log(A([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])), probe="log p = -inf in several places"),
        _hid(A([[np.log(0.5), np.log(0.5)]]), A([[0.0, -np.inf]]), probe="log q = -inf where p > 0"),
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
    "ex10_other_divergences": _ex10, "ex14_review": _ex11,
    "ex13_kl_as_a_tool": lambda: __import__("klbook_lib.grading.hidden.ex13", fromlist=["questions"]).questions(),
    "ex11_sequence_kl_grpo": lambda: __import__("klbook_lib.grading.hidden.ex11_sequence", fromlist=["questions"]).questions(),
    "ex12_overoptimisation_distillation": lambda: __import__("klbook_lib.grading.hidden.ex12", fromlist=["questions"]).questions(),
}


def exercise_names() -> list[str]:
    return list(_BUILDERS)


def questions(exercise: str) -> list[Question]:
    if exercise not in _BUILDERS:
        raise ValueError(f"exercise: unknown exercise {exercise!r}")
    return _BUILDERS[exercise]()
