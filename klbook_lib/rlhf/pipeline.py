"""The cached tiny-GPT-2 RLHF pipeline: corpus, tokenizer, SFT reference policy, reward model.

``build_pipeline(preset, seed)`` returns an :class:`RLHFPipeline`. The expensive parts
(tokenizer, SFT model ``pi_ref``, reward model) are cached on disk, keyed by
``(preset, seed, code version)``, in ``$KLBOOK_CACHE`` or ``~/.cache/klbook``. A cache
entry is written to a temporary directory and moved into place with ``os.replace``, so
two notebooks building at the same time never see a half-written entry (the loser of
the race discards its copy). The corpus and the preference pairs are regenerated from
the seed (cheap and deterministic), never stored.

``build_pipeline(init_from=DIR)`` starts from a local Hugging Face GPT-2 directory
instead (weights and tokenizer, read offline): its tokenizer replaces the trained one,
its weights replace the random initialisation, and SFT and the reward model are then
trained on the review corpus as usual. GPT-2 has one special token, ``<|endoftext|>``,
which serves as BOS, EOS and pad (padding is told apart by the attention mask). The
cache key then also holds a digest of the directory's files.

:func:`book_preset` maps the book's size setting (``KLBOOK_SIZE``, read through
:mod:`klbook_lib.runtime`) to the preset that chapters 6 to 9 share: one reference model
for all RLHF chapters.
"""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from . import data as _data
from .models import (PRESETS, ScalarHeadModel, disable_dropout, encode_texts, frozen_copy, load_policy,
                     make_policy, sequence_nll, train_sft)
from .reward_model import pairwise_accuracy, score_texts, train_reward_model
from .tokenizer import load_tokenizer, train_tokenizer

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

# The preset of the RLHF chapters at each book size (KLBOOK_SIZE): one for chapters 6-9.
BOOK_PRESETS: dict[str, str] = {"ci": "tiny", "small": "tiny", "large": "small"}


def book_preset(size: str | None = None) -> str:
    """The pipeline preset the RLHF chapters use at book size ``size``.

    ``size`` defaults to :func:`klbook_lib.runtime.book_size` (the ``KLBOOK_SIZE``
    setting: "small" on a CPU, "large" on a GPU when unset). "ci" and "small" give
    ``tiny``, "large" gives ``small``. Chapters 6 to 9 all call this, so they share one
    reference model and one reward model.
    """
    if size is None:
        from klbook_lib.runtime import book_size

        size = book_size()
    if size not in BOOK_PRESETS:
        raise ValueError(f"size: must be one of {tuple(BOOK_PRESETS)}, got {size!r}")
    return BOOK_PRESETS[size]


def _model_files(d: Path) -> list[Path]:
    """The files of a Hugging Face model directory that ``from_pretrained`` may read."""
    def wanted(name: str) -> bool:
        return (name.endswith((".json", ".safetensors")) or name in ("merges.txt", "vocab.txt")
                or (name.startswith("pytorch_model") and name.endswith(".bin")))
    return sorted(p for p in d.iterdir() if p.is_file() and wanted(p.name))


def init_digest(directory: str | os.PathLike) -> str:
    """A short hash of a model directory's config, weight and tokenizer files (names and contents)."""
    d = Path(directory)
    if not d.is_dir():
        raise ValueError(f"init_from: directory {str(directory)!r} does not exist")
    h = hashlib.sha256()
    for f in _model_files(d):
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:12]


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


def atomic_build(final: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp)`` in a fresh folder beside ``final``, then rename it to ``final``.

    Nothing happens if ``final`` holds a ``meta.json`` already; if another process renamed its
    own folder there first, that one is kept and ours dropped. A build that fails leaves nothing.
    """
    if (final / "meta.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "meta.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------- caches beside the pipeline
def source_key(path: str | os.PathLike) -> bytes:
    """A Python file's code without its docstrings and comments (editing those keeps the caches)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def cache_dir_for(kind: str, pipe, settings: dict, code_files: Sequence[str | os.PathLike] = ()) -> Path:
    """A cache folder next to the pipeline's, named by ``kind`` and a hash of ``settings``.

    The key covers the pipeline's own entry (preset, seed, code version), ``settings`` and
    the code of ``code_files`` (Python files without their docstrings and comments, so that
    editing those keeps the caches): the caller names every module its result depends on.
    """
    if pipe.cache_path is None:
        raise ValueError("pipe: has no cache_path (build it with build_pipeline)")
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    h.update(Path(pipe.cache_path).name.encode())
    for f in code_files:
        h.update(source_key(f) if str(f).endswith(".py") else Path(f).read_bytes())
    root = cache_root(Path(pipe.cache_path).parent)
    return root / f"{kind}-{Path(pipe.cache_path).name}-{h.hexdigest()[:12]}"


def cached_json(kind: str, pipe, settings: dict, compute: Callable[[], dict],
                code_files: Sequence[str | os.PathLike] = ()) -> dict:
    """``compute()`` (a JSON-serialisable dict), cached next to the pipeline by ``settings``."""
    final = cache_dir_for(kind, pipe, settings, code_files)

    def build(tmp: Path) -> None:
        result = compute()
        (tmp / "result.json").write_text(json.dumps(result))
        (tmp / "meta.json").write_text(json.dumps({"kind": kind, "settings": settings}, default=str))

    atomic_build(final, build)
    return json.loads((final / "result.json").read_text())


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
    init_from: str | None = None     # the GPT-2 directory SFT started from (None: random init)

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

    def summary(self) -> str:
        m = self.metrics
        start = f" init_from={self.init_from}" if self.init_from else ""
        return (f"RLHF pipeline preset={self.preset}{start} seed={self.seed}: vocab {len(self.tokenizer)}, "
                f"{m.get('n_params', 0) / 1e6:.2f}M params, SFT NLL/token {m.get('sft_heldout_nll_per_token', float('nan')):.3f}, "
                f"RM held-out accuracy {m.get('rm_heldout_accuracy', float('nan')):.3f}")


