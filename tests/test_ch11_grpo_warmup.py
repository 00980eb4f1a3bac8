"""The learning-rate warm-up of klbook_lib.rlhf.grpo (chapter 11's control for Adam's first step).

References: the linear schedule written out by hand, and Adam's first update in closed form.
With both moments at zero, torch's Adam (bias-corrected) makes its first update
``-lr * g / (|g| + eps)``: about ``lr`` on every parameter whose gradient is far above
``eps = 1e-8``, whatever that gradient's size. A warm-up of ``W`` iterations scales that
first step, on the same batch, by exactly ``1 / W``.
"""
from __future__ import annotations

import pytest
import torch

from klbook_lib.rlhf import data, grpo
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


def test_lr_at_is_the_linear_warm_up():
    cfg = grpo.GRPOConfig(lr=1e-3, warmup_steps=4).check()
    want = [1e-3 * k / 4 for k in (1, 2, 3, 4)] + [1e-3] * 3
    assert [cfg.lr_at(i) for i in range(7)] == pytest.approx(want, rel=1e-12)
    assert grpo.GRPOConfig(lr=2e-4).lr_at(0) == 2e-4 == grpo.GRPOConfig(lr=2e-4).lr_at(50)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_warmup_steps_bad_values(bad):
    with pytest.raises(ValueError, match="warmup_steps"):
        grpo.GRPOConfig(warmup_steps=bad).check()


def _first_update(tok, warmup: int, iterations: int = 1):
    policy = micro_policy(tok, seed=3)
    ref = micro_policy(tok, seed=3)
    start = [p.detach().clone() for p in policy.parameters()]
    cfg = grpo.GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=5, lr=1e-3,
                          warmup_steps=warmup)
    hist = grpo.train_grpo(policy, ref, tok, data.all_prompts(), iterations=iterations, beta=0.0,
                           config=cfg, seed=0, progress=False,
                           reward_fn=lambda p, r, f: torch.tensor([float(len(x.split()) > 2) for x in r]))
    delta = torch.cat([(p.detach() - s).reshape(-1) for p, s in zip(policy.parameters(), start)])
    return delta, hist


def test_first_adam_step_is_lr_per_parameter_and_warm_up_divides_it(tok):
    plain, h0 = _first_update(tok, warmup=0)
    warm, h4 = _first_update(tok, warmup=4)
    assert h0[0]["zero_std_fraction"] < 1          # the batch carried a signal: a real gradient
    assert h0[0]["lr"] == 1e-3 and h4[0]["lr"] == pytest.approx(2.5e-4)
    moved = plain.abs() > 0
    # the weights are float32: p + delta is rounded to the weight's precision (below 1e-6 here)
    tol = 1e-6
    # Adam's first step: at most lr on every parameter, and about lr on most of those that moved
    assert plain.abs().max() <= 1e-3 + tol
    assert (plain[moved].abs() > 0.99e-3).float().mean() > 0.9
    # the same batch and gradient (same seed, same start): the warmed-up step is 1/4 of it
    torch.testing.assert_close(warm, plain / 4, rtol=0, atol=tol)
    assert (warm.abs().max() - 2.5e-4) < tol


def test_history_records_the_schedule(tok):
    _, hist = _first_update(tok, warmup=3, iterations=4)
    assert [row["lr"] for row in hist] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])
