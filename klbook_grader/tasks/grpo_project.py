"""Project 3's outcome task: a student's own GRPO on the book's enumerable sequence model.

The policy is a table of logits, one row per prefix, of the small autoregressive model of
:mod:`klbook_lib.seqkl`: ``V = 4`` tokens, token ``0`` is EOS, at most ``T = 4`` tokens, so
there are 121 responses and 40 prefixes, and every expectation over responses is an exact sum.
The reward is *verifiable*: a program checks each response (:func:`verify`): it is 1 when the
response stops with EOS after at least two other tokens and holds token 1 among them, else 0.
The reference policy ``pi_ref`` (:func:`reference_logits`) earns about 0.2 of it.

The student writes GRPO (group-normalised advantages, the per-token KL estimates, the clipped
loss with the KL term in the loss or in the reward, the loop); this module hands out the
problem and thin plumbing, and holds the grader's judge:

``space_arrays()``            the 121 responses as ``(sequences [121, 4], mask [121, 4],
                              prefix_index [121, 4])``: token ids (0 after the end), 1 on real
                              tokens, the row of the logits table that predicts each token;
``reference_logits()``        ``pi_ref``'s table ``[40, 4]`` (float64, a fresh copy);
``reward_table()``            the verifiable reward of each of the 121 responses;
``sample(logits, n, generator)``  ``n`` responses from a table (ancestral sampling): their
                              tokens ``[n, 4]``, mask ``[n, 4]`` and indices into the space ``[n]``;
``token_logprobs(logits, tokens, mask)``  ``log pi(a_t|s_t)`` of a batch ``[n, 4]``, 0 on pads
                              (gradients flow into ``logits``);
``rewards(index)``            the verifiable reward of sampled responses ``[n]``;
``evaluate(logits)``          the exact expected reward and ``KL(pi_theta || pi_ref)`` of a table,
                              by enumeration (:func:`klbook_lib.seqkl.expected_reward`,
                              :func:`klbook_lib.seqkl.exact_kl`);
:func:`package`               what the notebook's given ``train_project`` returns: the student's
                              run ``[logits, history, snapshots]`` plus the probe of the loss's KL
                              term (:func:`loss_probe`).

:func:`judge` scores one run in the grader's own process: it reads the returned table and the
table after every iteration and evaluates them itself, exactly. Credits of one run (they add
up to 1):

* nothing unless the run is well formed, the student's ``grpo_loss`` passes the probe for the
  run's placement, the logged KL of every iteration is the exact KL the judge computes from
  that iteration's table, and the training kept reaching new prefixes: it updated rows of the
  table after its third iteration that the first three had left untouched, or it updated at
  least :data:`MIN_ROWS` of the 40 rows (every iteration samples a fresh batch);
* 0.5 *reward gained*: the exact expected reward beats ``pi_ref``'s by at least
  :data:`REWARD_GAIN`;
* 0.5 *within the KL budget*: the exact ``KL(pi_theta || pi_ref)`` is at most :data:`KL_BUDGET`
  nats, counted for a run that gained at least half of :data:`REWARD_GAIN`.

The module imports :mod:`klbook_lib.seqkl` inside its functions only: the notebook's cells see
this module, not the library that computes the exact sums.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch

V, T, EOS = 4, 4, 0
REF_SEED, REF_SCALE = 2, 1.0
PLACEMENTS = ("reward", "loss")
GROUP_SIZE = 8                # responses per group (the graded runs may use another size)
BETA = 0.3                    # the KL coefficient of the graded runs
ITERATIONS = 80               # GRPO iterations (fresh batches) of a graded run
HISTORY_COLUMNS = ("mean_reward", "kl")
#: What a graded run must reach (see the module docstring).
REWARD_GAIN = 0.5             # exact expected reward above pi_ref's
KL_BUDGET = 1.8               # nats, exact KL(pi_theta || pi_ref) of whole responses
KL_RTOL = 1e-6                # the logged KL against the judge's exact value
EARLY = 3                     # iterations after which new prefixes must still be reached ...
MIN_ROWS = 36                 # ... unless at least this many rows of the table were updated
PROBE_SEED = 2503
PROBE_RTOL = 1e-6


def verify(tokens) -> float:
    """The verifiable reward of one response (its tokens, without padding): 1 when it ends with
    EOS after at least two other tokens and token 1 is among them, else 0."""
    toks = [int(t) for t in tokens]
    return float(len(toks) >= 3 and toks[-1] == EOS and 1 in toks[:-1])


@functools.lru_cache(maxsize=1)
def _space():
    from klbook_lib import seqkl

    return seqkl.sequence_space(V, T, eos=EOS)


def space_arrays() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sequences, mask, prefix_index)`` of the 121 responses, each ``[121, 4]``: the token ids
    (0 after a response's end), 1.0 on real tokens (float64), and the row of the logits table
    (the prefix) that predicts each token (0 on pads)."""
    sp = _space()
    return sp.sequences.clone(), sp.mask.double(), sp.prefix_index.clone()


