"""The graded questions of ``project3_grpo_kl`` (project 3, the frontier: GRPO and where its KL goes).

The student writes the pieces (group-normalised advantages, the per-token KL estimates k1 and
k3 on a padded batch, the GRPO loss with a choice of KL placement, the exact expected gradient
of each placement's KL term by enumeration) and the training loop on the book's enumerable
sequence model (:mod:`klbook_grader.tasks.grpo_project`). Each piece is probed on hidden cases
against the references below, written independently of the master and of the library (plain
Python loops over rows, tokens and sequences; the gradients in closed form per token, no
autograd, no :mod:`klbook_lib.seqkl`); the training loop is graded on its outcome by
:func:`klbook_grader.tasks.grpo_project.judge`, which evaluates the returned tables exactly. The
report cell (:data:`REPORT`) is graded by hand: ``klbook grade DIR --csv`` exports it as an
ungraded row.
"""
from __future__ import annotations

import math

import numpy as np

from klbook_grader.hidden.questions import Question, hid, outcome, pub, task, task_judge

EXERCISE = "project3_grpo_kl"
A = np.array
REPORT = {"tag": "report", "placeholder": "Write your report here."}

TASK = "klbook_grader.tasks.grpo_project"
CELLS_LIBRARY = (TASK,)
TASK_LIBRARY = ("klbook_lib.seqkl",)
ADV_EPS = 1e-4
TIMEOUT = 30.0      # seconds per graded run (the reference needs about 1 s here)
RUNS = ((41, "reward"), (41, "loss"), (42, "reward"), (42, "loss"), (43, "reward"), (43, "loss"))


# ---------------------------------------------------------------- references (plain loops)
def advantages_reference(rewards, group_size) -> np.ndarray:
    """For each group of ``group_size`` consecutive rewards: (r - mean) / (sample std + 1e-4);
    0 for a group of equal rewards and for groups of one."""
    r = [float(x) for x in np.asarray(rewards, float)]
    G = int(group_size)
    out = [0.0] * len(r)
    if G < 2:
        return np.array(out)
    for start in range(0, len(r), G):
        g = r[start:start + G]
        mean = sum(g) / len(g)
        sd = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
        if sd == 0.0:
            continue
        for i, x in enumerate(g):
            out[start + i] = (x - mean) / (sd + ADV_EPS)
    return np.array(out)


def _k(lp: float, lq: float, estimator: str) -> float:
    """k1 or k3 of one token: l = lp - lq; k1 = l, k3 = exp(-l) - 1 + l."""
    l = lp - lq
    return l if estimator == "k1" else math.exp(-l) - 1.0 + l


def kl_reference(logprobs, ref_logprobs, mask, estimator) -> np.ndarray:
    lp, lq, m = np.asarray(logprobs, float), np.asarray(ref_logprobs, float), np.asarray(mask, float)
    out = np.zeros(m.shape)
    for b in range(m.shape[0]):
        for t in range(m.shape[1]):
            if m[b, t] > 0:
                out[b, t] = _k(float(lp[b, t]), float(lq[b, t]), estimator)
    return out


def loss_reference(logprobs, old_logprobs, ref_logprobs, advantages, mask, beta, clip_range,
                   placement) -> float:
    """Per response: the mean over its real tokens of -min(rho A, clip(rho) A) (+ beta k3 with
    placement "loss"); then the mean over responses (a response without real tokens adds 0)."""
    lp, lo, lq = (np.asarray(x, float) for x in (logprobs, old_logprobs, ref_logprobs))
    a, m = np.asarray(advantages, float), np.asarray(mask, float)
    total = 0.0
    for b in range(m.shape[0]):
        s, n = 0.0, 0
        for t in range(m.shape[1]):
            if m[b, t] <= 0:
                continue
            rho = math.exp(float(lp[b, t]) - float(lo[b, t]))
            rho_c = min(max(rho, 1.0 - clip_range), 1.0 + clip_range)
            term = max(-rho * a[b], -rho_c * a[b])
            if placement == "loss":
                term += beta * _k(float(lp[b, t]), float(lq[b, t]), "k3")
            s += term
            n += 1
        total += s / max(n, 1)
    return total / m.shape[0]


