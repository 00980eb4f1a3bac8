"""Data-parallel PPO-RLHF with ``torch.distributed``, launched by ``torchrun``.

One machine, two processes on the CPU (backend gloo) or two GPUs (backend nccl)::

    torchrun --nproc_per_node=2 -m klbook_lib.rlhf.demo --preset tiny --device cpu --steps 20
    torchrun --nproc_per_node=2 -m klbook_lib.rlhf.demo --preset small --device cuda

Several machines: the same command on each, with ``--nnodes=M --node-rank=i`` (or
``--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB``), see the README.

What each of the ``W`` processes ("ranks") does in one PPO iteration with a global batch
of ``B`` prompts (:func:`klbook_lib.rlhf.ppo.train_ppo` with ``dist=``):

* every rank draws the same ``B`` prompt indices from the same seeded generator and keeps
  its contiguous block of ``B / W`` (:meth:`DataParallel.shard`);
* it samples its responses token by token; the noise of every draw is generated for the
  whole global batch and each rank uses its own rows (:meth:`DataParallel.sample_rows`),
  and the loop runs until every rank's responses are finished. So the rollout of a rank
  is exactly its block of the rollout one process would sample for the whole batch, and
  the random generators stay in step on every rank;
* rewards, KL estimates and every logged statistic are combined over ranks
  (:meth:`DataParallel.reduce_stats`: means weighted by responses or tokens, standard
  errors from the pooled variance, maxima, distinct responses over the gathered texts), so
  a KL controller sees the global KL of the whole batch;
* advantages are whitened with the global mean and variance; every loss is the global
  token mean (a rank's sum divided by the global token count, times ``W``), and
  ``DistributedDataParallel`` averages the gradients, so a step equals the single-process
  step on the whole batch (up to floating-point summation order);
* rank 0 logs, writes checkpoints and results.

``B``, the minibatch size and the number of evaluation samples must be multiples of
``W``; a launch that breaks this stops on every rank with a ``ValueError`` before any
collective call. A rank that dies makes ``torchrun`` stop the others; a rank that hangs
makes the others' next collective call fail after ``timeout_s`` (:func:`init`).
"""
from __future__ import annotations

import datetime
import math
import os
from dataclasses import dataclass
from typing import Sequence

import torch

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    """True when the environment of ``torchrun`` (or another launcher) names a world size."""
    return "WORLD_SIZE" in os.environ


