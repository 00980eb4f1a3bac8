"""The cached tiny-GPT-2 RLHF pipeline: corpus, tokenizer, SFT reference policy, reward model.

``build_pipeline(preset, seed)`` returns an :class:`RLHFPipeline`. The expensive parts
(tokenizer, SFT model ``pi_ref``, reward model) are cached on disk, keyed by
``(preset, seed, code version)``, in ``$KLBOOK_CACHE`` or ``~/.cache/klbook``. A cache
entry is written to a temporary directory and moved into place with ``os.replace``, so
two notebooks building at the same time never see a half-written entry (the loser of
the race discards its copy). The corpus and the preference pairs are regenerated from
the seed (cheap and deterministic), never stored.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from . import data as _data
from .models import PRESETS, ScalarHeadModel, encode_texts, frozen_copy, make_policy, sequence_nll, train_sft
from .reward_model import pairwise_accuracy, score_texts, train_reward_model
from .tokenizer import train_tokenizer

# Sizes of each stage per preset (the bigger presets are meant for a GPU).
SETTINGS: dict[str, dict] = {
    "tiny": dict(n_corpus=5000, n_pairs=4000, sft_steps=250, sft_batch=64, sft_lr=3e-3,
                 rm_steps=80, rm_batch=64, rm_lr=1e-3),
    "small": dict(n_corpus=20000, n_pairs=8000, sft_steps=1000, sft_batch=128, sft_lr=1e-3,
                  rm_steps=400, rm_batch=128, rm_lr=3e-4),
    "gpt2": dict(n_corpus=20000, n_pairs=8000, sft_steps=1000, sft_batch=128, sft_lr=3e-4,
                 rm_steps=400, rm_batch=128, rm_lr=1e-4),
}

_CODE_FILES = ("data.py", "tokenizer.py", "models.py", "reward_model.py", "pipeline.py")


def code_version() -> str:
    """A short hash of the source files that determine a cached pipeline."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _CODE_FILES:
        h.update((here / name).read_bytes())
    h.update(torch.__version__.split("+")[0].encode())
    return h.hexdigest()[:12]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$KLBOOK_CACHE``, else ``~/.cache/klbook``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("KLBOOK_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "klbook"


@dataclass
class RLHFPipeline:
    """Everything the RLHF chapters share. ``sft_model`` is ``pi_ref``: frozen, never trained further."""

    preset: str
    seed: int
    device: str
    tokenizer: object
    corpus: list
    prompts: list
    train_pairs: list
    heldout_pairs: list
    sft_model: object
    reward_model: ScalarHeadModel
    history: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    cache_path: str | None = None

    @property
    def ref_model(self):
        """The reference policy ``pi_ref`` (the SFT model)."""
        return self.sft_model

    def new_policy(self):
        """A trainable copy of ``pi_ref`` to start RL from."""
        policy = copy.deepcopy(self.sft_model)
        for p in policy.parameters():
            p.requires_grad_(True)
        return policy

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> torch.Tensor:
        """Reward-model scores ``[N]`` of ``prompt + response`` texts."""
        if len(prompts) != len(responses):
            raise ValueError(f"prompts and responses: lengths differ, {len(prompts)} vs {len(responses)}")
        return score_texts(self.reward_model, self.tokenizer, [p + r for p, r in zip(prompts, responses)])

    @staticmethod
    def true_rewards(responses: Sequence[str]) -> torch.Tensor:
        """The hidden true reward of each response (:func:`klbook_lib.rlhf.data.true_reward`)."""
        return torch.tensor([_data.true_reward(r) for r in responses], dtype=torch.float32)

    def summary(self) -> str:
        m = self.metrics
        return (f"RLHF pipeline preset={self.preset} seed={self.seed}: vocab {len(self.tokenizer)}, "
                f"{m.get('n_params', 0) / 1e6:.2f}M params, SFT NLL/token {m.get('sft_heldout_nll_per_token', float('nan')):.3f}, "
                f"RM held-out accuracy {m.get('rm_heldout_accuracy', float('nan')):.3f}")


def _texts(corpus) -> list[str]:
    return [r.text for r in corpus]


def _build_into(directory: Path, preset: str, seed: int, device: str, progress: bool) -> None:
    """Train tokenizer, SFT and reward model; write them and meta.json into ``directory``."""
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (fail early if missing)

    s = SETTINGS[preset]
    t0 = time.time()
    corpus = _data.make_corpus(s["n_corpus"], seed=seed)
    tok = train_tokenizer(_texts(corpus))
    policy = make_policy(tok, preset, seed=seed)
    sft_hist = train_sft(policy, tok, _texts(corpus), steps=s["sft_steps"], batch_size=s["sft_batch"],
                         lr=s["sft_lr"], seed=seed, device=device, progress=progress)
    t_sft = time.time() - t0
    train_pairs, held_pairs = _data.split_pairs(_data.make_preference_pairs(s["n_pairs"], seed=seed), seed=seed)
    rm, rm_hist = train_reward_model(policy, tok, train_pairs, held_pairs, steps=s["rm_steps"],
                                     batch_size=s["rm_batch"], lr=s["rm_lr"], seed=seed, device=device,
                                     progress=progress)
    t_rm = time.time() - t0 - t_sft
    # held-out likelihood of fresh reviews under pi_ref
    fresh = _texts(_data.make_corpus(500, seed=seed + 7919))
    with torch.no_grad():
        ids, mask = encode_texts(tok, fresh, device=device)
        nll, count = sequence_nll(policy, ids, mask)
    true_acc = sum(_data.true_reward(p.chosen) > _data.true_reward(p.rejected) for p in held_pairs) / len(held_pairs)
    metrics = {
        "n_params": sum(p.numel() for p in policy.parameters()),
        "vocab_size": len(tok),
        "sft_final_loss": sum(h["loss"] for h in sft_hist[-20:]) / min(20, len(sft_hist)),
        "sft_heldout_nll_per_token": float(nll.sum() / count.sum()),
        "rm_heldout_accuracy": pairwise_accuracy(rm, tok, held_pairs),
        "true_reward_heldout_accuracy": true_acc,
        "seconds_sft": t_sft,
        "seconds_reward_model": t_rm,
    }
    tok.save_pretrained(directory / "tokenizer")
    policy.to("cpu").save_pretrained(directory / "sft")
    rm.to("cpu").save(directory / "reward_model")
    meta = {"preset": preset, "seed": seed, "code_version": code_version(), "metrics": metrics,
            "history": {"sft": sft_hist, "reward_model": rm_hist}}
    (directory / "meta.json").write_text(json.dumps(meta))


def build_pipeline(preset: str = "tiny", seed: int = 0, device: str | None = None,
                   cache_dir: str | os.PathLike | None = None, progress: bool = True,
                   rebuild: bool = False) -> RLHFPipeline:
    """Build (or load from the cache) the RLHF pipeline for ``preset`` and ``seed``.

    ``device`` defaults to CUDA when available. The first call for a key trains the
    tokenizer, the SFT model and the reward model (about a minute for ``tiny`` on one
    CPU thread); later calls load them in a second. ``rebuild=True`` retrains and
    replaces the cache entry.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset: must be one of {tuple(PRESETS)}, got {preset!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} was requested but CUDA is not available on this machine")
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # "Loading weights" bars would clutter the book's pages
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"rlhf-{preset}-seed{seed}-{code_version()}"
    if rebuild and final.exists():
        shutil.rmtree(final, ignore_errors=True)
    if not (final / "meta.json").exists():
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
        try:
            _build_into(tmp, preset, seed, device, progress)
            try:
                os.replace(tmp, final)
            except OSError:
                if not (final / "meta.json").exists():
                    raise
                # another process finished first: keep its entry, drop ours
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((final / "meta.json").read_text())
    tok = PreTrainedTokenizerFast.from_pretrained(str(final / "tokenizer"))
    sft = GPT2LMHeadModel.from_pretrained(str(final / "sft"), local_files_only=True).to(device)
    sft = frozen_copy(sft)
    rm = ScalarHeadModel.load(final / "reward_model", device=device)
    for p in rm.parameters():
        p.requires_grad_(False)
    s = SETTINGS[preset]
    corpus = _data.make_corpus(s["n_corpus"], seed=seed)
    train_pairs, held_pairs = _data.split_pairs(_data.make_preference_pairs(s["n_pairs"], seed=seed), seed=seed)
    return RLHFPipeline(preset=preset, seed=seed, device=str(device), tokenizer=tok, corpus=corpus,
                        prompts=_data.all_prompts(), train_pairs=train_pairs, heldout_pairs=held_pairs,
                        sft_model=sft, reward_model=rm, history=meta["history"], metrics=meta["metrics"],
                        cache_path=str(final))