def loss_gradient_reference(logprobs, old_logprobs, ref_logprobs, advantages, mask, beta, clip_range,
                            placement) -> np.ndarray:
    """d loss / d logprobs, written out per token: the unclipped term -rho A has derivative
    -rho A; the clipped one has none outside the clip range; beta k3 = beta (e^(lq - lp) - 1 -
    (lq - lp)) has beta (1 - e^(lq - lp)); each real token weighs 1 / (n_b B); pads 0."""
    lp, lo, lq = (np.asarray(x, float) for x in (logprobs, old_logprobs, ref_logprobs))
    a, m = np.asarray(advantages, float), np.asarray(mask, float)
    g = np.zeros(m.shape)
    B = m.shape[0]
    for b in range(B):
        n = int(sum(1 for t in range(m.shape[1]) if m[b, t] > 0))
        for t in range(m.shape[1]):
            if m[b, t] <= 0:
                continue
            rho = math.exp(float(lp[b, t]) - float(lo[b, t]))
            rho_c = min(max(rho, 1.0 - clip_range), 1.0 + clip_range)
            unclipped, clipped = -rho * a[b], -rho_c * a[b]
            d = -rho * a[b] if (unclipped >= clipped or rho_c == rho) else 0.0
            if placement == "loss":
                d += beta * (1.0 - math.exp(float(lq[b, t]) - float(lp[b, t])))
            g[b, t] = d / (n * B)
    return g


def _log_softmax(row) -> list:
    mx = max(row)
    z = math.log(sum(math.exp(x - mx) for x in row))
    return [x - mx - z for x in row]


def gradient_reference(logits, ref_logits, sequences, mask, prefix_index, placement, aggregation) -> np.ndarray:
    """The exact on-policy expected gradient (w.r.t. the logits table) of a placement's KL term,
    by a loop over every sequence, in closed form per token (d log pi(a|s) / d z_s = e_a - pi(.|s)):

    * ``"reward"``: sum_y pi(y) c(y) K(y) sum_t (e_{a_t} - pi(.|s_t)) on row s_t, K(y) = sum_t k1_t;
    * ``"loss"``: sum_y pi(y) c(y) sum_t (1 - pi_ref(a_t|s_t) / pi(a_t|s_t)) (e_{a_t} - pi(.|s_t));

    with c(y) = 1 (``"sum"``) or 1 / |y| (``"sequence_mean"``)."""
    z, zr = np.asarray(logits, float), np.asarray(ref_logits, float)
    seqs, m, pidx = np.asarray(sequences), np.asarray(mask, float), np.asarray(prefix_index)
    logp = [_log_softmax(list(row)) for row in z]
    logq = [_log_softmax(list(row)) for row in zr]
    V = z.shape[1]
    grad = np.zeros(z.shape)
    for n in range(seqs.shape[0]):
        toks = [(int(pidx[n, t]), int(seqs[n, t])) for t in range(seqs.shape[1]) if m[n, t] > 0]
        prob = math.exp(sum(logp[s][a] for s, a in toks))
        c = 1.0 if aggregation == "sum" else 1.0 / len(toks)
        K = sum(logp[s][a] - logq[s][a] for s, a in toks)
        for s, a in toks:
            w = K if placement == "reward" else 1.0 - math.exp(logq[s][a] - logp[s][a])
            for v in range(V):
                grad[s, v] += prob * c * w * ((1.0 if v == a else 0.0) - math.exp(logp[s][v]))
    return grad


# ---------------------------------------------------------------- cases
def _right(rng, b, t, lo=1):
    return (np.arange(t)[None, :] < rng.integers(lo, t + 1, b)[:, None]).astype(float)


def _space(V, T, eos):
    """The enumerated space as the three arrays the question takes (built by the library's
    enumeration: input data, not an answer)."""
    from klbook_lib import seqkl

    sp = seqkl.sequence_space(V, T, eos=eos)
    return (sp.sequences.double().numpy(), sp.mask.double().numpy(), sp.prefix_index.double().numpy(),
            sp.n_prefixes)


def _loss_batch(rng, b, t, spread, mask=None, junk=0.0, ref_spread=0.5):
    m = _right(rng, b, t) if mask is None else mask
    old = rng.uniform(-2.5, -0.1, (b, t))
    new = old + rng.normal(0, spread, (b, t))
    ref = old + rng.normal(0, ref_spread, (b, t))
    adv = rng.normal(0, 1, b)
    if junk:
        new, old, ref = (np.where(m > 0, x, rng.normal(0, junk, x.shape)) for x in (new, old, ref))
    return new, old, ref, adv, m


