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


GPT2_EOS = "<|endoftext|>"


def gpt2_style_tokenizer(n_texts: int = 1000):
    """A byte-level BPE with GPT-2's conventions: one special token, ``<|endoftext|>``, the last id,
    serving as BOS, EOS and UNK; no pad token; saved as a ``GPT2Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, processors, trainers
    from transformers import GPT2TokenizerFast

    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([r.text for r in data.make_corpus(n_texts, seed=0)], trainer=trainer)
    tok.add_special_tokens([GPT2_EOS])
    return GPT2TokenizerFast(tokenizer_object=tok, bos_token=GPT2_EOS, eos_token=GPT2_EOS, unk_token=GPT2_EOS,
                             model_max_length=1024)


def write_gpt2_dir(path, seed: int = 0, dropout: float = 0.1) -> GPT2LMHeadModel:
    """Write a small GPT-2-shaped checkpoint and its tokenizer to ``path`` as Hugging Face does.

    GPT-2's config conventions: ``bos_token_id == eos_token_id`` (``<|endoftext|>``), no
    ``pad_token_id``, dropout 0.1 in ``resid_pdrop``, ``embd_pdrop`` and ``attn_pdrop``,
    ``gelu_new``. Two layers of width 32 instead of twelve of 768. Returns the model.
    """
    tok = gpt2_style_tokenizer()
    eos = tok.eos_token_id
    assert eos == len(tok) - 1 and tok.pad_token is None
    cfg = GPT2Config(vocab_size=len(tok), n_layer=2, n_embd=32, n_head=2, n_positions=128,
                     bos_token_id=eos, eos_token_id=eos, resid_pdrop=dropout, embd_pdrop=dropout,
                     attn_pdrop=dropout, summary_first_dropout=dropout)
    assert cfg.pad_token_id is None and cfg.activation_function == "gelu_new"
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model
