"""Sequence-level KL: exact computations on a small autoregressive policy.

A response ``y = (a_1, ..., a_T)`` is generated token by token; the state before token
``t`` is the prefix ``s_t = a_{<t}``. When the vocabulary and the length are small, every
sequence can be listed, and expectations over ``y ~ pi`` become finite sums. This module
does exactly that, so that the *expected* gradient of every common way of putting a KL
term into an RL update can be computed exactly, not estimated.

Notation (as in the book). ``pi_theta`` is the policy being trained, ``pi_ref`` the
frozen reference, ``pi_old`` the policy that sampled the batch (GRPO/PPO reuse a batch
for several updates, so ``pi_theta != pi_old`` after the first one). The sequence-level
penalty is the reverse KL

    KL(pi_theta || pi_ref) = E_{y ~ pi_theta}[ sum_t log pi_theta(a_t|s_t) - log pi_ref(a_t|s_t) ],

and its exact gradient (the policy-gradient theorem, with the log-ratio as a cost) is

    grad KL = E_{y ~ pi_theta}[ sum_t ( sum_{u >= t} k1_u ) grad log pi_theta(a_t|s_t) ],

with ``k1_u = log pi_theta(a_u|s_u) - log pi_ref(a_u|s_u)``. Per token, with the log-ratio
``l = log pi_theta - log pi_ref`` and ``rho = pi_ref / pi_theta = exp(-l)``:

    k1 = l,    k2 = l**2 / 2,    k3 = rho - 1 + l.

Implementations (``placement``):

- ``"reward"``: the estimate is a detached number inside the reward (PPO-RLHF). Token
  ``t`` is pushed by ``G_t grad log pi_theta(a_t|s_t)``, where ``G_t`` is the return:
  ``returns="to_go"`` sums the estimates from ``t`` to the end (gamma = 1, what a
  per-token reward fed to GAE/returns gives), ``"immediate"`` uses ``k_t`` alone
  (a discount of zero), ``"total"`` the whole sequence's sum for every token.
- ``"loss"``: the estimate is differentiated per token, ``grad k_t`` (GRPO adds
  ``beta * k3`` to the loss).

Samples come from ``pi_theta`` (on-policy) or from ``behaviour_logits`` = ``pi_old``
(GRPO-style); ``weights`` corrects for that: ``"none"``, ``"token"`` (each token's term
times its own ratio ``pi_theta(a_t|s_t) / pi_old(a_t|s_t)``, as PPO's and GRPO's
per-token ratios do) or ``"sequence"`` (every term times the whole sequence's ratio
``pi_theta(y) / pi_old(y)``, which makes the off-policy expectation equal to the
on-policy one exactly).

The policy is a table of logits, one row per prefix (:class:`SequenceSpace` lists them).
The functions accept any tensor of that shape, so the logits may come from a small
network: the gradient of :func:`expected_surrogate` with respect to the network's
parameters is then the expected gradient of the implementation for those parameters.

Functions
---------
``sequence_space``        list every prefix and every sequence (optionally with an EOS)
``random_logits``         a random tabular policy (seeded)
``token_logprobs``        log pi(a_t|s_t) of every sequence, [N, T], zero on pads
``sequence_logprobs``     log pi(y), [N]
``exact_kl``              KL(pi_p || pi_q) between two policies, by enumeration
``position_kl``           KL of the next-token distributions at each prefix of each sequence
``exact_kl_gradient``     grad_theta of KL(pi_theta || pi_ref) (or of the forward KL)
``kl_per_token``          k1 / k2 / k3 per token (:func:`klbook_lib.estimators.kl_per_token`)
``surrogate``             per-sequence surrogate whose gradient is one sample's gradient
``expected_surrogate``    its exact expectation under the sampling policy
``expected_gradient``     the exact expected gradient of an implementation
``sample``                ancestral sampling of sequences (indices into the space)
``gradient_error``        relative error and cosine between two gradients
``compare_implementations``  a table of those for several implementations
``expected_reward``       sum_y pi(y) r(y) for a reward on whole sequences (differentiable)
``optimal_logits``        the maximiser of E[r] - beta KL(pi || pi_ref), as a logits table
``fixed_point_logits``    where descending reward + a KL implementation stops (closed forms)

Aggregation (``aggregation``, for GRPO and its variants): a batch loss sums each sequence's
per-token terms (``"sum"``, PPO-RLHF's returns and Dr. GRPO's constant normaliser, up to a
constant), averages them over the sequence's own tokens (``"sequence_mean"``, GRPO's
``1/|o_i|``), or divides the sum by the batch's token count (``"token_mean"``, DAPO), whose
large-batch limit is the expected length under the sampling policy: a constant.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from .divergences import kl_from_log_probs
from .estimators import kl_per_token

__all__ = [
    "ESTIMATORS", "PLACEMENTS", "WEIGHTS", "RETURNS", "SequenceSpace", "sequence_space",
    "random_logits", "token_logprobs", "sequence_logprobs", "exact_kl", "position_kl",
    "exact_kl_gradient", "surrogate", "expected_surrogate",
    "expected_gradient", "sample", "gradient_error", "compare_implementations",
    "ON_POLICY_IMPLEMENTATIONS", "AGGREGATIONS", "expected_reward", "optimal_logits",
    "fixed_point_logits", "FIXED_POINT_IMPLEMENTATIONS",
]

ESTIMATORS = ("k1", "k2", "k3")
PLACEMENTS = ("reward", "loss")
WEIGHTS = ("none", "token", "sequence")
RETURNS = ("to_go", "immediate", "total")
AGGREGATIONS = ("sum", "sequence_mean", "token_mean")
MAX_SEQUENCES = 1_000_000

#: the six on-policy implementations: each estimator in the reward (summed returns) and in the loss
ON_POLICY_IMPLEMENTATIONS = tuple((k, p) for p in PLACEMENTS for k in ESTIMATORS)


# --------------------------------------------------------------------------- the space
@dataclass(frozen=True, eq=False)
class SequenceSpace:
    """Every prefix and every complete sequence of an autoregressive policy.

    Attributes:
        vocab_size: ``V``, the number of tokens.
        length: ``T``, the maximum number of tokens in a sequence.
        eos: the token that ends a sequence early, or ``None`` (all sequences have length T).
        prefixes: the prefixes ``s_t`` (tuples of tokens), one per row of a logits table.
        child: ``[n_prefixes, V]``, the row of ``s_t + (v,)``, or ``-1`` when the sequence ends.
        sequences: ``[N, T]`` tokens of every complete sequence, ``0`` after its end.
        mask: ``[N, T]`` bool, ``True`` on real tokens.
        prefix_index: ``[N, T]``, the row of the prefix before each token (``0`` on pads).
    """

    vocab_size: int
    length: int
    eos: int | None
    prefixes: tuple[tuple[int, ...], ...]
    child: torch.Tensor
    sequences: torch.Tensor
    mask: torch.Tensor
    prefix_index: torch.Tensor
    _keys: torch.Tensor
    _order: torch.Tensor

    @property
    def n_prefixes(self) -> int:
        return len(self.prefixes)

    @property
    def n_sequences(self) -> int:
        return int(self.sequences.shape[0])

    @property
    def lengths(self) -> torch.Tensor:
        """Number of real tokens of each sequence, [N]."""
        return self.mask.sum(1)

    def index_of(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The index (row of ``sequences``) of each padded sequence in a batch ``[B, T]``.

        ``mask`` is ``True`` on real tokens; tokens under ``False`` are ignored. A row that is
        not a sequence of this space is a ``ValueError``.
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[1] != self.length:
            shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"tokens: expected a [B, {self.length}] tensor, got {shape}")
        if not isinstance(mask, torch.Tensor) or mask.shape != tokens.shape:
            shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"mask: expected shape {tuple(tokens.shape)}, got {shape}")
        keys = _keys_of(tokens.long(), mask.bool(), self.vocab_size)
        pos = torch.searchsorted(self._keys, keys).clamp(max=len(self._keys) - 1)
        if not bool((self._keys[pos] == keys).all()):
            raise ValueError("tokens, mask: a row is not a sequence of this space")
        return self._order[pos]

    def tokens(self, index: int) -> tuple[int, ...]:
        """The tokens of sequence ``index`` (without padding)."""
        n = int(self.mask[index].sum())
        return tuple(int(v) for v in self.sequences[index, :n])

    def __repr__(self) -> str:
        return (f"SequenceSpace(vocab_size={self.vocab_size}, length={self.length}, eos={self.eos}, "
                f"n_prefixes={self.n_prefixes}, n_sequences={self.n_sequences})")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def sequence_space(vocab_size: int, length: int, eos: int | None = None) -> SequenceSpace:
    """List every prefix and every sequence of a policy over ``vocab_size`` tokens.

    Without ``eos`` every sequence has exactly ``length`` tokens (``V**T`` sequences).
    With ``eos`` a sequence ends at its first EOS or after ``length`` tokens, so
    sequences of different lengths coexist (padded, with ``mask`` marking real tokens),
    as in a batch of LM responses.
    """
    V = _check_int("vocab_size", vocab_size, 2)
    T = _check_int("length", length, 1)
    if eos is not None:
        eos = _check_int("eos", eos, 0)
        if eos >= V:
            raise ValueError(f"eos: must be a token in [0, {V}), got {eos}")
    branching = V - 1 if eos is not None else V
    # sequences: V**T without EOS; with EOS, those that stop at an EOS after t tokens plus the full ones
    n_sequences = V**T if eos is None else sum(branching**t for t in range(T - 1)) + V * branching**(T - 1)
    if n_sequences > MAX_SEQUENCES:
        raise ValueError(f"vocab_size, length: {n_sequences:,} sequences, more than the "
                         f"{MAX_SEQUENCES:,} this module enumerates")

    # prefixes, breadth first: () then every continuation that has not ended
    prefixes: list[tuple[int, ...]] = [()]
    frontier = [()]
    for _ in range(T - 1):
        nxt = [p + (v,) for p in frontier for v in range(V) if v != eos]
        prefixes.extend(nxt)
        frontier = nxt
    row = {p: i for i, p in enumerate(prefixes)}
    child = torch.full((len(prefixes), V), -1, dtype=torch.long)
    for p, i in row.items():
        for v in range(V):
            q = p + (v,)
            if q in row:
                child[i, v] = row[q]

    # complete sequences, depth first (lexicographic order)
    seqs: list[tuple[int, ...]] = []

    def walk(p: tuple[int, ...]) -> None:
        for v in range(V):
            q = p + (v,)
            if v == eos or len(q) == T:
                seqs.append(q)
            else:
                walk(q)

    walk(())
    N = len(seqs)
    sequences = torch.zeros(N, T, dtype=torch.long)
    mask = torch.zeros(N, T, dtype=torch.bool)
    prefix_index = torch.zeros(N, T, dtype=torch.long)
    for n, s in enumerate(seqs):
        for t, v in enumerate(s):
            sequences[n, t] = v
            mask[n, t] = True
            prefix_index[n, t] = row[s[:t]]
    keys = _keys_of(sequences, mask, V)
    order = torch.argsort(keys)
    return SequenceSpace(V, T, eos, tuple(prefixes), child, sequences, mask, prefix_index,
                         keys[order], order)


def _keys_of(tokens: torch.Tensor, mask: torch.Tensor, V: int) -> torch.Tensor:
    """A unique integer per padded sequence: digits (token + 1) in base V + 1, 0 for pads."""
    T = tokens.shape[1]
    base = torch.tensor([(V + 1) ** t for t in range(T)], dtype=torch.long)
    return (torch.where(mask, tokens + 1, torch.zeros_like(tokens)) * base).sum(1)


# --------------------------------------------------------------------------- checks
def check_space(space) -> SequenceSpace:
    """``space`` if it is a :class:`SequenceSpace`, else a ValueError naming the argument."""
    if not isinstance(space, SequenceSpace):
        raise ValueError(f"space: expected a SequenceSpace (see sequence_space), got {type(space).__name__}")
    return space


def check_logits(name: str, logits, space: SequenceSpace) -> torch.Tensor:
    """``logits`` if it is a finite floating-point table [n_prefixes, vocab_size] of ``space``,
    else a ValueError naming the argument ``name`` and what was wrong."""
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor of shape [{space.n_prefixes}, "
                         f"{space.vocab_size}], got {type(logits).__name__}")
    if tuple(logits.shape) != (space.n_prefixes, space.vocab_size):
        raise ValueError(f"{name}: expected shape [n_prefixes, vocab_size] = [{space.n_prefixes}, "
                         f"{space.vocab_size}], got {list(logits.shape)}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"{name}: expected floating-point logits, got {logits.dtype}")
    if not bool(torch.isfinite(logits.detach()).all()):
        raise ValueError(f"{name}: logits must be finite (every token has positive probability)")
    return logits


_check_space, _check_logits = check_space, check_logits


def check_advantage(space: SequenceSpace, advantage) -> torch.Tensor:
    """``advantage`` as a float64 tensor with one finite value per sequence of ``space``, else a
    ValueError naming the argument."""
    a = torch.as_tensor(advantage, dtype=torch.float64)
    if tuple(a.shape) != (space.n_sequences,):
        raise ValueError(f"advantage: expected one value per sequence, shape [{space.n_sequences}], "
                         f"got {list(a.shape)}")
    if not bool(torch.isfinite(a).all()):
        raise ValueError("advantage: every value must be finite")
    return a


def _check_choice(name: str, value, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}: must be one of {tuple(choices)}, got {value!r}")
    return value


def _generator(seed) -> torch.Generator:
    if isinstance(seed, torch.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an int or a torch.Generator, got {seed!r}")
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- policies
def random_logits(space: SequenceSpace, scale: float = 1.0, seed: int | torch.Generator = 0,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A random tabular policy: i.i.d. ``N(0, scale**2)`` logits, one row per prefix."""
    space = _check_space(space)
    scale = float(scale)
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale: must be a finite number >= 0, got {scale}")
    g = _generator(seed)
    return scale * torch.randn(space.n_prefixes, space.vocab_size, generator=g, dtype=dtype)


