"""Distilling a GPT-2 teacher into a smaller student: forward KL, reverse KL, generalised JSD.

For an autoregressive teacher ``p`` and student ``q_theta`` the sequence-level KLs split
over tokens (the chain rule of KL):

    KL(p || q) = E_{y ~ p} [ sum_t KL(p(.|y_<t) || q(.|y_<t)) ]     forward: samples from the teacher
    KL(q || p) = E_{y ~ q} [ sum_t KL(q(.|y_<t) || p(.|y_<t)) ]     reverse: samples from the student

Three losses, one per method of the book's distillation chapter:

``forward_kl_loss``   token-level KL(teacher || student) over the whole vocabulary on sequences
                      *sampled from the teacher* (supervised KD; Hinton et al. 2015). The
                      sampling distribution does not depend on theta, so its gradient is the
                      exact gradient of the sequence-level forward KL.
``reverse_kl_loss``   KL(student || teacher) on the *student's own samples*, MiniLLM-style
                      (Gu et al. 2024): the per-token reverse KL (differentiated) plus a
                      policy-gradient term ``log q(y_t|y_<t) * (future cost)`` for the effect
                      of a token on the prefixes that follow. In expectation its gradient is
                      the exact gradient of the sequence-level reverse KL.
``gkd_loss``          GKD's generalised Jensen-Shannon divergence (Agarwal et al. 2024) per
                      token on the student's own samples, *without* the policy-gradient term
                      (GKD does not differentiate through the student's sampling).

``token_divergence`` gives the per-token divergences themselves. All functions take logits
``[B, T, V]`` that predict the response tokens, the tokens ``[B, T]`` and a 0/1 mask ``[B, T]``
(1 on real response tokens, EOS included; 0 on pads, left or right). Losses are summed over
a sequence's tokens and averaged over sequences (``reduction="sequence"``, an estimate of the
sequence-level divergence) or averaged over all real tokens (``reduction="token"``).

The training loop :func:`distil` and the helpers around it run the three methods on the
book's tiny pipeline: :func:`make_student` (a small GPT-2, down to no transformer layer at
all), :func:`train_student` (a shared warm start, then one method; cached next to the
pipeline), :func:`evaluate_student` (both KLs exactly, likelihoods, the true reward,
repetition, templates and sentiments of fresh samples) and :func:`student_report` (training
and evaluation, cached as JSON).
"""
from __future__ import annotations

import copy
import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm import tqdm
from transformers import GPT2Config, GPT2LMHeadModel

from ..divergences import kl_from_log_probs
from . import data as D
from . import rewards as R
from .checks import check_logits_pair, check_mask
from .models import train_sft
from .pipeline import atomic_build, cache_dir_for, cached_json
from .ppo import Rollout, encode_prompts, response_logits, sample_responses

__all__ = [
    "METHODS", "token_divergence", "forward_kl_loss", "reverse_kl_loss", "gkd_loss",
    "DistillConfig", "make_student", "pool_teacher_logits", "gather_pool_logits", "distil", "train_student",
    "evaluate_student",
    "response_style", "sentiment_class", "rollout_from_tokens", "load_student_init", "student_report",
]

METHODS = ("forward_kl", "reverse_kl", "gkd_jsd")
# the student's default shape, and the code every cached student depends on
STUDENT_SHAPE = dict(n_layer=1, n_embd=32, n_head=2)
_HERE = Path(__file__).parent
_STUDENT_CODE = (_HERE / "distill.py", _HERE / "ppo.py", _HERE / "models.py")
_KINDS = ("forward", "reverse", "jsd")


# --------------------------------------------------------------------------- checks
def _check_beta(beta) -> float:
    beta = float(beta)
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta: the generalised JSD needs 0 < beta < 1, got {beta}")
    return beta


def _reduce(per_token: torch.Tensor, mask: torch.Tensor, reduction: str) -> torch.Tensor:
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))
    if reduction == "sequence":
        return masked.sum(dim=1).mean()
    if reduction == "token":
        return masked.sum() / mask.sum()
    raise ValueError(f"reduction: must be 'sequence' or 'token', got {reduction!r}")