def questions() -> list[Question]:
    rng = np.random.default_rng(2503)
    rng_grad = np.random.default_rng(36)     # apart, so that the other cases keep their inputs
    # q1: group-normalised advantages
    adv = [
        pub(A([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]), 4, why="two groups of four, 0/1 rewards", torch=True,
            core=True),
        pub(A([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), 3, why="the first group's rewards are all equal", torch=True),
        hid(rng.integers(0, 2, 32).astype(float), 8, torch=True, core=True, probe="0/1 rewards, groups of 8"),
        hid(np.concatenate([rng.normal(5, 1, 4), rng.normal(-3, 0.1, 4)]), 4, torch=True, core=True,
            probe="groups with very different means and spreads"),
        hid(A([0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 0.5, 0.5, 0.5]), 3, torch=True, probe="every group constant"),
        hid(A([1.0, 0.0, 0.3]), 1, torch=True, probe="groups of one response"),
        hid(rng.normal(0, 1, 12), 2, torch=True, probe="groups of two"),
        hid(A([0.2, 0.2, 0.2, 0.2 + 1e-7]), 4, torch=True, probe="nearly equal rewards (the 1e-4)"),
    ]
    # q2: per-token k1 and k3
    m_r = _right(rng, 5, 6)
    m_l = _right(rng, 4, 5)[:, ::-1].copy()
    lp_junk = np.where(m_r > 0, rng.uniform(-3, -0.1, (5, 6)), rng.normal(0, 40, (5, 6)))
    lq_junk = np.where(m_r > 0, lp_junk + rng.normal(0, 0.8, (5, 6)), rng.normal(0, 40, (5, 6)))
    m_inf = _right(rng, 4, 6)
    lp_inf = np.where(m_inf > 0, rng.uniform(-3, -0.1, (4, 6)), -np.inf)
    lq_inf = np.where(m_inf > 0, lp_inf + rng.normal(0, 0.8, (4, 6)), -np.inf)
    lp_l = rng.uniform(-3, -0.1, (4, 5))
    kl = [
        pub(A([[-1.0, -2.0, 0.0]]), A([[-1.0, -2.0, 0.0]]), A([[1.0, 1.0, 0.0]]), "k3",
            why="pi_theta equals pi_ref: 0", torch=True),
        pub(A([[-0.5, -1.0], [-2.0, 7.0]]), A([[-1.0, -0.5], [-1.0, 3.0]]), A([[1.0, 1.0], [1.0, 0.0]]), "k1",
            why="k1 on a padded batch", torch=True, core=True),
        pub(A([[-0.5, -1.0], [-2.0, 7.0]]), A([[-1.0, -0.5], [-1.0, 3.0]]), A([[1.0, 1.0], [1.0, 0.0]]), "k3",
            why="k3 on a padded batch", torch=True, core=True),
        hid(lp_junk, lq_junk, m_r, "k1", torch=True, core=True, probe="k1, junk on the pads"),
        hid(lp_junk, lq_junk, m_r, "k3", torch=True, core=True, probe="k3, junk on the pads"),
        hid(lp_inf, lq_inf, m_inf, "k3", torch=True, core=True, probe="k3, -inf on the pads"),
        hid(lp_inf, lq_inf, m_inf, "k1", torch=True, probe="k1, -inf on the pads"),
        hid(lp_l, lp_l + rng.normal(0, 1.5, (4, 5)), m_l, "k3", torch=True, core=True,
            probe="k3, large log-ratios of both signs, left padding"),
        hid(lp_l, lp_l + rng.normal(0, 0.01, (4, 5)), np.ones((4, 5)), "k3", torch=True,
            probe="k3, tiny log-ratios (rounding)"),
    ]
    # q3: the GRPO loss with a placement
    loss = [
        pub(A([[-1.0, -2.0, 0.0]]), A([[-1.0, -2.0, 0.0]]), A([[-1.0, -2.0, 0.0]]), A([1.0]),
            A([[1.0, 1.0, 0.0]]), 0.3, 0.2, "loss", why="pi_theta = pi_old = pi_ref: the surrogate alone",
            torch=True),
        pub(A([[-0.9, -2.2, 5.0], [-1.0, 0.0, 0.0]]), A([[-1.0, -2.0, 5.0], [-1.1, 0.0, 0.0]]),
            A([[-1.3, -1.5, 5.0], [-0.6, 0.0, 0.0]]), A([1.0, -0.5]), A([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
            0.3, 0.2, "loss", why="the k3 term in the loss, a padded batch", torch=True, core=True),
        pub(A([[-0.9, -2.2, 5.0], [-1.0, 0.0, 0.0]]), A([[-1.0, -2.0, 5.0], [-1.1, 0.0, 0.0]]),
            A([[-1.3, -1.5, 5.0], [-0.6, 0.0, 0.0]]), A([1.0, -0.5]), A([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
            0.3, 0.2, "reward", why="the KL in the reward: the loss is the clipped surrogate", torch=True,
            core=True),
        hid(*_loss_batch(rng, 6, 4, 0.05), 0.1, 0.2, "loss", torch=True, probe="small steps"),
        hid(*_loss_batch(rng, 8, 4, 0.8), 0.3, 0.2, "loss", torch=True, core=True,
            probe="ratios beyond the clip range (the clip and the min)"),
        hid(*_loss_batch(rng, 8, 4, 0.8), 0.3, 0.2, "reward", torch=True, core=True,
            probe="ratios beyond the clip range, KL in the reward"),
        hid(*_loss_batch(rng, 6, 4, 0.3, junk=1e3), 0.3, 0.2, "loss", torch=True, core=True,
            probe="junk on the pads"),
        hid(*_loss_batch(rng, 6, 4, 0.01, ref_spread=1.5), 1.0, 0.2, "loss", torch=True, core=True,
            probe="a reference far from the policy: which estimator the loss uses"),
        hid(*_loss_batch(rng, 6, 4, 0.01, ref_spread=1.5), 1.0, 0.2, "reward", torch=True, core=True,
            probe="a reference far from the policy, KL in the reward"),
        hid(*_loss_batch(rng, 7, 4, 0.3, mask=A([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0],
                                                 [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], float)),
            0.5, 0.3, "loss", torch=True, core=True, probe="unequal lengths: how the tokens are averaged"),
        hid(*_loss_batch(rng, 5, 4, 0.3, mask=np.ones((5, 4))), 0.0, 0.2, "loss", torch=True, probe="beta = 0"),
    ]
    # issue 36: the loss's gradient with respect to the log-probabilities (a ratio computed from
    # detached log-probabilities has the right value and trains nothing)
    loss += [
        hid(*_loss_batch(rng_grad, 8, 4, 0.8), 0.3, 0.2, "loss", torch=True, core=True,
            grad=loss_gradient_reference,
            probe="the gradient of the loss with respect to logprobs (k3 in the loss, clipped ratios)"),
        hid(*_loss_batch(rng_grad, 6, 4, 0.3), 0.3, 0.2, "reward", torch=True, core=True,
            grad=loss_gradient_reference,
            probe="the gradient of the loss with respect to logprobs (KL in the reward)"),
    ]
    # q4: the exact expected gradient of each placement's KL term
    grad = []
    s22 = _space(2, 2, None)
    zero = np.zeros((s22[3], 2))
    pol = A([[0.5, -0.5], [1.0, 0.0], [0.0, 0.3]])
    grad += [
        pub(zero, zero, *s22[:3], "loss", "sum", why="pi_theta = pi_ref: zero", torch=True),
        pub(pol, zero, *s22[:3], "reward", "sum", why="V = 2, T = 2, KL in the reward", torch=True, core=True),
        pub(pol, zero, *s22[:3], "loss", "sum", why="V = 2, T = 2, k3 in the loss", torch=True, core=True),
    ]
    for (V, T, eos), scale in (((3, 2, None), 1.0), ((3, 3, 0), 1.0), ((4, 4, 0), 0.7), ((2, 4, 1), 1.5)):
        seqs, m, pidx, P = _space(V, T, eos)
        ref = rng.normal(0, 1.0, (P, V))
        theta = ref + rng.normal(0, scale, (P, V))
        for placement in ("reward", "loss"):
            for aggregation in ("sum", "sequence_mean"):
                core = eos is not None or aggregation == "sum"
                grad.append(hid(theta, ref, seqs, m, pidx, placement, aggregation, torch=True, core=core,
                                probe=f"V = {V}, T = {T}, {'EOS ' + str(eos) if eos is not None else 'no EOS'}: "
                                      f"{placement}, {aggregation}"))
    train = [task(s, p, judge=task_judge(TASK, "judge", placement=p),
                  probe=f"a training run on a seed of the grader's, placement {p!r}") for s, p in RUNS]
    return [
        Question("q1", "Group-normalised advantages", "function", "group_advantages", 2,
                 advantages_reference, tuple(adv), rtol=1e-6, atol=1e-9, library=CELLS_LIBRARY),
        Question("q2", "The per-token KL estimates", "function", "per_token_kl", 2,
                 kl_reference, tuple(kl), rtol=1e-6, atol=1e-10),
        Question("q3", "The GRPO loss with a KL placement", "function", "grpo_loss", 3,
                 loss_reference, tuple(loss), rtol=1e-6, atol=1e-10),
        Question("q4", "The exact expected gradient of the KL term", "function", "expected_kl_gradient", 4,
                 gradient_reference, tuple(grad), rtol=1e-6, atol=1e-10),
        Question("q5", "Which placement follows the sequence KL?", "choice", "answer_q5", 1, "B"),
        Question("q6", "Train your GRPO on the grader's seeds", "function", "train_project", 10,
                 outcome, tuple(train), timeout=TIMEOUT, library=CELLS_LIBRARY, task_library=TASK_LIBRARY,
                 full_marks_at=5,
                 run_groups=tuple(tuple(k for k, (_, p) in enumerate(RUNS) if p == place)
                                  for place in ("reward", "loss")),
                 public_checks=(dict(args=[100, "loss"], module=TASK, judge="judge",
                                     kwargs={"placement": "loss"}, why="training seed 100, k3 in the loss"),
                                dict(args=[100, "reward"], module=TASK, judge="judge",
                                     kwargs={"placement": "reward"}, why="training seed 100, KL in the reward"))),
    ]
