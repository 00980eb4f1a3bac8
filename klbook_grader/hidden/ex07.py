"""The graded questions of ``ex07_token_level_kl`` (chapter 7: token-level KL).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, REL, hid, outcome, pub, task, task_judge

EXERCISE = "ex07_token_level_kl"
A = np.array


# what the training runs need (the library's PPO-RLHF, into which the task plugs the student's
# reward and GAE): offered only in the tasks' sandbox, whose runs count only once questions 1
# and 5 score points of their own (``requires``)
MICRO_RLHF_LIBRARY = ("klbook_grader.tasks.micro_rlhf", "klbook_lib.rlhf.models", "klbook_lib.rlhf.pipeline",
                      "klbook_lib.rlhf.ppo", "klbook_lib.rlhf.tokenizer")
# what the notebook's cells may import: the task module and the review data it builds on
# (klbook_lib.rlhf.rewards and .ppo compute the answers of questions 1, 2 and 5)
MICRO_RLHF_CELLS = ("klbook_grader.tasks.micro_rlhf", "klbook_lib.rlhf.data")


def padded_mask(rng, b, t, lo=1):
    return (np.arange(t)[None, :] < rng.integers(lo, t + 1, b)[:, None]).astype(float)


def questions() -> list[Question]:
    rng = np.random.default_rng(707)
    tok = [
        pub(A([[-1.0, -2.0, -0.5]]), A([[-1.0, -2.0, -0.5]]), A([1.0]), A([[1.0, 1.0, 1.0]]), 0.1,
             why="policy equals reference"),
        pub(A([[-1.0, -1.0, -1.0], [-0.5, -2.0, -9.0]]), A([[-2.0, -1.0, -1.5], [-1.0, -1.0, -1.0]]),
             A([2.0, -1.0]), A([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), 0.2, why="second sequence is padded",
             core=True),   # issue 36: the score's position is what the question is about
    ]
    for b, t in ((4, 6), (3, 9)):
        tok.append(hid(rng.normal(-2, 1, (b, t)), rng.normal(-2, 1, (b, t)), rng.normal(0, 1, b),
                        padded_mask(rng, b, t), 0.05))
    lp = np.where(padded_mask(rng, 4, 7) > 0, rng.normal(-2, 1, (4, 7)), -np.inf)
    m = (lp > -np.inf).astype(float)
    tok.append(hid(lp, rng.normal(-2, 1, (4, 7)), rng.normal(0, 1, 4), m, 0.1,
                    probe="-inf log-probabilities on padded positions"))
    left = A([[0.0, 0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    tok.append(hid(rng.normal(-2, 1, (3, 5)), rng.normal(-2, 1, (3, 5)), rng.normal(0, 1, 3), left, 0.1,
                    probe="left-padded rows: the last real token comes from the mask", core=True))
    full = padded_mask(rng, 3, 5)
    full[1] = 0.0
    tok.append(hid(rng.normal(-2, 1, (3, 5)), rng.normal(-2, 1, (3, 5)), rng.normal(0, 1, 3), full, 0.1,
                    probe="a fully padded row (no response token)"))
    gae_cases = [
        pub(A([1.0, 1.0, 1.0]), A([0.0, 0.0, 0.0]), 1.0, 1.0, why="no discount, zero values"),
        pub(A([0.0, 0.0, 1.0]), A([0.5, 0.5, 0.5]), 0.9, 0.95, why="reward at the end"),
        hid(rng.normal(0, 1, 10), rng.normal(0, 1, 10), 0.99, 0.95),
        hid(rng.normal(0, 1, 7), rng.normal(0, 1, 7), 1.0, 0.0, probe="lambda = 0: one-step TD errors"),
        hid(A([5.0]), A([2.0]), 0.99, 0.9, probe="a single step"),
        hid(rng.normal(0, 1, 300), rng.normal(0, 1, 300), 0.95, 0.9, probe="gamma < 1 on a long sequence"),
    ]
    def _junk(mask, x):
        return np.where(mask > 0, x, 1e6)
    mg = []
    m1 = A([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    mg.append(pub(A([[0.0, 0.0, 1.0, 0.0], [0.5, -1.0, 0.0, 0.0]]), A([[0.1, 0.2, 0.3, 0.0], [0.0, 0.5, 0.0, 0.0]]),
                   m1, 1.0, 0.95, why="two right-padded rows"))
    m2 = padded_mask(rng, 5, 8)
    mg.append(hid(rng.normal(0, 1, (5, 8)) * m2, rng.normal(0, 1, (5, 8)) * m2, m2, 1.0, 0.95))
    m3 = padded_mask(rng, 4, 6)
    mg.append(hid(_junk(m3, rng.normal(0, 1, (4, 6))), _junk(m3, rng.normal(0, 1, (4, 6))), m3, 1.0, 0.95,
                   probe="junk rewards and values on padded positions", core=True))
    # a value head outputs something on pads too: the pads hold ordinary-looking numbers
    m6 = padded_mask(rng, 5, 7)
    mg.append(hid(rng.normal(0, 1, (5, 7)), rng.normal(0, 1, (5, 7)), m6, 1.0, 0.95,
                   probe="right padding, pads not zeroed (values a value head would output)", core=True))
    m7 = padded_mask(rng, 4, 6)[:, ::-1].copy()
    mg.append(hid(rng.normal(0, 1, (4, 6)), rng.normal(0, 1, (4, 6)), m7, 0.99, 0.95,
                   probe="left padding, pads not zeroed", core=True))
    m4 = padded_mask(rng, 3, 5)
    m4[2] = 0.0
    mg.append(hid(rng.normal(0, 1, (3, 5)) * m4, rng.normal(0, 1, (3, 5)) * m4, m4, 0.99, 0.9,
                   probe="a fully padded row (no response token)"))
    m5 = padded_mask(rng, 3, 200, lo=150)
    mg.append(hid(rng.normal(0, 1, (3, 200)) * m5, rng.normal(0, 1, (3, 200)) * m5, m5, 0.95, 0.9,
                   probe="gamma < 1 on long sequences"))
    lp3 = np.log(A([0.6, 0.2, 0.1, 0.1]))
    lr3 = np.log(A([0.25, 0.25, 0.25, 0.25]))
    train = [task(s, judge=task_judge("klbook_grader.tasks.micro_rlhf", "judge_rlhf", eval_seed=700_000 + s),
                   probe="a training run on a seed of the grader's") for s in (0, 1, 2, 3)]
    return [
        Question("q1", "Per-token rewards", "function", "per_token_rewards", 4,
                 R.per_token_rewards, tuple(tok), refused=("klbook_lib.rlhf.rewards", "klbook_lib.rlhf.ppo")),
        Question("q2", "Generalised advantage estimation", "function", "gae", 3, R.gae,
                 tuple(gae_cases)),
        Question("q3", "Exact per-token KL over the vocabulary", "value", "answer_q3", 2,
                 lambda: R.kl_from_logprobs(lp3, lr3), **REL),
        Question("q4", "Summing per-token log-ratios", "choice", "answer_q4", 2, "A"),
        Question("q5", "GAE on a padded batch", "function", "masked_gae", 4, R.masked_gae, tuple(mg),
                 refused=("klbook_lib.rlhf.rewards", "klbook_lib.rlhf.ppo")),
        Question("q6", "Train a micro GPT-2 with your reward and your GAE", "function", "train_rlhf", 6,
                 outcome, tuple(train), timeout=40.0, library=MICRO_RLHF_CELLS,
                 task_library=MICRO_RLHF_LIBRARY, full_marks_at=3, requires=("q1", "q5"),
                 public_checks=(dict(args=[100], module="klbook_grader.tasks.micro_rlhf", judge="judge_rlhf", kwargs={'eval_seed': 7}, why="training seed 100"),)),
    ]