def token_logprobs(space: SequenceSpace, logits: torch.Tensor) -> torch.Tensor:
    """``log pi(a_t | s_t)`` for every token of every sequence, [N, T]; ``0`` on pads."""
    space = _check_space(space)
    logits = _check_logits("logits", logits, space)
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp[space.prefix_index, space.sequences]
    return torch.where(space.mask, lp, torch.zeros_like(lp))


def sequence_logprobs(space: SequenceSpace, logits: torch.Tensor) -> torch.Tensor:
    """``log pi(y) = sum_t log pi(a_t | s_t)`` for every sequence, [N]."""
    return token_logprobs(space, logits).sum(1)


def exact_kl(space: SequenceSpace, p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """``KL(pi_p || pi_q) = sum_y pi_p(y) log(pi_p(y) / pi_q(y))`` over all sequences.

    Differentiable in both arguments. ``exact_kl(space, theta, ref)`` is the RLHF penalty
    KL(pi_theta || pi_ref); ``exact_kl(space, ref, theta)`` the forward KL.
    """
    lp = sequence_logprobs(space, p_logits)
    lq = sequence_logprobs(space, _check_logits("q_logits", q_logits, space))
    return kl_from_log_probs(lp, lq, dim=-1)


def position_kl(space: SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """``KL(pi(.|s_t) || pi_ref(.|s_t))`` at the prefix before every token, [N, T]; ``0`` on pads.

    Summed over ``t`` and averaged under ``pi``, this is :func:`exact_kl` (the chain rule of KL).
    """
    space = _check_space(space)
    logp = torch.log_softmax(_check_logits("logits", logits, space), -1)
    logq = torch.log_softmax(_check_logits("ref_logits", ref_logits, space), -1)
    per_prefix = kl_from_log_probs(logp, logq, dim=-1)
    kl = per_prefix[space.prefix_index]
    return torch.where(space.mask, kl, torch.zeros_like(kl))


def _leaf(logits: torch.Tensor) -> torch.Tensor:
    return logits.detach().clone().requires_grad_(True)


def exact_kl_gradient(space: SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor,
                      direction: str = "reverse") -> torch.Tensor:
    """The exact gradient with respect to the logits table of pi_theta.

    ``direction="reverse"``: ``grad_theta KL(pi_theta || pi_ref)`` (the RLHF penalty);
    ``"forward"``: ``grad_theta KL(pi_ref || pi_theta)``. Computed by autograd on the
    enumerated sum. Returns a tensor shaped like ``logits``.
    """
    _check_choice("direction", direction, ("reverse", "forward"))
    theta = _leaf(_check_logits("logits", logits, space))
    ref = _check_logits("ref_logits", ref_logits, space).detach()
    value = exact_kl(space, theta, ref) if direction == "reverse" else exact_kl(space, ref, theta)
    return torch.autograd.grad(value, theta)[0]


# --------------------------------------------------------------------------- implementations
def _returns(k: torch.Tensor, mask: torch.Tensor, returns: str) -> torch.Tensor:
    k = torch.where(mask, k, torch.zeros_like(k))
    if returns == "immediate":
        return k
    if returns == "total":
        return k.sum(1, keepdim=True).expand_as(k)
    return k.flip(1).cumsum(1).flip(1)          # to_go: sum_{u >= t} k_u


def surrogate(space: SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor,
              estimator: str, placement: str, *, behaviour_logits: torch.Tensor | None = None,
              weights: str = "none", returns: str = "to_go", aggregation: str = "sum") -> torch.Tensor:
    """One surrogate value per sequence, [N]; its gradient is that sample's KL gradient.

    For a sequence ``y`` (sampled from ``pi_old`` = ``behaviour_logits``, or from pi_theta
    itself when ``behaviour_logits`` is ``None``) the surrogate is ``sum_t c_t g_t`` with

    - ``placement="reward"``: ``g_t = G_t * log pi_theta(a_t|s_t)``, ``G_t`` the detached
      return of the per-token estimates (see ``returns``);
    - ``placement="loss"``: ``g_t = k_t``, the estimate itself (not detached);

    and ``c_t = 1`` (``weights="none"``), the detached token ratio
    ``pi_theta(a_t|s_t) / pi_old(a_t|s_t)`` (``"token"``), or the detached sequence ratio
    ``pi_theta(y) / pi_old(y)`` (``"sequence"``). The sign is that of a loss: descending
    the gradient lowers the KL when the implementation is right. Multiply by beta for
    the term an RL loss adds. Pads contribute nothing.

    ``aggregation`` scales each sequence's sum: ``"sum"`` (as is), ``"sequence_mean"``
    (divided by the sequence's length, GRPO's ``1/|o_i|``) or ``"token_mean"`` (divided by
    the expected length under the sampling policy, the large-batch limit of DAPO's
    division by the batch's token count).
    """
    space = _check_space(space)
    _check_choice("estimator", estimator, ESTIMATORS)
    _check_choice("placement", placement, PLACEMENTS)
    _check_choice("weights", weights, WEIGHTS)
    _check_choice("returns", returns, RETURNS)
    _check_choice("aggregation", aggregation, AGGREGATIONS)
    lp = token_logprobs(space, logits)
    lq = token_logprobs(space, _check_logits("ref_logits", ref_logits, space)).detach()
    if behaviour_logits is None:
        lo = lp.detach()
    else:
        lo = token_logprobs(space, _check_logits("behaviour_logits", behaviour_logits, space)).detach()
    k = torch.where(space.mask, kl_per_token(lp, lq, estimator), torch.zeros_like(lp))
    if placement == "reward":
        g = _returns(k.detach(), space.mask, returns) * lp
    else:
        g = k
    if weights == "none":
        per_seq = g.sum(1)
    elif weights == "token":
        w = torch.where(space.mask, (lp - lo).exp(), torch.ones_like(lp)).detach()
        per_seq = (w * g).sum(1)
    else:
        per_seq = (lp - lo).sum(1).exp().detach() * g.sum(1)
    if aggregation == "sum":
        return per_seq
    lengths = space.lengths.to(per_seq.dtype)
    if aggregation == "sequence_mean":
        return per_seq / lengths
    mu = lo.sum(1).exp().detach()                      # the sampling policy's pi(y)
    return per_seq / (mu * lengths).sum()


def expected_surrogate(space: SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor,
                       estimator: str, placement: str, *, behaviour_logits: torch.Tensor | None = None,
                       weights: str = "none", returns: str = "to_go",
                       aggregation: str = "sum") -> torch.Tensor:
    """``sum_y mu(y) * surrogate(y)`` with ``mu`` the (detached) sampling policy.

    ``mu`` is pi_theta itself (on-policy) or ``behaviour_logits`` (pi_old). Its gradient,
    with respect to ``logits`` or to whatever produced them, is the exact expectation of
    the implementation's gradient over the batches it could have sampled.
    """
    values = surrogate(space, logits, ref_logits, estimator, placement,
                       behaviour_logits=behaviour_logits, weights=weights, returns=returns,
                       aggregation=aggregation)
    source = logits if behaviour_logits is None else behaviour_logits
    mu = sequence_logprobs(space, source).detach().exp()
    return (mu * values).sum()


def expected_gradient(space: SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor,
                      estimator: str, placement: str, *, behaviour_logits: torch.Tensor | None = None,
                      weights: str = "none", returns: str = "to_go",
                      aggregation: str = "sum") -> torch.Tensor:
    """The exact expected gradient (w.r.t. the logits table) of one implementation.

    See :func:`surrogate` for the arguments. On-policy, ``("k1", "reward")`` with
    ``returns="to_go"`` equals :func:`exact_kl_gradient`; ``("k2", "loss")`` equals it only
    for sequences of length 1.
    """
    theta = _leaf(_check_logits("logits", logits, space))
    ref = _check_logits("ref_logits", ref_logits, space).detach()
    behaviour = None if behaviour_logits is None else \
        _check_logits("behaviour_logits", behaviour_logits, space).detach()
    value = expected_surrogate(space, theta, ref, estimator, placement, behaviour_logits=behaviour,
                               weights=weights, returns=returns, aggregation=aggregation)
    return torch.autograd.grad(value, theta)[0]


# --------------------------------------------------------------------------- sampling
def sample(space: SequenceSpace, logits: torch.Tensor, n: int,
           seed: int | torch.Generator = 0) -> torch.Tensor:
    """Draw ``n`` sequences from the policy by ancestral sampling, token by token.

    Returns their indices into ``space.sequences`` ([n], long). Deterministic for a
    given ``seed`` (an int or a ``torch.Generator``).
    """
    space = _check_space(space)
    logits = _check_logits("logits", logits, space).detach()
    n = _check_int("n", n, 1)
    g = _generator(seed)
    probs = torch.softmax(logits.double(), -1)
    rows = torch.zeros(n, dtype=torch.long)
    tokens = torch.zeros(n, space.length, dtype=torch.long)
    alive = torch.ones(n, dtype=torch.bool)
    mask = torch.zeros(n, space.length, dtype=torch.bool)
    for t in range(space.length):
        idx = torch.nonzero(alive).flatten()
        if len(idx) == 0:
            break
        tok = torch.multinomial(probs[rows[idx]], 1, replacement=True, generator=g).squeeze(1)
        tokens[idx, t] = tok
        mask[idx, t] = True
        nxt = space.child[rows[idx], tok]
        alive[idx] = nxt >= 0
        rows[idx] = nxt.clamp(min=0)
    return space.index_of(tokens, mask)


# --------------------------------------------------------------------------- comparisons
def gradient_error(g: torch.Tensor, g_exact: torch.Tensor) -> dict[str, float]:
    """Relative error ``|g - g*| / |g*|``, cosine similarity and norm ratio ``|g| / |g*|``.

    The cosine is ``nan`` when ``g`` is zero (to within 1e-12 of ``|g*|``): a zero gradient
    has no direction.
    """
    if not isinstance(g, torch.Tensor) or not isinstance(g_exact, torch.Tensor):
        raise ValueError("g, g_exact: expected torch tensors")
    if g.shape != g_exact.shape:
        raise ValueError(f"g: shape {tuple(g.shape)} does not match g_exact shape {tuple(g_exact.shape)}")
    a, b = g.detach().flatten().double(), g_exact.detach().flatten().double()
    nb = float(b.norm())
    if nb == 0.0:
        raise ValueError("g_exact: the reference gradient is zero, a relative error is undefined")
    na = float(a.norm())
    cosine = float(a @ b) / (na * nb) if na > 1e-12 * nb else float("nan")
    return {"rel_error": float((a - b).norm()) / nb, "cosine": cosine, "norm_ratio": na / nb}


def compare_implementations(space: SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor,
                            implementations: Iterable[tuple] = ON_POLICY_IMPLEMENTATIONS, *,
                            behaviour_logits: torch.Tensor | None = None,
                            reference: torch.Tensor | None = None) -> list[dict]:
    """Expected gradient of each implementation against the exact grad KL(pi_theta || pi_ref).

    Each implementation is a tuple ``(estimator, placement)`` or
    ``(estimator, placement, weights)`` or ``(estimator, placement, weights, returns)`` or
    ``(estimator, placement, weights, returns, aggregation)``.
    Returns one dict per implementation with the keys ``estimator``, ``placement``,
    ``weights``, ``returns``, ``aggregation``, ``rel_error``, ``cosine`` and ``norm_ratio``.
    """
    g_star = exact_kl_gradient(space, logits, ref_logits) if reference is None else reference
    rows = []
    for impl in implementations:
        if not isinstance(impl, tuple) or not 2 <= len(impl) <= 5:
            raise ValueError(f"implementations: each entry must be (estimator, placement[, weights"
                             f"[, returns[, aggregation]]]), got {impl!r}")
        estimator, placement = impl[0], impl[1]
        weights = impl[2] if len(impl) > 2 else "none"
        returns = impl[3] if len(impl) > 3 else "to_go"
        aggregation = impl[4] if len(impl) > 4 else "sum"
        g = expected_gradient(space, logits, ref_logits, estimator, placement,
                              behaviour_logits=behaviour_logits, weights=weights, returns=returns,
                              aggregation=aggregation)
        rows.append({"estimator": estimator, "placement": placement, "weights": weights,
                     "returns": returns, "aggregation": aggregation, **gradient_error(g, g_star)})
    return rows


# --------------------------------------------------------------------------- where training stops
#: the placements whose stationary policy (task reward plus beta times the KL term) has a closed form
FIXED_POINT_IMPLEMENTATIONS = (("k1", "reward"), ("k2", "loss"), ("k3", "loss"))


def _check_reward(space: SequenceSpace, reward) -> torch.Tensor:
    if not isinstance(reward, torch.Tensor):
        reward = torch.as_tensor(reward, dtype=torch.float64)
    if tuple(reward.shape) != (space.n_sequences,):
        raise ValueError(f"reward: expected one value per sequence, shape [{space.n_sequences}], "
                         f"got {list(reward.shape)}")
    if not bool(torch.isfinite(reward).all()):
        raise ValueError("reward: every value must be finite")
    return reward.double()


def _check_beta(beta) -> float:
    beta = float(beta)
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta: must be a finite number > 0, got {beta}")
    return beta


def expected_reward(space: SequenceSpace, logits: torch.Tensor, reward) -> torch.Tensor:
    """``E_{y ~ pi}[r(y)] = sum_y pi(y) r(y)``, differentiable in ``logits``.

    ``reward`` holds one number per sequence of the space (``[N]``, in the order of
    ``space.sequences``). Its gradient is the exact policy gradient of the task reward.
    """
    space = _check_space(space)
    r = _check_reward(space, reward).to(logits.dtype if isinstance(logits, torch.Tensor) else torch.float64)
    return (sequence_logprobs(space, logits).exp() * r).sum()


def _backward_tables(space: SequenceSpace, reward: torch.Tensor):
    """Rows deepest first, and for every (prefix row, token) the reward of the sequence it ends (or nan)."""
    index = {space.tokens(n): n for n in range(space.n_sequences)}
    terminal_reward = torch.full((space.n_prefixes, space.vocab_size), float("nan"), dtype=torch.float64)
    for i, p in enumerate(space.prefixes):
        for v in range(space.vocab_size):
            if int(space.child[i, v]) < 0:
                terminal_reward[i, v] = reward[index[p + (v,)]]
    order = sorted(range(space.n_prefixes), key=lambda i: -len(space.prefixes[i]))
    return order, terminal_reward


def _forward_kl_row(log_q: torch.Tensor, Q: torch.Tensor, beta: float) -> torch.Tensor:
    """log pi with pi(a) = beta q(a) / (lam - Q(a)), lam > max Q chosen so that pi sums to 1.

    sum_a beta q(a) / (lam - Q(a)) decreases from +inf (lam -> max Q) to at most 1 at
    lam = max Q + beta, so the root is found by bisection on (max Q, max Q + beta].
    """
    q = log_q.exp()
    lo, hi = float(Q.max()), float(Q.max()) + beta
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= float(Q.max()):
            break
        total = float((beta * q / (mid - Q)).sum())
        if total > 1.0:
            lo = mid
        else:
            hi = mid
    lam = hi
    pi = beta * q / (lam - Q)
    return (pi / pi.sum()).log()


def fixed_point_logits(space: SequenceSpace, ref_logits: torch.Tensor, reward, beta: float,
                       implementation: tuple = ("k1", "reward")) -> torch.Tensor:
    """The policy at which ``-grad E[r] + beta * (the implementation's expected KL gradient)`` vanishes.

    Returns a table of log-probabilities (valid logits), one row per prefix, built by a
    backward recursion over the prefixes with ``Q(s, a)`` the reward of the sequence that
    ``a`` ends, or the value of the child prefix:

    - ``("k1", "reward")`` (k1 in the reward, summed returns: the exact KL gradient):
      ``pi(a|s) = pi_ref(a|s) exp((Q(s,a) - V(s)) / beta)`` with the *soft* value
      ``V(s) = beta log sum_a pi_ref(a|s) exp(Q(s,a) / beta)``: the optimum
      ``pi*(y) ~ pi_ref(y) exp(r(y) / beta)`` of the regularised objective.
    - ``("k2", "loss")`` (a per-token reverse-KL loss, the partial gradient):
      ``pi(a|s) ~ pi_ref(a|s) exp(Q(s,a) / beta)`` with the *plain* value
      ``V(s) = sum_a pi(a|s) Q(s,a)``: each position is regularised, but the KL still
      to come after a choice is not charged to it.
    - ``("k3", "loss")`` (GRPO's term, the partial forward-KL gradient):
      ``pi(a|s) = beta pi_ref(a|s) / (lam_s - Q(s,a))``, ``lam_s > max_a Q(s,a)`` fixed by
      normalisation, and ``V(s) = lam_s - beta``.

    ``reward`` has one value per sequence (``[N]``), ``beta > 0``.
    """
    space = _check_space(space)
    ref = _check_logits("ref_logits", ref_logits, space).detach().double()
    r = _check_reward(space, reward)
    beta = _check_beta(beta)
    impl = tuple(implementation)
    if impl not in FIXED_POINT_IMPLEMENTATIONS:
        raise ValueError(f"implementation: must be one of {FIXED_POINT_IMPLEMENTATIONS}, got {implementation!r}")
    log_ref = torch.log_softmax(ref, -1)
    order, terminal_reward = _backward_tables(space, r)
    value = torch.zeros(space.n_prefixes, dtype=torch.float64)
    out = torch.zeros_like(log_ref)
    for i in order:
        children = space.child[i]
        Q = torch.where(children >= 0, value[children.clamp(min=0)], terminal_reward[i])
        if impl == ("k1", "reward"):
            v = beta * torch.logsumexp(log_ref[i] + Q / beta, -1)
            out[i] = log_ref[i] + (Q - v) / beta
        elif impl == ("k2", "loss"):
            out[i] = torch.log_softmax(log_ref[i] + Q / beta, -1)
            v = (out[i].exp() * Q).sum()
        else:
            out[i] = _forward_kl_row(log_ref[i], Q, beta)
            v = (out[i].exp() * Q).sum()
        value[i] = v
    return out


def optimal_logits(space: SequenceSpace, ref_logits: torch.Tensor, reward, beta: float) -> torch.Tensor:
    """The maximiser of ``E[r] - beta KL(pi || pi_ref)`` as a logits table (log-probabilities).

    Its sequence probabilities are ``pi_ref(y) exp(r(y) / beta) / Z``; this is
    :func:`fixed_point_logits` with ``("k1", "reward")``.
    """
    return fixed_point_logits(space, ref_logits, reward, beta, ("k1", "reward"))