# --------------------------------------------------------------------------- divergences
def token_divergence(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                     response_mask: torch.Tensor, kind: str = "forward", beta: float = 0.5) -> torch.Tensor:
    """Per-token divergence between teacher ``p`` and student ``q`` at every position, ``[B, T]``.

    ``kind``: ``"forward"`` is ``KL(p || q)``, ``"reverse"`` is ``KL(q || p)``, ``"jsd"`` is
    GKD's generalised JSD ``beta KL(p || m) + (1 - beta) KL(q || m)`` with the mixture
    ``m = beta p + (1 - beta) q`` (``beta = 0.5``: the Jensen-Shannon divergence; small
    ``beta`` behaves like ``beta`` times the forward KL, ``beta`` near 1 like ``1 - beta``
    times the reverse KL). Zero on pads; the sum over the vocabulary is exact.
    """
    check_logits_pair("student_logits", student_logits, "teacher_logits", teacher_logits)
    mask = check_mask(response_mask, student_logits.shape[:2])
    if kind not in _KINDS:
        raise ValueError(f"kind: must be one of {_KINDS}, got {kind!r}")
    dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
    logq = torch.log_softmax(student_logits.to(dtype), -1)
    logp = torch.log_softmax(teacher_logits.to(dtype), -1)
    if kind == "forward":
        div = kl_from_log_probs(logp, logq)
    elif kind == "reverse":
        div = kl_from_log_probs(logq, logp)
    else:
        beta = _check_beta(beta)
        logm = torch.logaddexp(logp + math.log(beta), logq + math.log1p(-beta))
        div = beta * kl_from_log_probs(logp, logm) + (1 - beta) * kl_from_log_probs(logq, logm)
    return torch.where(mask, div, torch.zeros_like(div))


def forward_kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                    response_mask: torch.Tensor, reduction: str = "sequence") -> torch.Tensor:
    """Supervised KD: the token-level ``KL(teacher || student)`` on *teacher* samples.

    The teacher's logits are treated as constants. Summed over a sequence (the default
    reduction) and averaged over teacher-sampled sequences, it is an unbiased estimate of
    the sequence-level forward KL, and so is its gradient.
    """
    div = token_divergence(student_logits, teacher_logits.detach(), response_mask, "forward")
    return _reduce(div, check_mask(response_mask, div.shape), reduction)


def gkd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, response_mask: torch.Tensor,
             beta: float = 0.5, reduction: str = "sequence") -> torch.Tensor:
    """On-policy GKD: the generalised JSD per token on *student* samples, no gradient through sampling."""
    div = token_divergence(student_logits, teacher_logits.detach(), response_mask, "jsd", beta)
    return _reduce(div, check_mask(response_mask, div.shape), reduction)


