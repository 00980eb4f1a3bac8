"""Adam for an ensemble: K small networks whose parameters are stacked along a first dimension.

:func:`klbook_lib.ppo.train_seeds` trains K seeds at once with each weight stored as one
tensor ``(K, ...)``. :class:`EnsembleAdam` is Adam (Kingma and Ba 2015) on such tensors,
member by member: member ``k``'s update is exactly the one ``torch.optim.Adam(fused=True)``
makes on that member's own parameters (a test checks it bit for bit), whatever the others
do. A member may sit out a step (``step(members=[...])``): its parameters, moments and step
count stay as they are, as if it had never been asked. :meth:`EnsembleAdam.keep` drops
members that have finished.

It calls PyTorch's fused Adam kernel ``torch._fused_adam_`` directly (the kernel behind
``torch.optim.Adam(fused=True)``): ``torch.optim.Adam`` keeps one step count per parameter
tensor, so it cannot let one member of a stacked tensor skip a step.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["EnsembleAdam"]


class EnsembleAdam:
    """Adam on parameters of shape ``(K, ...)``, one independent optimiser per member ``k``.

    ``lr`` may be changed between steps (one value for all members).
    """

    def __init__(self, params: Sequence[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params = list(params)
        if not self.params or any(not p.requires_grad for p in self.params):
            raise ValueError("params: need at least one tensor, each requiring a gradient")
        k = self.params[0].shape[0]
        if any(p.ndim < 1 or p.shape[0] != k for p in self.params):
            raise ValueError(f"params: every tensor needs the ensemble size {k} as its first dimension")
        self.lr, self.betas, self.eps = float(lr), betas, float(eps)
        self.exp_avgs = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in self.params]
        self.steps = [0] * k                       # optimizer steps taken by each member

    @property
    def members(self) -> int:
        return len(self.steps)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, members: Sequence[int] | None = None) -> None:
        """One Adam step for ``members`` (default: all); the others are left untouched."""
        ks = list(range(self.members)) if members is None else [int(k) for k in members]
        if not ks:
            return
        for k in ks:
            self.steps[k] += 1
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            raise ValueError("params: every parameter needs a gradient before step()")
        # One kernel call over every member's own slices: the kernel treats the first elements of
        # a tensor with vector instructions and the remainder one by one, and the two round
        # differently (fused multiply-adds), so a stacked (K, 2) bias would be updated unlike a
        # single (2,) bias. Slices of each member's size are updated exactly as alone.
        def slices(tensors):                      # member-major: member k's tensors, then k + 1's
            cols = [t.unbind(0) for t in tensors]
            return [col[k] for k in ks for col in cols]
        ts = [torch.tensor(float(self.steps[k]), device=self.params[0].device) for k in ks]
        torch._fused_adam_(slices(self.params), slices(grads), slices(self.exp_avgs), slices(self.exp_avg_sqs),
                           [], [t for t in ts for _ in self.params], lr=self.lr, beta1=self.betas[0],
                           beta2=self.betas[1], weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False)

    def keep(self, members: Sequence[int], params: Sequence[torch.Tensor]) -> None:
        """Keep only ``members`` (indices, in the new order); ``params`` are the caller's new
        stacked tensors for them (e.g. ``p[members]`` made leaves again)."""
        idx = torch.as_tensor(list(members), dtype=torch.long, device=self.params[0].device)
        self.params = list(params)
        self.exp_avgs = [m.index_select(0, idx) for m in self.exp_avgs]
        self.exp_avg_sqs = [v.index_select(0, idx) for v in self.exp_avg_sqs]
        self.steps = [self.steps[int(k)] for k in idx.tolist()]