def backend_for(device: str | torch.device) -> str:
    """``"nccl"`` for CUDA devices, ``"gloo"`` for the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


@dataclass
class DataParallel:
    """This process's place in a data-parallel run, and the collective operations PPO needs.

    ``rank`` and ``world_size`` (``W``) come from ``torchrun``; ``device`` is this rank's
    device (``cuda:LOCAL_RANK`` on GPUs). Tensors passed to the reductions may live on any
    device; the results come back as Python numbers or on the input's device.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    timeout_s: float = 1800.0

    # ---- who does what -----------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes results."""
        return self.rank == 0

    def check_divisible(self, name: str, value: int) -> None:
        """``ValueError`` unless ``value`` is a positive multiple of the world size."""
        if not isinstance(value, int) or value < 1 or value % self.world_size:
            raise ValueError(f"{name}: {value!r} is not a positive multiple of the world size "
                             f"{self.world_size} (every rank takes an equal share); launch with a "
                             f"--nproc_per_node x --nnodes that divides it or change {name}")

    def shard(self, items: Sequence):
        """This rank's contiguous block of ``items`` (a list or a tensor; length a multiple of W)."""
        n = len(items)
        if n % self.world_size:
            raise ValueError(f"items: {n} items cannot be split evenly over {self.world_size} ranks")
        b = n // self.world_size
        block = items[self.rank * b:(self.rank + 1) * b]
        return block if isinstance(block, torch.Tensor) else list(block)

    def local_permutation(self, n_local: int, generator: torch.Generator | None = None) -> list[int]:
        """This rank's rows (local indices) in the order of one permutation of the global batch.

        Draws ``randperm(n_local * W)`` like a single process shuffling the whole batch
        would (so the generator advances the same way on every rank and world size) and
        keeps this rank's rows in that order.
        """
        perm = torch.randperm(n_local * self.world_size, generator=generator).tolist()
        lo = self.rank * n_local
        return [i - lo for i in perm if lo <= i < lo + n_local]

    # ---- sampling ----------------------------------------------------------------------------
    def sample_rows(self, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One token per row of this rank's ``probs`` ``[b, V]``, as the global batch would get it.

        ``torch.multinomial(p, 1)`` draws ``q ~ Exp(1)`` of ``p``'s shape and returns
        ``argmax(p / q)`` (the exponential form of the Gumbel-max trick). Here ``q`` is
        drawn for all ``b * W`` rows on the CPU and this rank uses its block, so the tokens
        and the generator's state are exactly those of one process sampling the whole batch.
        """
        b, V = probs.shape
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
            raise FloatingPointError("probs: the sampling probabilities are not finite and non-negative")
        q = torch.empty(b * self.world_size, V, dtype=probs.dtype).exponential_(1, generator=generator)
        q = q[self.rank * b:(self.rank + 1) * b]
        return torch.argmax(probs.detach().cpu() / q, dim=-1)

    def all_true(self, flags: torch.Tensor) -> bool:
        """True when every element of ``flags`` is true on every rank (one small all-reduce)."""
        t = torch.tensor([0.0 if bool(flags.all()) else 1.0], device=self.device)
        torch.distributed.all_reduce(t)
        return float(t.item()) == 0.0

    # ---- reductions --------------------------------------------------------------------------
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of ``t`` (a new tensor on ``t``'s device; no gradient)."""
        out = t.detach().to(self.device, torch.float64 if t.dtype.is_floating_point else t.dtype).clone()
        torch.distributed.all_reduce(out)
        return out.to(t.device, t.dtype)

    def global_masked_mean(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """Mean of ``x`` over the entries where ``m`` is 1, on all ranks together (no gradient)."""
        m = m.float()
        s = self.all_reduce_sum(torch.stack([(x.detach() * m).sum(), m.sum()]).double())
        return (s[0] / s[1].clamp(min=1.0)).to(x.dtype)

    def loss_mean(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """This rank's share of the global masked mean of ``x``, times ``W`` (differentiable).

        ``sum(x * m) / (global count of m) * W``: the average of this over the ranks, which
        is what ``DistributedDataParallel`` does with the gradients, is the gradient of the
        masked mean over the whole batch.
        """
        m = m.float()
        count = self.all_reduce_sum(m.sum().double()).clamp(min=1.0)
        return (x * m).sum() / count.to(x.dtype) * self.world_size

    def mean(self, value: float) -> float:
        """The mean over ranks of a number."""
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return float(t.item()) / self.world_size

    def mean_dict(self, values: dict) -> dict:
        """The mean over ranks of every number in ``values`` (one all-reduce)."""
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return {k: float(v) / self.world_size for k, v in zip(keys, t.tolist())}

    def reduce_stats(self, stats: dict, responses: Sequence[str]) -> dict:
        """Combine the per-rank statistics of :func:`klbook_lib.rlhf.ppo.measure` into global ones.

        Each rank's ``stats`` describe its ``n_r = len(responses)`` responses. Keys are
        combined by name: ``*_token`` means weighted by the rank's response tokens
        (``response_length * n_r``), ``*_se`` standard errors recomputed from the pooled
        sample variance of their base key, ``*_max`` maxima, ``distinct_fraction`` over the
        gathered response texts, everything else means weighted by ``n_r``. The result is
        what one process would compute on the whole batch, up to rounding.
        """
        n = len(responses)
        keys = sorted(k for k in stats if k != "distinct_fraction")
        tokens = float(stats["response_length"]) * n if "response_length" in stats else float(n)
        row = torch.tensor([float(n), tokens]
                           + [float(stats[k]) for k in keys], dtype=torch.float64, device=self.device)
        table = [torch.empty_like(row) for _ in range(self.world_size)]
        torch.distributed.all_gather(table, row)
        T = torch.stack(table).cpu()            # [W, 2 + K]
        n_r, tok_r = T[:, 0], T[:, 1]
        col = {k: T[:, 2 + i] for i, k in enumerate(keys)}
        N = float(n_r.sum())
        out = {}
        for k in keys:
            v = col[k]
            if k.endswith("_max"):
                out[k] = float(v.max())
            elif k.endswith("_token"):
                out[k] = float((v * tok_r).sum() / tok_r.sum().clamp(min=1.0))
            elif not k.endswith("_se"):
                out[k] = float((v * n_r).sum() / N)
        for k in keys:
            if k.endswith("_se"):
                base = k[:-3]
                if base not in col:
                    out[k] = float(col[k].max())
                    continue
                m_r, se_r = col[base], col[k]
                ss = (se_r ** 2 * n_r * (n_r - 1)).sum() + (n_r * (m_r - out[base]) ** 2).sum()
                out[k] = float(math.sqrt(float(ss) / (N - 1) / N)) if N > 1 else 0.0
        if "distinct_fraction" in stats:
            gathered: list = [None] * self.world_size
            torch.distributed.all_gather_object(gathered, list(responses))
            texts = [t for part in gathered for t in part]
            out["distinct_fraction"] = len(set(texts)) / len(texts)
        return {k: out[k] for k in stats}       # the caller's key order

    # ---- models and processes ----------------------------------------------------------------
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``DistributedDataParallel(model)``: gradients averaged over ranks during ``backward``.

        Buffers are not broadcast at every forward (GPT-2's are constants), so forward
        passes without gradients (sampling, old log-probabilities) need no communication.
        """
        from torch.nn.parallel import DistributedDataParallel as DDP

        import inspect

        ids = [self.device.index] if self.device.type == "cuda" else None
        # newer torch names the switch forward_sync_buffers (buffers are still synced once, at init)
        no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
                   else {"broadcast_buffers": False})
        return DDP(model, device_ids=ids, output_device=ids[0] if ids else None, **no_sync)

    def barrier(self) -> None:
        if self.device.type == "cuda":
            torch.distributed.barrier(device_ids=[self.device.index])
        else:
            torch.distributed.barrier()

    def close(self) -> None:
        """Leave the process group (call once at the end, on every rank)."""
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def init(device: str = "cpu", backend: str | None = None, timeout_s: float = 1800.0) -> DataParallel | None:
    """Join the process group that ``torchrun`` set up; ``None`` when not launched by it.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``.
    ``device`` "cuda" becomes ``cuda:LOCAL_RANK`` (one GPU per process); ``backend``
    defaults to :func:`backend_for` the device (nccl on GPUs, gloo on the CPU). A
    collective call that waits longer than ``timeout_s`` (a rank hung or died) raises
    instead of hanging.
    """
    if not launched_by_torchrun():
        return None
    missing = [v for v in ENV_VARS if v not in os.environ]
    if missing:
        raise ValueError(f"environment: WORLD_SIZE is set but {', '.join(missing)} missing; launch with torchrun")
    rank, world, local = (int(os.environ[v]) for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if not 0 <= rank < world:
        raise ValueError(f"environment: RANK={rank} is outside [0, WORLD_SIZE={world})")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: must be positive, got {timeout_s!r}")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} was requested but CUDA is not available on this machine")
        if local >= torch.cuda.device_count():
            raise ValueError(f"device: LOCAL_RANK={local} but only {torch.cuda.device_count()} GPU(s) are visible; "
                             f"--nproc_per_node must not exceed the number of GPUs")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    elif dev.type != "cpu":
        raise ValueError(f"device: must be 'cpu' or 'cuda', got {device!r}")
    backend = backend or backend_for(dev)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend=backend, rank=rank, world_size=world,
                                             timeout=datetime.timedelta(seconds=timeout_s),
                                             device_id=dev if dev.type == "cuda" else None)
    return DataParallel(rank=rank, world_size=world, local_rank=local, device=dev, backend=backend,
                        timeout_s=timeout_s)
