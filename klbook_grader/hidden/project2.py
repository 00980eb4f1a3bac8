"""The graded questions of ``project2_ppo_rlhf`` (project 2, RLHF: a PPO-RLHF loop on the tiny GPT-2).

The student writes the pieces (the response mask of a sampled batch, the reward model's score at
the last real token, the per-token KL reward, masked GAE, the clipped PPO loss with its value
loss) and the training loop on the book's tiny GPT-2 pipeline. Each piece is probed on hidden
cases against the references below, written independently of the master and of the library
(plain Python loops over rows and tokens, numpy); the training loop is graded on its outcome by
:func:`klbook_grader.tasks.rlhf_project.judge`, which samples the returned policy itself. The report
cell (:data:`REPORT`) is graded by hand: ``klbook grade DIR --csv`` exports it as an ungraded row.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden.questions import Question, hid, outcome, pub, task, task_judge

EXERCISE = "project2_ppo_rlhf"
A = np.array
REPORT = {"tag": "report", "placeholder": "Write your report here."}

TASK = "klbook_grader.tasks.rlhf_project"
CELLS_LIBRARY = (TASK,)
# the modules the training runs call (named one by one, issue 36: not whole packages)
TASK_LIBRARY = (TASK, "klbook_lib.rlhf.pipeline", "klbook_lib.rlhf.ppo", "klbook_lib.rlhf.models",
                "klbook_lib.rlhf.reward_model", "klbook_lib.rlhf.tokenizer")
EOS = 2
TIMEOUT = 90.0      # seconds per graded run (the reference needs about 10 to 30 s here)


# ---------------------------------------------------------------- references (plain loops)
def mask_reference(response_ids, eos_id) -> np.ndarray:
    """Walk each row: every token is real until (and including) the first ``eos_id``."""
    ids = np.asarray(response_ids)
    out = np.zeros(ids.shape)
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            out[b, t] = 1.0
            if int(ids[b, t]) == int(eos_id):
                break
    return out


def score_reference(values, attention_mask) -> np.ndarray:
    """For each row, the value at the largest position whose mask is 1 (0 for a row without one)."""
    v, m = np.asarray(values, float), np.asarray(attention_mask, float)
    out = np.zeros(v.shape[0])
    for b in range(v.shape[0]):
        for t in range(v.shape[1]):
            if m[b, t] > 0:
                out[b] = v[b, t]
    return out


def rewards_reference(logprobs, ref_logprobs, scores, mask, beta) -> np.ndarray:
    lp, ref, m = np.asarray(logprobs, float), np.asarray(ref_logprobs, float), np.asarray(mask, float)
    s = np.asarray(scores, float)
    out = np.zeros(m.shape)
    for b in range(m.shape[0]):
        last = None
        for t in range(m.shape[1]):
            if m[b, t] > 0:
                out[b, t] = -beta * (lp[b, t] - ref[b, t])
                last = t
        if last is not None:
            out[b, last] += s[b]
    return out + 0.0


def gae_reference(rewards, values, mask, gamma, lam) -> np.ndarray:
    """A_t = sum_k (gamma lam)^k delta_{t+k} over the row's real tokens after t, written as a double
    loop; delta uses the value of the next REAL token (0 after the last one)."""
    r, v, m = np.asarray(rewards, float), np.asarray(values, float), np.asarray(mask, float)
    out = np.zeros(r.shape)
    for b in range(r.shape[0]):
        real = [t for t in range(r.shape[1]) if m[b, t] > 0]
        deltas = []
        for i, t in enumerate(real):
            nxt = v[b, real[i + 1]] if i + 1 < len(real) else 0.0
            deltas.append(r[b, t] + gamma * nxt - v[b, t])
        for i, t in enumerate(real):
            out[b, t] = sum((gamma * lam) ** k * deltas[i + k] for k in range(len(real) - i))
    return out


def loss_reference(new_lp, old_lp, adv, values, old_values, returns, mask, clip_range, value_clip,
                   vf_coef) -> float:
    """The token-level means, by a loop over the real tokens."""
    m = np.asarray(mask, float)
    pg_sum, vf_sum, n = 0.0, 0.0, 0
    for b in range(m.shape[0]):
        for t in range(m.shape[1]):
            if m[b, t] <= 0:
                continue
            r = float(np.exp(new_lp[b, t] - old_lp[b, t]))
            a = float(adv[b, t])
            r_clip = min(max(r, 1 - clip_range), 1 + clip_range)
            pg_sum += max(-a * r, -a * r_clip)
            v, v_old, ret = float(values[b, t]), float(old_values[b, t]), float(returns[b, t])
            v_clip = v_old + min(max(v - v_old, -value_clip), value_clip)
            vf_sum += max((v - ret) ** 2, (v_clip - ret) ** 2)
            n += 1
    n = max(n, 1)
    return pg_sum / n + vf_coef * 0.5 * vf_sum / n


# ---------------------------------------------------------------- cases
def _right(rng, b, t, lo=1):
    return (np.arange(t)[None, :] < rng.integers(lo, t + 1, b)[:, None]).astype(float)


def _tokens(rng, b, t, eos_at):
    """Token ids in 3..40 with EOS (2) at the given positions of each row (None: no EOS)."""
    ids = rng.integers(3, 40, (b, t)).astype(float)
    for row, pos in enumerate(eos_at):
        if pos is not None:
            ids[row, pos] = EOS
    return ids


def _attention(rng, b, p, n):
    """Left-padded prompts (1 to p real tokens) followed by right-padded responses (1 to n)."""
    left = _right(rng, b, p)[:, ::-1]
    return np.concatenate([left, _right(rng, b, n)], axis=1)


def _loss_batch(rng, b, n, spread, mask=None, junk=0.0):
    m = _right(rng, b, n) if mask is None else mask
    old = rng.normal(-2, 1, (b, n))
    new = old + rng.normal(0, spread, (b, n))
    adv = rng.normal(0, 1, (b, n))
    old_v = rng.normal(0, 1, (b, n))
    v = old_v + rng.normal(0, 0.4, (b, n))
    ret = old_v + rng.normal(0, 1, (b, n))
    if junk:
        new, adv, v = (np.where(m > 0, x, rng.normal(0, junk, x.shape)) for x in (new, adv, v))
    return new, old, adv, v, old_v, ret, m


def questions() -> list[Question]:
    rng = np.random.default_rng(2502)
    # q1: the response mask
    gpt2 = _tokens(rng, 4, 8, [2, 0, None, 7])
    gpt2[0, 3:] = EOS                     # GPT-2 pads with its EOS token: pads equal EOS
    gpt2[1, 1:] = EOS
    masks = [
        pub(A([[5.0, 9.0, 2.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0, 7.0]]), EOS,
            why="one response ends with EOS at step 2, the other never does", torch=True, core=True),
        pub(A([[2.0, 0.0, 0.0], [4.0, 2.0, 0.0]]), EOS, why="EOS as the first token", torch=True),
        hid(_tokens(rng, 6, 10, [3, 9, None, 0, 5, None]), EOS, torch=True, core=True,
            probe="EOS at various steps, the EOS itself is a real token"),
        hid(gpt2, EOS, torch=True, core=True, probe="pads that carry the EOS id (GPT-2 pads with EOS)"),
        hid(A([[9.0, 2, 9, 2, 9, 9], [9, 9, 2, 9, 2, 2], [9, 9, 9, 9, 2, 9]]), EOS, torch=True, core=True, probe="tokens sampled after a first EOS, including a second EOS"),
        hid(A([[4.0]]), EOS, torch=True, probe="one token, no EOS"),
        hid(_tokens(rng, 2, 12, [11, None]), 17, torch=True, probe="another EOS id"),
    ]
    # q2: the reward model's score at the last real token
    both = _attention(rng, 5, 4, 6)
    scores = [
        pub(A([[0.1, 0.2, 0.3, 9.0], [0.4, 0.5, 9.0, 9.0]]), A([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]),
            why="right padding", torch=True),
        pub(A([[9.0, 0.2, 0.3, 0.4, 9.0], [0.1, 0.2, 0.3, 0.4, 0.5]]),
            A([[0.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]]),
            why="a left-padded prompt then a right-padded response", torch=True, core=True),
        hid(rng.normal(0, 1, both.shape), both, torch=True, core=True,
            probe="left-padded prompts followed by right-padded responses"),
        hid(np.where(both > 0, rng.normal(0, 1, both.shape), 1e3), both, torch=True, core=True,
            probe="large values on the pads"),
        hid(rng.normal(0, 1, (3, 6)), np.ones((3, 6)), torch=True, probe="no padding"),
        hid(rng.normal(0, 1, (3, 5)), A([[0, 0, 0, 0, 1.0], [1.0, 0, 0, 0, 0], [0, 0, 1.0, 0, 0]]), torch=True,
            probe="one real token per row"),
        hid(rng.normal(0, 1, (3, 4)), A([[1.0, 1, 0, 0], [0, 0, 0, 0], [0, 1.0, 1, 1]]), torch=True,
            probe="a row without a real token"),
    ]
    # q3: the per-token reward
    m_left = _right(rng, 4, 7)[:, ::-1].copy()
    m_pad = _right(rng, 4, 6)
    m_pad[2] = 0.0
    m_unequal = _right(rng, 6, 9)
    junk_lp = np.where(m_unequal > 0, rng.normal(-2, 1, (6, 9)), rng.normal(0, 50, (6, 9)))
    inf_mask = _right(rng, 3, 6)
    inf_lp = np.where(inf_mask > 0, rng.normal(-2, 1, (3, 6)), -np.inf)
    rewards = [
        pub(A([[-1.0, -2.0, -0.5]]), A([[-1.0, -2.0, -0.5]]), A([1.5]), A([[1.0, 1.0, 1.0]]), 0.1,
            why="pi_theta equals pi_ref: only the score", torch=True),
        pub(A([[-1.0, -1.0, -1.0], [-0.5, -2.0, -9.0]]), A([[-2.0, -1.0, -1.5], [-1.0, -1.0, -1.0]]),
            A([2.0, -1.0]), A([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), 0.2, why="the second response is padded",
            torch=True, core=True),
        hid(rng.normal(-2, 1, (5, 8)), rng.normal(-2, 1, (5, 8)), rng.normal(0, 1, 5), _right(rng, 5, 8), 0.05,
            torch=True, core=True, probe="right padding, unequal lengths"),
        hid(junk_lp, rng.normal(-2, 1, (6, 9)), rng.normal(0, 1, 6), m_unequal, 0.1, torch=True, core=True,
            probe="junk log-probabilities on the pads"),
        hid(rng.normal(-2, 1, (4, 7)), rng.normal(-2, 1, (4, 7)), rng.normal(0, 1, 4), m_left, 0.1, torch=True,
            core=True, probe="left padding: the last real token comes from the mask"),
        hid(rng.normal(-2, 1, (4, 6)), rng.normal(-2, 1, (4, 6)), rng.normal(0, 1, 4), m_pad, 0.1, torch=True,
            probe="a row without a real token"),
        hid(rng.normal(-2, 1, (3, 5)), rng.normal(-2, 1, (3, 5)), rng.normal(0, 1, 3), _right(rng, 3, 5), 0.0,
            torch=True, probe="beta = 0"),
        hid(rng.normal(-2, 0.1, (4, 5)) - A([0.0, 0.5, 1.0, 1.5, 2.0]), rng.normal(-2, 0.1, (4, 5)),
            np.zeros(4), np.ones((4, 5)), 0.5, torch=True, core=True,
            probe="zero scores: only the KL penalty, whose sign matters"),
        hid(inf_lp, rng.normal(-2, 1, (3, 6)), rng.normal(0, 1, 3), inf_mask, 0.1, torch=True,
            probe="-inf log-probabilities on the pads"),
    ]
    # q4: masked GAE
    m4 = _right(rng, 5, 8)
    m5 = _right(rng, 4, 7)[:, ::-1].copy()
    m6 = _right(rng, 3, 6)
    m6[1] = 0.0
    mg = [
        pub(A([[0.0, 0.0, 1.0, 0.0], [0.5, -1.0, 0.0, 0.0]]), A([[0.1, 0.2, 0.3, 0.0], [0.0, 0.5, 0.0, 0.0]]),
            A([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]), 1.0, 0.95, why="two right-padded rows, zero pads",
            torch=True),
        pub(A([[7.0, 0.0, 1.0], [0.3, 0.2, -4.0]]), A([[5.0, 0.5, 0.5], [0.1, 0.2, 3.0]]),
            A([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), 1.0, 0.9, why="a left pad and a right pad holding numbers",
            torch=True, core=True),
        hid(rng.normal(0, 1, (5, 8)) * m4, rng.normal(0, 1, (5, 8)) * m4, m4, 1.0, 0.95, torch=True,
            probe="right padding, zero pads"),
        hid(np.where(m4 > 0, rng.normal(0, 1, (5, 8)), 1e4), np.where(m4 > 0, rng.normal(0, 1, (5, 8)), -1e4), m4,
            1.0, 0.95, torch=True, core=True, probe="junk rewards and values on the pads"),
        hid(rng.normal(0, 1, (4, 7)), rng.normal(0, 1, (4, 7)), m5, 0.99, 0.95, torch=True, core=True,
            probe="left padding, pads not zeroed"),
        hid(rng.normal(0, 1, (3, 6)), rng.normal(0, 1, (3, 6)), m6, 1.0, 0.9, torch=True,
            probe="a row without a real token"),
        hid(rng.normal(0, 1, (3, 6)), rng.normal(0, 1, (3, 6)), _right(rng, 3, 6), 1.0, 0.0, torch=True,
            probe="lambda = 0: one-step TD errors"),
        hid(rng.normal(0, 1, (2, 40)), rng.normal(0, 1, (2, 40)), _right(rng, 2, 40, lo=30), 0.9, 0.8,
            torch=True, probe="gamma < 1 on long rows"),
    ]
    # q5: the clipped PPO loss with its value loss
    loss = [
        pub(A([[-1.0, -2.0, -0.7]]), A([[-1.0, -2.0, -0.7]]), A([[1.0, -1.0, 0.5]]), A([[0.5, 0.5, 0.5]]),
            A([[0.5, 0.5, 0.5]]), A([[1.0, 0.0, 0.5]]), A([[1.0, 1.0, 1.0]]), 0.2, 0.2, 0.5,
            why="pi_theta = pi_old: ratio 1", torch=True),
        pub(A([[-0.9, -2.2, 0.0], [-1.0, 0.0, 0.0]]), A([[-1.0, -2.0, 0.0], [-1.1, 0.0, 0.0]]),
            A([[1.0, -1.0, 0.0], [0.5, 0.0, 0.0]]), A([[0.4, 0.1, 0.0], [1.0, 0.0, 0.0]]),
            A([[0.5, 0.0, 0.0], [0.5, 0.0, 0.0]]), A([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]]),
            A([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]), 0.2, 0.2, 0.5, why="a small step on a padded batch",
            torch=True, core=True),
        hid(*_loss_batch(rng, 6, 8, 0.05), 0.2, 0.2, 0.5, torch=True, probe="small steps"),
        hid(*_loss_batch(rng, 8, 6, 0.8), 0.2, 0.2, 0.5, torch=True, core=True,
            probe="ratios beyond the clip range (the clip and the max)"),
        hid(*_loss_batch(rng, 6, 7, 0.3, junk=1e3), 0.2, 0.2, 1.0, torch=True, core=True,
            probe="junk on the pads: means over the real tokens only"),
        hid(*_loss_batch(rng, 5, 9, 0.3, mask=_right(rng, 5, 9)[:, ::-1].copy()), 0.3, 0.1, 0.5, torch=True,
            core=True, probe="left padding, a value clip smaller than the value steps"),
        hid(*_loss_batch(rng, 4, 5, 0.3, mask=np.ones((4, 5))), 0.1, 0.5, 0.0, torch=True,
            probe="vf_coef = 0"),
    ]
    runs = (31, 32, 33)
    train = [task(s, judge=task_judge(TASK, "judge", eval_seed=920_000 + s),
                  probe="a training run on a seed of the grader's") for s in runs]
    return [
        Question("q1", "The response mask of a sampled batch", "function", "response_mask", 2,
                 mask_reference, tuple(masks), rtol=0.0, atol=0.0, library=CELLS_LIBRARY),
        Question("q2", "The reward model's score at the last real token", "function", "last_token_scores", 2,
                 score_reference, tuple(scores), rtol=1e-6, atol=1e-9),
        Question("q3", "The per-token KL reward", "function", "per_token_rewards", 3,
                 rewards_reference, tuple(rewards), rtol=1e-6, atol=1e-9),
        Question("q4", "Masked GAE", "function", "masked_gae", 3, gae_reference, tuple(mg),
                 rtol=1e-6, atol=1e-9),
        Question("q5", "The clipped PPO loss with a value loss", "function", "ppo_loss", 3, loss_reference,
                 tuple(loss), rtol=1e-6, atol=1e-10),
        Question("q6", "The return of a response", "choice", "answer_q6", 1, "B"),
        Question("q7", "Train your PPO-RLHF on the grader's seeds", "function", "train_project", 10,
                 outcome, tuple(train), timeout=TIMEOUT, library=CELLS_LIBRARY, task_library=TASK_LIBRARY,
                 task_data=(f"{TASK}:cache_entry",), full_marks_at=2,
                 public_checks=(dict(args=[100], module=TASK, judge="judge", kwargs={"eval_seed": 7},
                                     why="training seed 100"),)),
    ]
