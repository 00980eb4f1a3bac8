"""Byte-level BPE tokenizers: one trained on the review corpus, or GPT-2's own (offline only).

:func:`train_tokenizer` runs GPT-2's algorithm (byte-level BPE, Hugging Face
``tokenizers``) on the generated corpus and wraps the result as a
``transformers.PreTrainedTokenizerFast`` with explicit ``bos``, ``eos`` and ``pad``
tokens. :func:`load_tokenizer` loads a saved tokenizer from a directory, or GPT-2's
tokenizer files when (and only when) they are already on this machine: it never
touches the network.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1000, min_frequency: int = 2):
    """Train a byte-level BPE tokenizer on ``texts``; return a ``PreTrainedTokenizerFast``.

    The vocabulary holds the 256 byte symbols, the three special tokens and the learned
    merges; on a small templated corpus it saturates below ``vocab_size`` (every word
    becomes one token). Padding is on the left, as generation from a batch of prompts needs.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(texts)
    if not texts:
        raise ValueError("texts: need at least one training text, got none")
    if vocab_size < 300:
        raise ValueError(f"vocab_size: must be >= 300 (256 bytes + specials + merges), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, padding_side="left",
    )


def from_local_files(cls, name_or_path: str | os.PathLike, what: str):
    """``cls.from_pretrained(name_or_path, local_files_only=True)``: never the network.

    ``name_or_path`` is a directory or a hub name looked up in the local Hugging Face
    cache only. Anything missing raises a ``ValueError`` saying where it looked.
    """
    path = Path(name_or_path)
    if not path.is_dir() and (str(name_or_path).startswith((".", "/")) or path.suffix):
        raise ValueError(f"name_or_path: directory {str(name_or_path)!r} does not exist")
    try:
        return cls.from_pretrained(str(name_or_path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"name_or_path: no local {what} for {str(name_or_path)!r} (looked in the directory "
            f"or the Hugging Face cache with local_files_only=True; this book never downloads). "
            f"Original error: {err}"
        ) from None


def load_tokenizer(name_or_path: str | os.PathLike):
    """Load a tokenizer from a local directory, or GPT-2's tokenizer from the local cache.

    ``name_or_path`` is a directory written by ``save_pretrained`` or a hub name such as
    ``"gpt2"``. Hub names are looked up with ``local_files_only=True``: if the files were
    never downloaded, a ``ValueError`` says so (this book never downloads anything).
    GPT-2's tokenizer has no pad token; its EOS token is reused for padding.
    """
    from transformers import AutoTokenizer

    tok = from_local_files(AutoTokenizer, name_or_path, "tokenizer files")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.bos_token is None:
        tok.bos_token = tok.eos_token
    tok.padding_side = "left"
    return tok
