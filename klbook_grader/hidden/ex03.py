"""The graded questions of ``ex03_trpo_ppo`` (chapter 3: TRPO and PPO).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, hid, outcome, pub, task, task_judge

EXERCISE = "ex03_trpo_ppo"
A = np.array


CARTPOLE_LIBRARY = ("klbook_lib.ppo", "klbook_lib.envs", "klbook_lib.monitor",
                    "klbook_grader.tasks.cartpole_kl")
# what the notebook's cells may import: the task module (it imports the PPO library only inside
# the training call; klbook_lib.ppo computes the clipped surrogate of question 3)
CARTPOLE_CELLS = ("klbook_grader.tasks.cartpole_kl",)


def questions() -> list[Question]:
    rng = np.random.default_rng(303)
    adapt = [
        pub(1.0, 0.05, 0.01, why="KL far above target", core=True),
        pub(1.0, 0.001, 0.01, why="KL far below target", core=True),
        pub(0.5, 0.012, 0.01, why="KL near target"),
        hid(0.3, 0.0149, 0.01, probe="just inside the band"), hid(0.3, 0.0151, 0.01, probe="just above the band"),
        hid(0.3, 0.0068, 0.01, probe="just inside the band"), hid(0.3, 0.0066, 0.01, probe="just below the band"),
        hid(2.0, 1.0, 0.02), hid(2.0, 0.0, 0.02, probe="a KL of exactly 0"),
        # other targets, near their own band (a rule with the target written in as 0.01 fails
        # them: it would double at 0.02 and 0.029, keep beta at 0.012, halve at 0.0014)
        hid(0.3, 0.02, 0.02, probe="another target: KL on it", core=True),
        hid(0.3, 0.029, 0.02, probe="another target: just inside its band", core=True),
        hid(0.3, 0.012, 0.02, probe="another target: just below its band", core=True),
        hid(0.3, 0.0014, 0.002, probe="another target: just inside its band", core=True),
    ]
    prop = [
        pub(0.2, 6.0, 6.0, 256, 10000, why="KL on target"),
        pub(0.2, 12.0, 6.0, 256, 10000, why="KL twice the target: error clipped to 0.2"),
        hid(0.2, 3.0, 6.0, 256, 10000, probe="the error clipped from below"), hid(0.1, 6.6, 6.0, 512, 10000),
        hid(0.05, 5.7, 6.0, 64, 1000), hid(1.0, 100.0, 6.0, 10000, 10000),
    ]
    clip = [
        pub(A([1.0, 1.5, 0.5]), A([1.0, 1.0, 1.0]), 0.2, why="positive advantages"),
        pub(A([1.0, 1.5, 0.5]), A([-1.0, -1.0, -1.0]), 0.2, why="negative advantages"),
        hid(rng.lognormal(0, 0.3, 20), rng.normal(0, 1, 20), 0.2),
        hid(rng.lognormal(0, 0.5, 20), rng.normal(0, 2, 20), 0.1),
        hid(A([0.8, 1.2, 0.8, 1.2]), A([2.0, 2.0, -2.0, -2.0]), 0.2, probe="ratios on the edge of the clip range"),
        hid(A([0.5, 1.5, 0.5, 1.5]), A([2.0, 2.0, -2.0, -2.0]), 0.2,
             probe="ratios outside the clip range, both signs of the advantage (the clip and the min)"),
    ]
    hess = [
        pub(A([0.0, 0.0]), why="two equal logits"),
        pub(A([1.0, 2.0, 3.0]), why="three actions"),
        hid(rng.normal(0, 1, 5)), hid(rng.normal(0, 3, 8)),
        hid(A([1000.0, 999.0, -1000.0]), probe="logits of size 1000: exp overflows"),
        hid(A([30.0, 0.0, 0.0, 0.0]), probe="a nearly deterministic policy"),
    ]
    def _batch(n, k, s_new, s_old):
        old = rng.normal(0, 1, (n, k))
        return old + rng.normal(0, s_new, (n, k)), old, rng.integers(0, k, n).astype(float), rng.normal(0, 1, n)
    pen = [
        pub(A([[0.0, 0.0], [1.0, -1.0]]), A([[0.0, 0.0], [1.0, -1.0]]), A([0.0, 1.0]), A([1.0, -2.0]), 0.5, 0.2,
             why="pi_theta = pi_old: ratio 1, KL 0", torch=True),
        pub(A([[0.3, 0.0], [0.0, 0.2]]), A([[0.0, 0.0], [0.0, 0.0]]), A([0.0, 1.0]), A([1.0, -1.0]), 1.0, 0.2,
             why="a small step", torch=True),
        hid(*_batch(16, 2, 0.05, 1.0), 1.0, 0.2, torch=True),
        hid(*_batch(32, 4, 0.8, 1.0), 0.1, 0.2, torch=True,
             probe="a policy that moved beyond the clip range (the clip and the min)"),
        hid(A([[2.0, -1.0, 0.0], [0.0, 3.0, -2.0]]), A([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), A([0.0, 2.0]),
             A([0.0, 0.0]), 2.0, 0.2, torch=True,
             probe="zero advantages: only the KL term, whose direction matters"),
        hid(*_batch(64, 3, 0.3, 1.0), 0.7, 0.3, torch=True, probe="a mean over states, not a sum"),
    ]
    seeds = (0, 1, 3, 4)
    train = [task(s, judge=task_judge("klbook_grader.tasks.cartpole_kl", "judge", eval_seed=900_000 + s),
                   probe="a training run on a seed of the grader's") for s in seeds]
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
                 outcome, tuple(train), timeout=30.0, library=CARTPOLE_CELLS,
                 task_library=CARTPOLE_LIBRARY, full_marks_at=3, requires=("q1", "q7"),
                 public_checks=(dict(args=[100], module="klbook_grader.tasks.cartpole_kl", judge="judge", kwargs={'eval_seed': 7}, why="training seed 100"),)),
    ]
