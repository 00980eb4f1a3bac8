"""The graded questions of ``ex08_vi_elbo_dpo`` (chapter 8: variational inference, the ELBO and DPO).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.ex07 import MICRO_RLHF_CELLS, MICRO_RLHF_LIBRARY
from klbook_grader.hidden.questions import Question, REL, hid, outcome, pub, simplex, task, task_judge

EXERCISE = "ex08_vi_elbo_dpo"
A = np.array


def questions() -> list[Question]:
    rng = np.random.default_rng(808)
    dpo = [
        pub(A([-1.0]), A([-1.0]), A([-1.0]), A([-1.0]), 0.1, why="no preference yet: log 2", torch=True),
        pub(A([-1.0, -5.0]), A([-3.0, -2.0]), A([-2.0, -4.0]), A([-2.0, -4.0]), 0.5, why="two pairs",
             torch=True),
        pub(A([-10.0]), A([-1.0]), A([-1.0]), A([-1500.0]), 1.0, why="huge margin: no inf or NaN",
             torch=True),
        hid(*(rng.normal(-20, 5, 16) for _ in range(4)), 0.1, torch=True),
        hid(A([0.0, -3000.0]), A([-3000.0, 0.0]), A([0.0, 0.0]), A([0.0, 0.0]), 1.0, torch=True,
             probe="margins of +-3000: -log(sigmoid) computed naively overflows"),
    ]
    elbo = [
        pub(np.log(A([0.1, 0.3])), A([0.25, 0.75]), why="q is the exact posterior"),
        pub(np.log(A([0.1, 0.3])), A([0.5, 0.5]), why="a wrong q"),
        pub(np.log(A([0.2, 0.2, 0.1])), A([0.0, 1.0, 0.0]), why="q puts zero on some z"),
        hid(rng.normal(-3, 1, 6), simplex(rng, 6)),
        hid(rng.normal(-3, 1, 6), simplex(rng, 6, 3), probe="q(z) = 0 for some z"),
    ]
    grad = [
        pub(A([0.0, 0.0]), A([0.0, 0.0]), [0], [1], 1.0, why="one pair, policy = reference"),
        pub(A([1.0, 0.0, -1.0]), A([0.0, 0.0, 0.0]), [0, 2], [1, 1], 0.5, why="two pairs"),
        hid(rng.normal(0, 1, 6), rng.normal(0, 1, 6), [0, 1, 2, 3], [5, 4, 3, 2], 0.1,
             probe="a response chosen in one pair and rejected in another"),
        hid(rng.normal(0, 2, 8), rng.normal(0, 2, 8), [1, 1, 1], [2, 2, 2], 0.3, probe="repeated pairs"),
        hid(A([3000.0, 0.0, 0.0]), A([0.0, 0.0, 0.0]), [0, 1], [1, 0], 1.0,
             probe="logits of size 3000: exp overflows"),
    ]
    train = [task(s, judge=task_judge("klbook_grader.tasks.micro_rlhf", "judge_dpo", eval_seed=800_000 + s),
                   probe="a training run on a seed of the grader's") for s in (0, 1, 2, 3)]
    return [
        Question("q1", "The DPO loss", "function", "dpo_loss", 4, R.dpo_loss, tuple(dpo),
                 rtol=1e-6, atol=1e-9, refused=("klbook_lib.dpo",)),
        Question("q2", "The ELBO of a discrete latent", "function", "elbo_discrete", 3,
                 R.elbo_discrete, tuple(elbo)),
        Question("q3", "DPO's implicit preference probability", "value", "answer_q3", 2,
                 lambda: float(1 / (1 + np.exp(-0.1 * ((-12.0 + 15.0) - (-14.0 + 13.0))))), **REL),
        Question("q4", "What maximising the ELBO minimises", "choice", "answer_q4", 2, "A"),
        Question("q5", "The DPO gradient of a categorical policy", "function", "dpo_logit_gradient", 4,
                 R.dpo_logit_gradient_autograd, tuple(grad), rtol=1e-6, atol=1e-10),
        Question("q6", "Train a micro GPT-2 with your DPO loss", "function", "train_dpo", 6,
                 outcome, tuple(train), timeout=40.0,
                 library=MICRO_RLHF_CELLS, task_library=MICRO_RLHF_LIBRARY + ("klbook_lib.dpo",), requires=("q1",),
                 full_marks_at=3,
                 public_checks=(dict(args=[100], module="klbook_grader.tasks.micro_rlhf", judge="judge_dpo", kwargs={'eval_seed': 7}, why="training seed 100"),)),
    ]