def reverse_kl_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, response_ids: torch.Tensor,
                    response_mask: torch.Tensor, future: str = "exact", baseline: bool = True,
                    reduction: str = "sequence") -> torch.Tensor:
    """MiniLLM-style surrogate for the sequence-level ``KL(student || teacher)`` on *student* samples.

    With ``f_t = KL(q(.|y_<t) || p(.|y_<t))`` the per-token reverse KL,

        loss = sum_t f_t  +  sum_t log q(y_t | y_<t) * stopgrad(C_t),

    where the cost-to-go ``C_t`` is ``sum_{t' > t} f_t'`` (``future="exact"``: the exact KLs of
    the later prefixes) or ``sum_{t' > t} log q(y_t') - log p(y_t')`` (``future="sampled"``,
    the single-sample log-ratios MiniLLM uses); ``future="none"`` drops the second term
    (then only the per-token part remains, as in GKD with the reverse KL). For sequences
    ``y`` drawn from ``q`` the expected gradient of this loss equals the gradient of
    ``E_{y~q}[sum_t f_t] = KL(q || p)`` (the score-function identity); the loss's *value* is
    not the KL. ``baseline`` subtracts from ``C_t`` its mean over the batch at the same
    position (over rows where ``t`` is a real token), which lowers the variance; with it the
    expectation holds for large batches.
    """
    check_logits_pair("student_logits", student_logits, "teacher_logits", teacher_logits)
    mask = check_mask(response_mask, student_logits.shape[:2])
    if not isinstance(response_ids, torch.Tensor) or response_ids.shape != mask.shape:
        raise ValueError(f"response_ids: expected shape {tuple(mask.shape)}")
    if future not in ("exact", "sampled", "none"):
        raise ValueError(f"future: must be 'exact', 'sampled' or 'none', got {future!r}")
    f = token_divergence(student_logits, teacher_logits.detach(), mask, "reverse")
    loss_single = _reduce(f, mask, reduction)
    if future == "none":
        return loss_single
    logq_all = torch.log_softmax(student_logits.to(f.dtype), -1)
    logq = logq_all.gather(-1, response_ids.long().unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        if future == "exact":
            per = f.detach()
        else:
            logp = torch.log_softmax(teacher_logits.to(f.dtype), -1).gather(
                -1, response_ids.long().unsqueeze(-1)).squeeze(-1)
            per = torch.where(mask, logq.detach() - logp, torch.zeros_like(logq))
        # cost-to-go: sum over strictly later positions
        rev_cumsum = per.flip(1).cumsum(1).flip(1)
        cost = rev_cumsum - per
        if baseline:
            counts = mask.sum(0).clamp(min=1)
            mean = torch.where(mask, cost, torch.zeros_like(cost)).sum(0) / counts
            cost = cost - mean
        cost = torch.where(mask, cost, torch.zeros_like(cost))
    pg = torch.where(mask, logq * cost, torch.zeros_like(logq))
    return loss_single + _reduce(pg, mask, reduction)


# --------------------------------------------------------------------------- students
def make_student(tokenizer, n_layer: int = 1, n_embd: int = 32, n_head: int = 2, n_positions: int = 64,
                 seed: int = 0):
    """A small ``GPT2LMHeadModel`` with the tokenizer's vocabulary and special ids, no dropout."""

    for name, v in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head), ("n_positions", n_positions)):
        if not isinstance(v, int) or v < (0 if name == "n_layer" else 1):
            raise ValueError(f"{name}: must be a {'non-negative' if name == 'n_layer' else 'positive'} integer, got {v!r}")
    if n_embd % n_head:
        raise ValueError(f"n_head: must divide n_embd={n_embd}, got {n_head}")
    cfg = GPT2Config(vocab_size=len(tokenizer), n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                     n_positions=n_positions, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        setattr(model.generation_config, name, getattr(cfg, name))
    return model.eval()


@dataclass
class DistillConfig:
    """Settings of one distillation run (defaults sized for the tiny pipeline on a CPU)."""

    method: str = "forward_kl"
    steps: int = 150
    batch_size: int = 64
    lr: float = 3e-3
    max_new_tokens: int = 16
    jsd_beta: float = 0.5
    future: str = "exact"            # reverse_kl: how the cost-to-go is computed
    teacher_pool: int = 1024         # forward_kl: teacher samples drawn once and reused (0: fresh every step)
    max_grad_norm: float = 1.0

    def check(self) -> "DistillConfig":
        if self.method not in METHODS:
            raise ValueError(f"method: must be one of {METHODS}, got {self.method!r}")
        for name in ("steps", "batch_size", "max_new_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr: must be positive, got {self.lr!r}")
        _check_beta(self.jsd_beta)
        if self.future not in ("exact", "sampled", "none"):
            raise ValueError(f"future: must be 'exact', 'sampled' or 'none', got {self.future!r}")
        if not isinstance(self.teacher_pool, int) or self.teacher_pool < 0:
            raise ValueError(f"teacher_pool: must be a non-negative integer, got {self.teacher_pool!r}")
        return self


def rollout_from_tokens(tokenizer, prompts: Sequence[str], responses: Sequence[Sequence[int]]):
    """A :class:`klbook_lib.rlhf.ppo.Rollout` from prompts and response token ids (EOS included if any).

    The prompt is ``bos + prompt``, left-padded; the responses are right-padded with mask 0.
    """
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"responses: need one non-empty token list per prompt, got {len(responses)} for {len(prompts)}")
    if any(len(r) == 0 for r in responses):
        raise ValueError("responses: every response needs at least one token")
    ids, mask = encode_prompts(tokenizer, prompts)
    N = max(len(r) for r in responses)
    rid = torch.full((len(prompts), N), tokenizer.pad_token_id, dtype=torch.long)
    rmask = torch.zeros((len(prompts), N), dtype=torch.long)
    for i, r in enumerate(responses):
        rid[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        rmask[i, :len(r)] = 1
    eos = tokenizer.eos_token_id
    has_eos = ((rid == eos) & (rmask == 1)).any(1)
    texts = [tokenizer.decode([t for t in r if t != eos]) for r in responses]
    return Rollout(list(prompts), texts, torch.cat([ids, rid.to(ids.device)], 1),
                   torch.cat([mask, rmask.to(mask.device)], 1), ids.shape[1], rid.to(ids.device),
                   rmask.to(mask.device), has_eos.to(ids.device))


def _response_logits(model, rollout):
    return response_logits(model, rollout, 1.0)


def pool_teacher_logits(teacher, tokenizer, pool: Sequence[tuple[str, Sequence[int]]],
                        batch_size: int = 512) -> list[torch.Tensor]:
    """The teacher's logits ``[len(y), V]`` that predict each token of every pool response ``y``.

    ``pool`` holds ``(prompt, response token ids)`` pairs. The teacher is fixed, so in
    :func:`distil` these logits are computed once per pool and reused by every step that
    draws the pair (:func:`gather_pool_logits`), instead of a teacher forward pass per step;
    they equal :func:`klbook_lib.rlhf.ppo.response_logits` of the teacher on any batch that
    contains the pair, to float rounding (the logits are padding-aware).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")
    out: list[torch.Tensor] = []
    with torch.no_grad():
        for start in range(0, len(pool), batch_size):
            chunk = pool[start:start + batch_size]
            ro = rollout_from_tokens(tokenizer, [p for p, _ in chunk], [r for _, r in chunk])
            logits = _response_logits(teacher, ro)
            out += [logits[b, :len(r)].clone() for b, (_, r) in enumerate(chunk)]
    return out


def gather_pool_logits(pool_logits: Sequence[torch.Tensor], rows: Sequence[int]) -> torch.Tensor:
    """``[len(rows), N, V]`` teacher logits of the pool rows ``rows``, right-padded with zeros.

    ``N`` is the longest response among ``rows``: the layout of
    :func:`rollout_from_tokens` on the same rows (its mask is 0 on the padded positions).
    """
    if not len(rows):
        raise ValueError("rows: need at least one pool row")
    picked = [pool_logits[i] for i in rows]
    return torch.nn.utils.rnn.pad_sequence(picked, batch_first=True, padding_value=0.0)


def distil(teacher, student, tokenizer, prompts: Sequence[str], config: DistillConfig | None = None,
           seed: int = 0, progress: bool = False, cache_teacher: bool = True) -> list[dict]:
    """Train ``student`` in place towards ``teacher`` with ``config.method``; return a history.

    Each step draws ``batch_size`` prompts, samples one response per prompt from the teacher
    (``forward_kl``) or from the current student (``reverse_kl``, ``gkd_jsd``), computes both
    models' logits on those responses and takes one Adam step on the method's loss. The
    history logs ``loss`` and the exact per-sequence divergence the method estimates on its
    own samples (``divergence``: forward KL on teacher samples, reverse KL or JSD on student
    samples). With a teacher pool (``forward_kl``, ``teacher_pool > 0``) and ``cache_teacher``
    (default) the teacher's logits on the pool are computed once (:func:`pool_teacher_logits`)
    and gathered each step; ``cache_teacher=False`` recomputes them on every batch (the same
    numbers to float rounding, ``tests/test_rlhf_distill.py``).
    """
    cfg = (config or DistillConfig()).check()
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: need at least one prompt")
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=cfg.lr)
    pool = None
    if cfg.method == "forward_kl" and cfg.teacher_pool:
        pool = []                                 # (prompt, response token ids) drawn from the teacher
        for start in range(0, cfg.teacher_pool, 512):
            k = min(512, cfg.teacher_pool - start)
            idx = torch.randint(len(prompts), (k,), generator=gen).tolist()
            ro = sample_responses(teacher, tokenizer, [prompts[i] for i in idx], cfg.max_new_tokens, 1.0, gen)
            for b in range(k):
                toks = ro.response_ids[b][ro.response_mask[b].bool()].tolist()
                pool.append((ro.prompts[b], toks))
    pool_logits = pool_teacher_logits(teacher, tokenizer, pool) if pool is not None and cache_teacher else None
    history = []
    for step in tqdm(range(cfg.steps), desc=f"distil {cfg.method}", disable=not progress):
        student.eval()
        if pool is not None:
            rows = torch.randint(len(pool), (cfg.batch_size,), generator=gen).tolist()
            ro = rollout_from_tokens(tokenizer, [pool[i][0] for i in rows], [pool[i][1] for i in rows])
        else:
            idx = torch.randint(len(prompts), (cfg.batch_size,), generator=gen).tolist()
            batch = [prompts[i] for i in idx]
            sampler = teacher if cfg.method == "forward_kl" else student
            ro = sample_responses(sampler, tokenizer, batch, cfg.max_new_tokens, 1.0, gen)
        if pool_logits is not None:
            t_logits = gather_pool_logits(pool_logits, rows)
        else:
            with torch.no_grad():
                t_logits = _response_logits(teacher, ro)
        student.train()
        s_logits = _response_logits(student, ro)
        mask = ro.response_mask
        if cfg.method == "forward_kl":
            loss = forward_kl_loss(s_logits, t_logits, mask)
            kind = "forward"
        elif cfg.method == "reverse_kl":
            loss = reverse_kl_loss(s_logits, t_logits, ro.response_ids, mask, future=cfg.future)
            kind = "reverse"
        else:
            loss = gkd_loss(s_logits, t_logits, mask, beta=cfg.jsd_beta)
            kind = "jsd"
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), cfg.max_grad_norm)
        opt.step()
        with torch.no_grad():
            div = token_divergence(s_logits.detach(), t_logits, mask, kind, cfg.jsd_beta)
            history.append({"step": step, "loss": float(loss.detach()),
                            "divergence": float(div.sum(1).mean()),
                            "length": float(mask.float().sum(1).mean())})
    student.eval()
    return history


def train_student(pipe, method: str, config: DistillConfig | None = None, seed: int = 0,
                  student_shape: dict | None = None, warm_start_steps: int = 0, progress: bool = False):
    """Distil ``pipe``'s SFT model (the teacher) into a student; cached next to the pipeline.

    The student is :func:`make_student` with ``student_shape`` (default 1 layer, 32 dims),
    first trained for ``warm_start_steps`` steps of maximum likelihood on the corpus (the
    shared starting point of every method; seed 0 whatever ``seed`` is), then distilled
    with ``method`` for ``config.steps`` steps with ``seed``. Returns ``(student, history)``.
    """
    if method not in METHODS:
        raise ValueError(f"method: must be one of {METHODS}, got {method!r}")
    cfg = copy.copy(config) if config is not None else DistillConfig()
    cfg.method = method
    cfg.check()
    shape = {**STUDENT_SHAPE, **(student_shape or {})}
    if not isinstance(warm_start_steps, int) or warm_start_steps < 0:
        raise ValueError(f"warm_start_steps: must be a non-negative integer, got {warm_start_steps!r}")
    code = _STUDENT_CODE

    def warm():
        student = make_student(pipe.tokenizer, seed=0, **shape)
        if warm_start_steps:
            texts = [r.text for r in pipe.corpus]
            train_sft(student, pipe.tokenizer, texts, steps=warm_start_steps, batch_size=64, lr=3e-3, seed=0,
                      device=pipe.device, progress=progress)
        return student

    init_dir = cache_dir_for("student-init", pipe, dict(shape=shape, warm=warm_start_steps), code)

    def build_init(tmp: Path) -> None:
        warm().to("cpu").save_pretrained(tmp / "student")
        (tmp / "meta.json").write_text(json.dumps({"shape": shape, "warm_start_steps": warm_start_steps}))

    atomic_build(init_dir, build_init)
    settings = dict(shape=shape, warm=warm_start_steps, config=asdict(cfg), seed=int(seed))
    final = cache_dir_for("student", pipe, settings, code)

    def build(tmp: Path) -> None:
        t0 = time.time()
        student = GPT2LMHeadModel.from_pretrained(str(init_dir / "student"), local_files_only=True).to(pipe.device)
        hist = distil(pipe.ref_model, student, pipe.tokenizer, pipe.prompts, cfg, seed=seed, progress=progress)
        student.to("cpu").save_pretrained(tmp / "student")
        (tmp / "meta.json").write_text(json.dumps({"settings": settings, "history": hist,
                                                    "seconds": time.time() - t0}))

    atomic_build(final, build)
    meta = json.loads((final / "meta.json").read_text())
    student = GPT2LMHeadModel.from_pretrained(str(final / "student"), local_files_only=True).to(pipe.device).eval()
    return student, meta["history"]


def load_student_init(pipe, student_shape: dict | None = None, warm_start_steps: int = 0):
    """The shared starting student of :func:`train_student` (built and cached on first use)."""
    shape = {**STUDENT_SHAPE, **(student_shape or {})}
    code = _STUDENT_CODE
    init_dir = cache_dir_for("student-init", pipe, dict(shape=shape, warm=warm_start_steps), code)
    if not (init_dir / "meta.json").exists():
        train_student(pipe, "forward_kl", config=DistillConfig(steps=1), student_shape=student_shape,
                      warm_start_steps=warm_start_steps)
    return GPT2LMHeadModel.from_pretrained(str(init_dir / "student"), local_files_only=True).to(pipe.device).eval()


# --------------------------------------------------------------------------- evaluation
_STYLE_TEMPLATES = ("A .", "A and the N was A .", "A but the N was A .", "A , A and A .", "A and A .")


def response_style(response: str) -> str:
    """The template a response follows: adjectives -> ``A``, nouns -> ``N``, intensifiers dropped.

    One of the five templates of the corpus (``"A ."``, ``"A and the N was A ."``, ...) or
    ``"other"`` for anything the corpus never contains.
    """
    if not isinstance(response, str):
        raise ValueError(f"response: must be a string, got {type(response).__name__}")
    out = []
    for w in response.split():
        if w in D.ADVERBS:
            continue
        out.append("A" if w in D.WORD_SENTIMENT else "N" if w in D.NOUNS else w)
    sig = " ".join(out)
    return sig if sig in _STYLE_TEMPLATES else "other"


def sentiment_class(response: str, threshold: float = 0.25) -> str:
    """``"positive"``, ``"negative"`` or ``"neutral"`` by the mean adjective sentiment of ``response``."""
    s = D.sentiment_score(response)
    return "positive" if s > threshold else "negative" if s < -threshold else "neutral"


@torch.no_grad()
def _nll_and_kl(model_a, model_b, rollout, logits_a=None):
    """Per-sequence ``-log a(y)`` summed over tokens, token counts and exact ``sum_t KL(a || b)``.

    ``logits_a``: ``model_a``'s response logits on ``rollout`` if already computed.
    """
    la = _response_logits(model_a, rollout) if logits_a is None else logits_a
    lb = _response_logits(model_b, rollout)
    mask = rollout.response_mask.bool()
    logp = torch.log_softmax(la, -1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    nll_a = -torch.where(mask, logp, torch.zeros_like(logp)).sum(1)
    logp_b = torch.log_softmax(lb, -1).gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    nll_b = -torch.where(mask, logp_b, torch.zeros_like(logp_b)).sum(1)
    kl = R.sequence_sum(R.exact_token_kl(la, lb, mask), mask)          # sum_t KL(a(.|s_t) || b(.|s_t))
    logq = torch.log_softmax(la, -1)
    ent = -(logq.exp() * logq).sum(-1)
    ent = torch.where(mask, ent, torch.zeros_like(ent)).sum(1)
    return nll_a, nll_b, mask.sum(1).float(), kl, ent


_TEACHER_ROLLOUTS: dict = {}


@torch.no_grad()
def evaluate_student(pipe, student, n: int = 512, seed: int = 1234, teacher_rollout=None) -> dict:
    """Compare ``student`` with the teacher (``pipe.ref_model``) on ``n`` fresh samples of each.

    Keys: ``reverse_kl`` (exact ``sum_t KL(q || p)`` per student sample), ``forward_kl`` (exact
    ``sum_t KL(p || q)`` per teacher sample), ``student_nll_teacher`` (the student's negative
    log-likelihood per token of teacher samples), ``teacher_nll_student`` (the teacher's of
    student samples), ``true_reward``, ``repetition``, ``unfinished``, ``distinct``,
    ``entropy_token`` (the student's, on its samples), ``styles`` and ``sentiments``
    (fractions of each class), their standard errors (``*_se``) where they are means, and
    the raw ``responses``.
    """
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"n: must be an integer >= 2, got {n!r}")
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(pipe.prompts), (n,), generator=gen).tolist()
    prompts = [pipe.prompts[i] for i in idx]
    student.eval()
    t_logits = None
    if teacher_rollout is None:             # the same teacher samples for every student evaluated with this seed
        key = (id(pipe.ref_model), tuple(prompts), seed)
        if key not in _TEACHER_ROLLOUTS:
            _TEACHER_ROLLOUTS.clear()       # keep one: a chapter evaluates all its students on the same samples
            ro = sample_responses(pipe.ref_model, pipe.tokenizer, prompts, 16, 1.0,
                                  torch.Generator().manual_seed(seed + 1))
            # the teacher is fixed: its logits on its own samples are computed once, with the samples
            _TEACHER_ROLLOUTS[key] = (ro, _response_logits(pipe.ref_model, ro))
        teacher_rollout, t_logits = _TEACHER_ROLLOUTS[key]
    ro_t = teacher_rollout
    ro_s = sample_responses(student, pipe.tokenizer, prompts, 16, 1.0, gen)
    # student samples: KL(q || p), teacher's NLL of them, student's entropy
    nll_q_s, nll_p_s, len_s, rkl, ent = _nll_and_kl(student, pipe.ref_model, ro_s)
    # teacher samples: KL(p || q), student's NLL of them
    nll_p_t, nll_q_t, len_t, fkl, _ = _nll_and_kl(pipe.ref_model, student, ro_t, logits_a=t_logits)

    def mean_se(x):
        x = np.asarray(x, dtype=float)
        return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))

    out: dict = {"n": n, "responses": ro_s.responses}
    for key, x in (("reverse_kl", rkl), ("forward_kl", fkl),
                   ("true_reward", [D.true_reward(r) for r in ro_s.responses]),
                   ("repetition", [D.repetition_fraction(r) for r in ro_s.responses]),
                   ("unfinished", [float(D.words(r)[-1:] != ["."]) for r in ro_s.responses]),
                   ("entropy_seq", ent)):
        out[key], out[key + "_se"] = mean_se(x.numpy() if isinstance(x, torch.Tensor) else x)
    out["student_nll_teacher"] = float(nll_q_t.sum() / len_t.sum())
    out["teacher_nll_student"] = float(nll_p_s.sum() / len_s.sum())
    out["entropy_token"] = float(ent.sum() / len_s.sum())
    out["length"] = float(len_s.mean())
    out["distinct"] = len(set(ro_s.responses)) / n
    out["styles"] = dict(Counter(response_style(r) for r in ro_s.responses))
    out["sentiments"] = dict(Counter(sentiment_class(r) for r in ro_s.responses))
    out["teacher_styles"] = dict(Counter(response_style(r) for r in ro_t.responses))
    out["teacher_sentiments"] = dict(Counter(sentiment_class(r) for r in ro_t.responses))
    return out


def student_report(pipe, method: str, config: DistillConfig | None = None, seed: int = 0,
                   student_shape: dict | None = None, warm_start_steps: int = 0, n_eval: int = 512,
                   eval_seed: int = 1234) -> dict:
    """Train (or load) a student with :func:`train_student` and evaluate it; the result is cached.

    Returns ``{"history": [...], "eval": evaluate_student(...) without the raw responses but
    with the first 12 of them in "examples"}``.
    """
    cfg = copy.copy(config) if config is not None else DistillConfig()
    cfg.method = method
    cfg.check()
    shape = {**STUDENT_SHAPE, **(student_shape or {})}
    settings = dict(method=method, config=asdict(cfg), seed=int(seed), shape=shape, warm=warm_start_steps,
                    n_eval=int(n_eval), eval_seed=int(eval_seed))

    def compute() -> dict:
        student, hist = train_student(pipe, method, config=cfg, seed=seed, student_shape=shape,
                                      warm_start_steps=warm_start_steps)
        ev = evaluate_student(pipe, student, n=n_eval, seed=eval_seed)
        ev["examples"] = ev.pop("responses")[:12]
        return {"history": hist, "eval": ev}

    return cached_json("student-report", pipe, settings, compute,
                       _STUDENT_CODE)