def _texts(corpus) -> list[str]:
    return [r.text for r in corpus]


def _load_init(init_from: str | os.PathLike):
    """Tokenizer and policy (dropout off) from a local GPT-2 directory, checked to fit together."""
    tok = load_tokenizer(init_from)          # GPT-2: <|endoftext|> is BOS, EOS and pad
    policy = load_policy(init_from)          # offline, dropout off
    if len(tok) > policy.config.vocab_size:
        raise ValueError(f"init_from: the tokenizer has {len(tok)} tokens but the model's vocabulary only "
                         f"{policy.config.vocab_size}")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(tok, name) is None:
            raise ValueError(f"init_from: the tokenizer has no {name.replace('_id', '')}")
    # the model predicts the tokenizer's EOS and pads with the tokenizer's pad id
    policy.config.bos_token_id, policy.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    policy.config.pad_token_id = tok.pad_token_id
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(policy.generation_config, name, getattr(policy.config, name))
    return tok, policy


def _build_into(directory: Path, preset: str, seed: int, device: str, progress: bool,
                init_from: str | os.PathLike | None = None, digest: str | None = None) -> None:
    """Train tokenizer, SFT and reward model; write them and meta.json into ``directory``."""
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (fail early if missing)

    s = SETTINGS[preset]
    t0 = time.time()
    corpus = _data.make_corpus(s["n_corpus"], seed=seed)
    if init_from is None:
        tok = train_tokenizer(_texts(corpus))
        policy = make_policy(tok, preset, seed=seed)
    else:
        tok, policy = _load_init(init_from)
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
    if init_from is not None:
        meta["init_from"] = {"path": str(Path(init_from).resolve()), "digest": digest}
    (directory / "meta.json").write_text(json.dumps(meta))


def build_pipeline(preset: str | None = None, seed: int = 0, device: str | None = None,
                   cache_dir: str | os.PathLike | None = None, progress: bool = True,
                   rebuild: bool = False, init_from: str | os.PathLike | None = None) -> RLHFPipeline:
    """Build (or load from the cache) the RLHF pipeline for ``preset`` and ``seed``.

    ``device`` defaults to CUDA when available. The first call for a key trains the
    tokenizer, the SFT model and the reward model (about a minute for ``tiny`` on one
    CPU thread); later calls load them in a second. ``rebuild=True`` retrains and
    replaces the cache entry.

    ``init_from`` is a local Hugging Face GPT-2 directory (``config.json``, the weights,
    the tokenizer files), read with ``local_files_only=True``: SFT starts from its weights
    with its tokenizer (dropout off), and ``preset`` (default ``"gpt2"`` then, else
    ``"tiny"``) only chooses the training sizes of :data:`SETTINGS`; the architecture is
    the checkpoint's.
    """
    if preset is None:
        preset = "tiny" if init_from is None else "gpt2"
    if preset not in PRESETS:
        raise ValueError(f"preset: must be one of {tuple(PRESETS)}, got {preset!r}")
    if init_from is not None and not Path(init_from).is_dir():
        raise ValueError(f"init_from: {str(init_from)!r} is not a directory (give the folder that holds "
                         f"config.json, the weights and the tokenizer files)")
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
    digest = None if init_from is None else init_digest(init_from)
    init_tag = "" if digest is None else f"-init{digest}"
    final = root / f"rlhf-{preset}{init_tag}-seed{seed}-{code_version()}"
    if rebuild and final.exists():
        shutil.rmtree(final, ignore_errors=True)
    atomic_build(final, lambda tmp: _build_into(tmp, preset, seed, device, progress, init_from, digest))
    meta = json.loads((final / "meta.json").read_text())
    tok = PreTrainedTokenizerFast.from_pretrained(str(final / "tokenizer"))
    if tok.pad_token is None:                # GPT-2's tokenizer: pad with <|endoftext|>
        tok.pad_token = tok.eos_token
    sft = GPT2LMHeadModel.from_pretrained(str(final / "sft"), local_files_only=True).to(device)
    sft = frozen_copy(disable_dropout(sft))
    rm = ScalarHeadModel.load(final / "reward_model", device=device)
    for p in rm.parameters():
        p.requires_grad_(False)
    s = SETTINGS[preset]
    corpus = _data.make_corpus(s["n_corpus"], seed=seed)
    train_pairs, held_pairs = _data.split_pairs(_data.make_preference_pairs(s["n_pairs"], seed=seed), seed=seed)
    return RLHFPipeline(preset=preset, seed=seed, device=str(device), tokenizer=tok, corpus=corpus,
                        prompts=_data.all_prompts(), train_pairs=train_pairs, heldout_pairs=held_pairs,
                        sft_model=sft, reward_model=rm, history=meta["history"], metrics=meta["metrics"],
                        cache_path=str(final),
                        init_from=None if init_from is None else str(Path(init_from).resolve()))
