"""Tests for klbook_lib.dpo: the DPO loss, sequence log-probabilities and the GPT-2 trainer.

References: the loss formula written out with plain math and torch.sigmoid; sequence
log-probabilities recomputed one prefix at a time (no padding, no masks); the gradient
direction checked by taking a step on free log-probabilities and on a real model.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from klbook_lib import dpo

torch.set_num_threads(1)  # a shared 2-core machine: one thread is fastest


def direct_loss(pc, pr, rc, rr, beta):
    """-log sigmoid(beta * ((pc - rc) - (pr - rr))), one pair at a time, with math only."""
    out = []
    for a, b, c, d in zip(pc, pr, rc, rr):
        z = beta * ((a - c) - (b - d))
        out.append(-math.log(1.0 / (1.0 + math.exp(-z))))
    return sum(out) / len(out)


@pytest.mark.parametrize("beta", [0.01, 0.1, 1.0])
def test_dpo_loss_matches_the_formula(beta):
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (-20 + 5 * torch.randn(32, generator=g, dtype=torch.float64) for _ in range(4))
    loss, cr, rj = dpo.dpo_loss(pc, pr, rc, rr, beta)
    assert float(loss) == pytest.approx(direct_loss(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist(), beta),
                                        rel=1e-12)
    per_pair, _, _ = dpo.dpo_loss(pc, pr, rc, rr, beta, reduction="none")
    assert per_pair.shape == (32,)
    assert float(per_pair[3]) == pytest.approx(direct_loss(pc[3:4].tolist(), pr[3:4].tolist(), rc[3:4].tolist(),
                                                           rr[3:4].tolist(), beta), rel=1e-12)
    assert float(dpo.dpo_loss(pc, pr, rc, rr, beta, reduction="sum")[0]) == pytest.approx(32 * float(loss))
    torch.testing.assert_close(cr, beta * (pc - rc))
    torch.testing.assert_close(rj, beta * (pr - rr))
    assert not cr.requires_grad and not rj.requires_grad


def test_dpo_loss_at_the_reference_is_log_2():
    lp = torch.tensor([-3.0, -7.0, -1.5])
    loss, cr, rr = dpo.dpo_loss(lp, lp + 1, lp, lp + 1, 0.5)
    assert float(loss) == pytest.approx(math.log(2.0), rel=1e-6)
    assert torch.all(cr == 0) and torch.all(rr == 0)
    assert dpo.implicit_reward_accuracy(cr, rr) == 0.5


def test_dpo_loss_is_stable_for_large_margins():
    big = torch.tensor([1e4])
    zero = torch.tensor([0.0])
    loss, _, _ = dpo.dpo_loss(big, zero, zero, zero, 1.0)      # sigmoid(1e4) = 1: loss 0
    assert float(loss) == pytest.approx(0.0, abs=1e-12)
    loss, _, _ = dpo.dpo_loss(-big, zero, zero, zero, 1.0)     # -log sigmoid(-1e4) = 1e4
    assert float(loss) == pytest.approx(1e4, rel=1e-6)


def test_gradient_step_raises_chosen_and_lowers_rejected_log_ratio():
    g = torch.Generator().manual_seed(1)
    pc = torch.randn(16, generator=g, dtype=torch.float64).requires_grad_()
    pr = torch.randn(16, generator=g, dtype=torch.float64).requires_grad_()
    rc, rr = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
    loss, _, _ = dpo.dpo_loss(pc, pr, rc, rr, 0.3)
    loss.backward()
    # d loss / d pc = -beta * sigmoid(-z) / B < 0 and d loss / d pr = +beta * sigmoid(-z) / B > 0
    z = 0.3 * ((pc - rc) - (pr - rr)).detach()
    torch.testing.assert_close(pc.grad, -0.3 * torch.sigmoid(-z) / 16)
    torch.testing.assert_close(pr.grad, 0.3 * torch.sigmoid(-z) / 16)
    assert torch.all(pc.grad < 0) and torch.all(pr.grad > 0)


def tiny_lm(seed=0, vocab=23):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_layer=1, n_embd=16, n_head=2, n_positions=32,
                     bos_token_id=1, eos_token_id=2, pad_token_id=0,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg).eval()


def brute_force_logp(model, ids, start):
    """log p(ids[start:] | ids[:start]) one token at a time, each prefix run on its own."""
    total = 0.0
    for t in range(start, len(ids)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids[:t]])).logits[0, -1].double()
        total += float(torch.log_softmax(logits, -1)[ids[t]])
    return total


def test_sequence_logps_matches_prefix_by_prefix_computation():
    model = tiny_lm()
    rows = [([1, 5, 6], [7, 8, 2]), ([1, 9], [10, 11, 12, 13, 2]), ([1, 3, 4, 5, 6], [2])]
    T = max(len(p) + len(r) for p, r in rows)
    for side in ("right", "left"):
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        att = torch.zeros_like(ids)
        resp = torch.zeros_like(ids)
        for i, (p, r) in enumerate(rows):
            seq = p + r
            off = 0 if side == "right" else T - len(seq)
            ids[i, off:off + len(seq)] = torch.tensor(seq)
            att[i, off:off + len(seq)] = 1
            resp[i, off + len(p):off + len(seq)] = 1
        with torch.no_grad():
            got = dpo.sequence_logps(model, ids, att, resp)
        want = [brute_force_logp(model, p + r, len(p)) for p, r in rows]
        np.testing.assert_allclose(got.numpy(), want, atol=1e-4)


def test_sgd_on_a_real_model_moves_the_log_ratios_the_right_way():
    model = tiny_lm(seed=2)
    ref = tiny_lm(seed=2)
    ids = torch.tensor([[1, 5, 6, 7, 2], [1, 5, 9, 10, 2]])   # chosen, rejected (same prompt)
    att = torch.ones_like(ids)
    resp = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        ref_lp = dpo.sequence_logps(ref, ids, att, resp)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    lp = dpo.sequence_logps(model, ids, att, resp)
    loss, _, _ = dpo.dpo_loss(lp[:1], lp[1:], ref_lp[:1], ref_lp[1:], 1.0)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        new = dpo.sequence_logps(model, ids, att, resp)
    assert new[0] - ref_lp[0] > 0      # chosen log-ratio up
    assert new[1] - ref_lp[1] < 0      # rejected log-ratio down
    loss2, _, _ = dpo.dpo_loss(new[:1], new[1:], ref_lp[:1], ref_lp[1:], 1.0)
    assert float(loss2) < float(loss.detach())


def test_encode_pairs_marks_the_response_and_eos():
    from types import SimpleNamespace

    class Tok:
        bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

        def encode(self, text, add_special_tokens=False):
            return [10 + len(w) for w in text.split()]

    pairs = [SimpleNamespace(prompt="a bb", chosen=" ccc .", rejected=" d"),
             SimpleNamespace(prompt="eeeee", chosen=" f gg hhh", rejected=" ii")]
    b = dpo.encode_pairs(Tok(), pairs)
    assert b.n_pairs == 2 and b.input_ids.shape == (4, 6)
    assert b.input_ids[0].tolist() == [1, 11, 12, 13, 11, 2]
    assert b.response_mask[0].tolist() == [0, 0, 0, 1, 1, 1]
    assert b.input_ids[3].tolist() == [1, 15, 12, 2, 0, 0]
    assert b.response_mask[3].tolist() == [0, 0, 1, 1, 0, 0]
    assert b.attention_mask[3].tolist() == [1, 1, 1, 1, 0, 0]


def test_validation_errors():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="beta"):
        dpo.dpo_loss(x, x, x, x, 0.0)
    with pytest.raises(ValueError, match="reduction"):
        dpo.dpo_loss(x, x, x, x, 0.1, reduction="avg")
    with pytest.raises(ValueError, match="ref_rejected_logps"):
        dpo.dpo_loss(x, x, x, torch.zeros(4), 0.1)
    with pytest.raises(ValueError, match="policy_chosen_logps: must be 1-D"):
        dpo.dpo_loss(torch.zeros(3, 2), x, x, x, 0.1)
    with pytest.raises(ValueError, match="policy_rejected_logps: must be a torch.Tensor"):
        dpo.dpo_loss(x, [0.0, 0.0, 0.0], x, x, 0.1)
    model = tiny_lm()
    ids = torch.tensor([[1, 5, 2]])
    with pytest.raises(ValueError, match="response_mask: the first token"):
        dpo.sequence_logps(model, ids, torch.ones_like(ids), torch.ones_like(ids))
    with pytest.raises(ValueError, match="response_mask: marks padding"):
        dpo.sequence_logps(model, ids, torch.tensor([[1, 1, 0]]), torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="lr"):
        dpo.DPOConfig(lr=0.0).check()


@pytest.mark.slow
def test_train_dpo_on_tiny_pipeline_improves_heldout_preference_accuracy():
    from klbook_lib.rlhf.models import encode_texts, sequence_nll
    from klbook_lib.rlhf.pipeline import build_pipeline

    pipe = build_pipeline("tiny", seed=0, progress=False)   # cached on disk after the first build
    cfg = dpo.DPOConfig(lr=3e-4, batch_size=64, eval_every=40)
    res = dpo.train_dpo(pipe, beta=0.5, steps=40, seed=0, config=cfg, progress=False, evaluate=False)
    first, last = res.evals[0], res.evals[-1]
    assert first["step"] == 0 and last["step"] == 40
    assert first["heldout_accuracy"] == 0.5                 # pi_theta = pi_ref: every pair is a tie
    assert last["heldout_accuracy"] > 0.65
    assert np.mean([h["loss"] for h in res.history[-10:]]) < np.log(2)
    # independent check of the held-out accuracy: log-likelihoods of whole texts with the
    # pipeline's own sequence_nll (the prompt's terms cancel in chosen minus rejected)
    held = pipe.heldout_pairs

    def logp(model, texts):
        with torch.no_grad():
            ids, mask = encode_texts(pipe.tokenizer, texts)
            return -sequence_nll(model, ids, mask)[0]

    chosen = [p.prompt + p.chosen for p in held]
    rejected = [p.prompt + p.rejected for p in held]
    margin = ((logp(res.policy, chosen) - logp(pipe.ref_model, chosen))
              - (logp(res.policy, rejected) - logp(pipe.ref_model, rejected)))
    acc = float((margin > 0).float().mean())
    assert acc == pytest.approx(last["heldout_accuracy"], abs=2.0 / len(held))
