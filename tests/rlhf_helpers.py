"""Small GPT-2 pieces shared by the RLHF tests (faster than the 'tiny' preset, same code paths)."""
from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from klbook_lib.rlhf import data
from klbook_lib.rlhf.tokenizer import train_tokenizer


def small_tokenizer():
    """A byte-level BPE trained on 1000 generated reviews."""
    return train_tokenizer([r.text for r in data.make_corpus(1000, seed=0)])


def micro_policy(tok, seed: int = 0) -> GPT2LMHeadModel:
    """A 1-layer, 32-dim GPT-2 without dropout."""
    cfg = GPT2Config(vocab_size=len(tok), n_layer=1, n_embd=32, n_head=2, n_positions=64,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg).eval()