def n_prefixes() -> int:
    """The number of rows of a logits table (40)."""
    return _space().n_prefixes


@functools.lru_cache(maxsize=1)
def _reference() -> torch.Tensor:
    from klbook_lib import seqkl

    return seqkl.random_logits(_space(), scale=REF_SCALE, seed=REF_SEED)


def reference_logits() -> torch.Tensor:
    """``pi_ref``'s logits table ``[40, 4]`` (float64, a fresh copy)."""
    return _reference().clone()


@functools.lru_cache(maxsize=1)
def _reward_table() -> torch.Tensor:
    sp = _space()
    return torch.tensor([verify(sp.tokens(n)) for n in range(sp.n_sequences)], dtype=torch.float64)


def reward_table() -> torch.Tensor:
    """The verifiable reward of each response, ``[121]`` (in the order of :func:`space_arrays`)."""
    return _reward_table().clone()


def sample(logits: torch.Tensor, n: int, generator: torch.Generator
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` responses drawn from the table ``logits`` token by token (no gradient):
    ``(tokens [n, 4] long, mask [n, 4] float64, index [n] long)``, ``index`` into the space."""
    from klbook_lib import seqkl

    if not isinstance(generator, torch.Generator):
        raise ValueError("generator: expected a torch.Generator")
    sp = _space()
    index = seqkl.sample(sp, logits.detach().double(), int(n), seed=generator)
    return sp.sequences[index].clone(), sp.mask[index].double(), index


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log pi(a_t|s_t)`` of a batch of responses, ``[n, 4]``, 0 on pads; gradients flow into
    ``logits``. ``tokens`` and ``mask`` are what :func:`sample` returns."""
    from klbook_lib import seqkl

    sp = _space()
    return seqkl.token_logprobs(sp, logits)[sp.index_of(tokens.long(), mask > 0)]


def rewards(index: torch.Tensor) -> torch.Tensor:
    """The verifiable reward of sampled responses (their ``index`` from :func:`sample`), ``[n]``."""
    return _reward_table()[torch.as_tensor(index).long()].clone()


def evaluate(logits) -> dict:
    """The exact ``expected_reward`` (sum over every response of pi(y) r(y)) and ``kl``
    (``KL(pi_theta || pi_ref)`` of whole responses) of a logits table, as plain floats."""
    from klbook_lib import seqkl

    table = torch.as_tensor(np.asarray(logits.detach() if isinstance(logits, torch.Tensor) else logits,
                                       dtype=np.float64))
    sp = _space()
    if tuple(table.shape) != (sp.n_prefixes, V):
        raise ValueError(f"logits: expected a table of shape [{sp.n_prefixes}, {V}], got {list(table.shape)}")
    if not bool(torch.isfinite(table).all()):
        raise ValueError("logits: the table is not all finite")
    with torch.no_grad():
        return {"expected_reward": float(seqkl.expected_reward(sp, table, _reward_table())),
                "kl": float(seqkl.exact_kl(sp, table, _reference()))}


# ------------------------------------------------------------------ the probe of the loss
def loss_probe_inputs() -> tuple:
    """Fixed inputs ``(logprobs, old_logprobs, ref_logprobs, advantages, mask)`` of 6 responses of
    at most 4 tokens, right-padded (junk on the pads)."""
    rng = np.random.default_rng(PROBE_SEED)
    B = 6
    lengths = np.array([4, 1, 3, 2, 4, 3])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(float)
    old = rng.uniform(-2.5, -0.2, (B, T))
    lp = old + rng.normal(0, 0.1, (B, T))
    ref = old + rng.normal(0, 0.5, (B, T))
    junk = rng.normal(0, 30, (B, T))
    lp, old, ref = (np.where(mask > 0, x, junk) for x in (lp, old, ref))
    return lp, old, ref, rng.normal(0, 1, B), mask


PROBE_BETA, PROBE_CLIP = 0.3, 0.2


def loss_probe(grpo_loss: Callable, placement: str) -> np.ndarray:
    """``[L(beta) - L(0), its gradient in logprobs]`` of ``grpo_loss`` on :func:`loss_probe_inputs`
    for one ``placement`` (torch tensors in; one flat float64 array out)."""
    lp, old, ref, adv, mask = (torch.as_tensor(x, dtype=torch.float64) for x in loss_probe_inputs())
    out = []
    for beta in (PROBE_BETA, 0.0):
        x = lp.clone().requires_grad_(True)
        loss = grpo_loss(x, old, ref, adv, mask, beta, PROBE_CLIP, placement)
        (grad,) = torch.autograd.grad(loss, x, allow_unused=True)
        grad = torch.zeros_like(x) if grad is None else torch.where(mask > 0, grad, torch.zeros_like(grad))
        out.append((float(loss.detach()), grad.detach()))
    (l1, g1), (l0, g0) = out
    return np.concatenate([[l1 - l0], (g1 - g0).numpy().reshape(-1)])


def expected_loss_probe(placement: str) -> np.ndarray:
    """What :func:`loss_probe` gives for a correct loss: 0 for ``"reward"`` (the KL is in the
    rewards); for ``"loss"``, beta times the k3 term, averaged over each response's real tokens
    and then over responses, and its gradient."""
    from klbook_lib.estimators import k3_from_log_ratio

    lp, old, ref, adv, mask = (torch.as_tensor(x, dtype=torch.float64) for x in loss_probe_inputs())
    if placement == "reward":
        return np.zeros(1 + lp.numel())
    m = mask > 0
    x = lp.clone().requires_grad_(True)
    k3 = torch.where(m, k3_from_log_ratio(torch.where(m, ref - x, torch.zeros_like(x))), torch.zeros_like(x))
    term = PROBE_BETA * (k3.sum(1) / m.sum(1).clamp(min=1)).mean()
    (grad,) = torch.autograd.grad(term, x)
    return np.concatenate([[float(term.detach())], grad.numpy().reshape(-1)])


def package(run, grpo_loss: Callable, placement: str) -> list:
    """``run`` (the student's ``[logits, history, snapshots]``) plus :func:`loss_probe` of
    ``grpo_loss`` at the run's ``placement``: what the grader receives from one training call."""
    if not isinstance(run, (list, tuple)) or len(run) != 3:
        raise ValueError("train_grpo must return [logits, history, snapshots]")
    return [*run, loss_probe(grpo_loss, placement)]


# ------------------------------------------------------------------ the judge
def _changed_rows(table: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.any(table != ref, axis=1)


def judge(result, placement: str) -> tuple[float, str]:
    """Score one run (the plain data :func:`package` returns): ``(credit in [0, 1], message)``."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: must be one of {PLACEMENTS}, got {placement!r}")
    ref = reference_logits().numpy()
    try:
        logits, history, snapshots, probe = result
        logits = np.asarray(logits, dtype=np.float64)
        history = np.asarray(history, dtype=np.float64)
        snapshots = np.asarray(snapshots, dtype=np.float64)
        if history.ndim != 2 or history.shape[1] != len(HISTORY_COLUMNS) or len(history) < EARLY + 1:
            raise ValueError(f"the history must have one row per iteration and the columns {HISTORY_COLUMNS}")
        if snapshots.shape != (len(history), *ref.shape):
            raise ValueError(f"the snapshots must be one table {list(ref.shape)} per iteration of the history")
        if not np.array_equal(snapshots[-1], logits):
            raise ValueError("the last snapshot is not the returned table")
        evals = [evaluate(s) for s in snapshots]   # the last snapshot is the returned table
        final, kls = evals[-1], np.array([e["kl"] for e in evals])
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training result [logits, history, snapshots, probe]: {exc}"
    want = expected_loss_probe(placement)
    got = np.asarray(probe, dtype=np.float64).reshape(-1)
    if got.shape != want.shape or not np.allclose(got, want, rtol=PROBE_RTOL, atol=1e-9):
        return 0.0, (f"grpo_loss with placement={placement!r} does not give the KL term this placement asks "
                     "for (the probe of the given train_project: grpo_loss(beta) - grpo_loss(0) and its gradient "
                     "on fixed inputs); a run without the right KL term earns nothing")
    reported = history[:, 1]
    if not np.allclose(reported, kls, rtol=KL_RTOL, atol=1e-9):
        worst = int(np.argmax(np.abs(reported - kls)))
        return 0.0, (f"the logged KL is not the exact KL of the iteration's table (iteration {worst}: logged "
                     f"{reported[worst]:.6g}, exact {kls[worst]:.6g}); a history that does not match the "
                     "policies earns nothing")
    early = _changed_rows(snapshots[EARLY - 1], ref)
    updated = _changed_rows(logits, ref)
    later = updated & ~early
    if not later.any() and updated.sum() < MIN_ROWS:
        return 0.0, (f"no prefix that the first {EARLY} iterations left untouched was updated later, and only "
                     f"{int(updated.sum())} of the {len(ref)} rows were ever updated: the run did not keep "
                     "training on fresh batches from the current policy, and earns nothing")
    base = evaluate(ref)["expected_reward"]
    gain = final["expected_reward"] - base
    gained = gain >= REWARD_GAIN
    bounded = gain >= REWARD_GAIN / 2 and final["kl"] <= KL_BUDGET
    msg = (f"placement {placement!r}: exact expected reward {final['expected_reward']:.3f} "
           f"({gain:+.3f} against pi_ref's {base:.3f}; needs >= {REWARD_GAIN:g}), exact KL(pi_theta || pi_ref) "
           f"{final['kl']:.3f} nats (needs <= {KL_BUDGET:g} with a gain of at least {REWARD_GAIN / 2:g}); "
           f"the logged KL matches the exact one at all {len(history)} iterations; {int(updated.sum())} rows of "
           f"the table updated, {int(later.sum())} of them first after iteration {EARLY}")
    return 0.5 * gained + 0.5 * bounded, msg
