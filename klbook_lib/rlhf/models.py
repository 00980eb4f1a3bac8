"""GPT-2 policies and scalar-head models, built small or loaded offline, and SFT.

``make_policy(tokenizer, preset)`` builds a ``transformers.GPT2LMHeadModel`` from a
``GPT2Config`` preset:

========  ======  =====  =====  =========  ===========================
preset    layers  dims   heads  positions  meant for
========  ======  =====  =====  =========  ===========================
tiny      2       128    4      64         a CPU, seconds
small     6       384    6      128        a GPU (or a patient CPU)
gpt2      12      768    12     1024       a GPU; GPT-2 small's shape
========  ======  =====  =====  =========  ===========================

``load_policy`` loads real weights from a local directory or the local Hugging Face
cache only (``local_files_only=True``), with dropout switched off.
:class:`ScalarHeadModel` is a GPT-2 backbone with a scalar head, used for the reward
model (one number per sequence) and the PPO value function (one number per token).
:func:`train_sft` fine-tunes a policy on texts by maximum likelihood; the result is the
reference policy ``pi_ref``.

Dropout is off on every model this library trains or scores (:func:`disable_dropout`):
GPT-2's checkpoints ship with dropout 0.1, and a policy whose log-probabilities are
computed once in eval mode (``log pi_old``) and again in train mode (``log pi_theta``)
would have a PPO ratio different from 1 at identical weights. TRL switches dropout off
for the same reason.
"""
from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Sequence

import torch
from torch import nn
from tqdm import tqdm

PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=2, n_embd=128, n_head=4, n_positions=64),
    "small": dict(n_layer=6, n_embd=384, n_head=6, n_positions=128),
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
}


def _check_preset(preset: str) -> dict[str, int]:
    if preset not in PRESETS:
        raise ValueError(f"preset: must be one of {tuple(PRESETS)}, got {preset!r}")
    return PRESETS[preset]


def make_config(tokenizer, preset: str = "tiny"):
    """A ``GPT2Config`` of the given size with the tokenizer's vocabulary and special ids."""
    from transformers import GPT2Config

    sizes = _check_preset(preset)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(tokenizer, name) is None:
            raise ValueError(f"tokenizer: {name} is not set; set bos, eos and pad tokens explicitly")
    return GPT2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,   # no dropout: deterministic log-probs
        **sizes,
    )


def make_policy(tokenizer, preset: str = "tiny", seed: int = 0):
    """A freshly initialised ``GPT2LMHeadModel`` of size ``preset`` (seeded)."""
    from transformers import GPT2LMHeadModel

    config = make_config(tokenizer, preset)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return model.eval()


_DROPOUT_FIELDS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")   # what GPT2Model reads


def disable_dropout(model):
    """Switch off every dropout of ``model`` in place (modules and GPT-2 config); return it.

    Sets ``p = 0`` on every dropout module (GPT-2's attention passes ``attn_dropout.p`` to
    its attention kernel, so this covers it too) and zeroes the config's ``resid_pdrop``,
    ``embd_pdrop`` and ``attn_pdrop``, so that a checkpoint saved later has no dropout
    either. Then train mode and eval mode compute the same function, and ``log pi_theta``
    equals ``log pi_old`` at identical weights. Objects that are not ``nn.Module`` (e.g. a
    stand-in reward function) are returned unchanged.
    """
    if not isinstance(model, nn.Module):
        return model
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        if getattr(module, "config", None) is not None:
            disable_dropout_config(module.config)
    return model


def disable_dropout_config(config):
    """Zero a GPT-2 config's dropout probabilities in place; return it."""
    for name in _DROPOUT_FIELDS:
        if getattr(config, name, None):
            setattr(config, name, 0.0)
    return config


def has_dropout(model) -> bool:
    """True when some dropout module of ``model`` has a non-zero probability."""
    return isinstance(model, nn.Module) and any(
        isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def load_policy(name_or_path: str | os.PathLike, device: str | torch.device = "cpu",
                dropout: bool = False):
    """Load a ``GPT2LMHeadModel`` from a local directory or the local Hugging Face cache.

    Never reaches the network (``local_files_only=True``); missing files raise a
    ``ValueError`` that says where it looked. A model without a pad id gets its EOS id
    (GPT-2 has no pad token). Dropout is switched off (:func:`disable_dropout`) unless
    ``dropout=True``.
    """
    from transformers import GPT2LMHeadModel

    from .tokenizer import from_local_files

    model = from_local_files(GPT2LMHeadModel, name_or_path, "GPT-2 weights")
    if getattr(model.config, "model_type", "gpt2") != "gpt2":
        raise ValueError(f"name_or_path: {str(name_or_path)!r} holds a {model.config.model_type!r} model, "
                         f"not GPT-2")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    if not dropout:
        disable_dropout(model)
    return model.to(device).eval()


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count only real tokens, so left-padded rows start at position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def lm_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``[B, T, V]`` of a causal LM, padding-aware on either side, no KV cache."""
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    return out.logits


class ScalarHeadModel(nn.Module):
    """A GPT-2 backbone with a linear scalar head: one number per token.

    ``forward`` returns ``[B, T]`` values; :meth:`score` takes the value at each row's
    last real token (the reward model's sequence score).
    """

    def __init__(self, config):
        super().__init__()
        from transformers import GPT2Model

        self.config = disable_dropout_config(copy.deepcopy(config))   # never shares the policy's config
        self.backbone = GPT2Model(self.config)
        self.head = nn.Linear(config.n_embd, 1)
        nn.init.normal_(self.head.weight, std=1.0 / math.sqrt(config.n_embd + 1))
        nn.init.zeros_(self.head.bias)
        disable_dropout(self)

    @classmethod
    def from_policy(cls, policy) -> "ScalarHeadModel":
        """Initialise the backbone from a policy's transformer (e.g. the SFT model)."""
        model = cls(policy.config)
        model.backbone.load_state_dict(policy.transformer.state_dict())
        return model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids_from_mask(attention_mask),
                          use_cache=False).last_hidden_state
        return self.head(h).squeeze(-1)

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Value at the last position whose mask is 1, one per row ``[B]``."""
        values = self(input_ids, attention_mask)
        T = attention_mask.shape[1]
        idx = T - 1 - attention_mask.long().flip(-1).argmax(-1)
        return values.gather(1, idx[:, None]).squeeze(1)

    def save(self, directory: str | os.PathLike) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(self.config.to_dict()))
        torch.save(self.state_dict(), d / "scalar_head_model.pt")

    @classmethod
    def load(cls, directory: str | os.PathLike, device: str | torch.device = "cpu") -> "ScalarHeadModel":
        from transformers import GPT2Config

        d = Path(directory)
        if not (d / "scalar_head_model.pt").exists():
            raise ValueError(f"directory: no scalar_head_model.pt in {str(d)!r}")
        config = GPT2Config.from_dict(json.loads((d / "config.json").read_text()))
        model = cls(config)
        model.load_state_dict(torch.load(d / "scalar_head_model.pt", map_location="cpu", weights_only=True))
        return model.to(device).eval()


def encode_texts(tokenizer, texts: Sequence[str], max_length: int | None = None,
                 device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``bos + text + eos`` for each text, right-padded: ``(input_ids, attention_mask)``."""
    if len(texts) == 0:
        raise ValueError("texts: need at least one text")
    rows = [[tokenizer.bos_token_id] + tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id]
            for t in texts]
    L = max(len(r) for r in rows)
    if max_length is not None and L > max_length:
        raise ValueError(f"texts: a text is {L} tokens long, more than max_length={max_length}")
    ids = torch.full((len(rows), L), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids.to(device), mask.to(device)


def sequence_nll(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood per sequence ``[B]`` (sum over real next tokens) and token counts."""
    logits = lm_logits(model, input_ids, attention_mask)[:, :-1]
    targets = input_ids[:, 1:]
    m = attention_mask[:, 1:].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return (nll * m).sum(-1), m.sum(-1)


def train_sft(model, tokenizer, texts: Sequence[str], steps: int = 300, batch_size: int = 64,
              lr: float = 3e-3, seed: int = 0, device: str | torch.device = "cpu",
              progress: bool = True) -> list[dict]:
    """Supervised fine-tuning (maximum likelihood) on ``texts``; returns a history.

    AdamW with a linear warm-up over the first 10% of steps and cosine decay. The
    history has one dict per step: ``{"step", "loss"}`` (mean NLL per token, nats).
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size: must be >= 1, got {steps} and {batch_size}")
    if not lr > 0:
        raise ValueError(f"lr: must be positive, got {lr}")
    if len(texts) == 0:
        raise ValueError("texts: need at least one training text")
    model.to(device).train()
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    history = []
    for step in tqdm(range(steps), desc="SFT", disable=not progress):
        idx = torch.randint(len(texts), (batch_size,), generator=g).tolist()
        ids, mask = encode_texts(tokenizer, [texts[i] for i in idx], device=device)
        nll, count = sequence_nll(model, ids, mask)
        loss = nll.sum() / count.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        history.append({"step": step, "loss": float(loss.detach())})
    model.eval()
    return history


def frozen_copy(model):
    """A deep copy with gradients switched off, in eval mode (e.g. ``pi_ref``)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
