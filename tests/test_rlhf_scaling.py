"""Real GPT-2 checkpoints (dropout, init_from, GPT-2's special tokens) and one preset for the RLHF chapters.

No download: a small GPT-2-shaped checkpoint and a GPT-2-style tokenizer are written to a
temporary directory with GPT-2's config conventions (``rlhf_helpers.write_gpt2_dir``).
"""
import copy
import json
import math
import os
from pathlib import Path

import nbformat
import pytest
import torch
from transformers import GPT2LMHeadModel

from klbook_lib.rlhf import data, demo, models, ppo
from klbook_lib.rlhf import pipeline as pl
from klbook_lib.rlhf import rewards as R
from klbook_lib.rlhf.tokenizer import load_tokenizer
from rlhf_helpers import GPT2_EOS, write_gpt2_dir

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
FAST = dict(n_corpus=300, n_pairs=200, sft_steps=2, sft_batch=8, sft_lr=1e-3, rm_steps=2, rm_batch=8, rm_lr=1e-3)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2-like")
    write_gpt2_dir(d, seed=0, dropout=0.1)
    return d


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _logprobs(model, ro):
    with torch.no_grad():
        return R.token_logprobs(ppo.response_logits(model, ro), ro.response_ids)


def _rollout(policy, tok, n=32, seed=0, max_new_tokens=8):
    g = torch.Generator().manual_seed(seed)
    prompts = [data.all_prompts()[i] for i in torch.randint(80, (n,), generator=g).tolist()]
    policy.eval()
    return ppo.sample_responses(policy, tok, prompts, max_new_tokens=max_new_tokens, generator=g)


# ---- 1. dropout ------------------------------------------------------------------------------

def test_checkpoint_with_dropout_gives_a_ratio_of_exactly_one(gpt2_dir):
    assert json.loads((gpt2_dir / "config.json").read_text())["resid_pdrop"] == 0.1
    tok = load_tokenizer(gpt2_dir)
    policy = models.load_policy(gpt2_dir)
    assert not models.has_dropout(policy)
    assert (policy.config.resid_pdrop, policy.config.embd_pdrop, policy.config.attn_pdrop) == (0, 0, 0)
    ro = _rollout(policy, tok)
    m = ro.response_mask.bool()
    old = _logprobs(policy.eval(), ro)       # log pi_old, as PPO computes it before the update
    new = _logprobs(policy.train(), ro)      # log pi_theta at the same weights, in train mode
    assert torch.equal(old, new)             # ratio exactly 1 on every token
    # the control: the same checkpoint with its dropout kept (what load_policy used to return)
    raw = GPT2LMHeadModel.from_pretrained(gpt2_dir, local_files_only=True)
    assert models.has_dropout(raw)
    log_ratio = (_logprobs(raw.train(), ro) - _logprobs(raw.eval(), ro))[m]
    assert log_ratio.abs().mean() > 0.01, log_ratio.abs().mean()
    # load_policy(dropout=True) keeps it, for whoever wants it
    assert models.has_dropout(models.load_policy(gpt2_dir, dropout=True))


def test_ppo_switches_dropout_off_on_every_model(gpt2_dir):
    tok = load_tokenizer(gpt2_dir)
    raw = GPT2LMHeadModel.from_pretrained(gpt2_dir, local_files_only=True)   # dropout 0.1 everywhere
    rm = models.ScalarHeadModel.from_policy(raw)
    assert not models.has_dropout(rm) and rm.config.resid_pdrop == 0 and raw.config.resid_pdrop == 0.1
    for p in rm.parameters():
        p.requires_grad_(False)
    cfg = ppo.PPOConfig(batch_size=16, minibatch_size=16, ppo_epochs=1, max_new_tokens=6)

    def first_update(policy, train):
        value = copy.deepcopy(rm).requires_grad_(True)
        ref = models.frozen_copy(raw)
        if train:                            # through train_ppo, with weights that cannot move
            hist = ppo.train_ppo(policy, ref, rm, value, tok, data.all_prompts(), iterations=1, beta=0.1,
                                 config=ppo.PPOConfig(**{**vars(cfg), "lr": 1e-30, "value_lr": 1e-30}),
                                 progress=False)
            return hist[0]
        ro = _rollout(policy, tok, n=16)
        frozen = [torch.optim.SGD(m.parameters(), lr=0.0) for m in (policy, value)]
        return ppo.ppo_step(policy, ref, rm, value, ro, 0.1, cfg, *frozen)[1]

    bug = first_update(copy.deepcopy(raw), train=False)       # ppo_step on a model with dropout on
    # k3 estimate of KL(pi_old || pi_theta) at identical weights: 9e-4 here with dropout on
    assert bug["approx_kl_k3"] > 1e-4, bug
    policy = copy.deepcopy(raw)
    fixed = first_update(policy, train=True)
    assert fixed["clipfrac"] == 0.0 and fixed["approx_kl_k3"] < 1e-10, fixed
    assert not models.has_dropout(policy)


# ---- 2. init_from ----------------------------------------------------------------------------

def test_gpt2_tokenizer_conventions(gpt2_dir):
    tok = load_tokenizer(gpt2_dir)
    eos = tok.convert_tokens_to_ids(GPT2_EOS)
    assert eos == len(tok) - 1
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == eos   # one token, three roles
    assert tok.padding_side == "left"
    ids, mask = models.encode_texts(tok, ["the food was good .", "i found the staff very rude and slow ."])
    L = int(mask[0].sum())
    assert ids[0, 0] == eos and ids[0, L - 1] == eos and mask[0, L - 1] == 1   # BOS and EOS are real tokens
    assert torch.all(ids[0, L:] == eos) and torch.all(mask[0, L:] == 0)      # pads: the same id, mask 0
    nll, count = models.sequence_nll(models.load_policy(gpt2_dir), ids, mask)
    assert count.tolist() == [float(mask[0].sum() - 1), float(mask[1].sum() - 1)]   # the EOS target counts


def test_build_pipeline_from_a_gpt2_directory(gpt2_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(pl.SETTINGS, "gpt2", {**FAST, "sft_steps": 3, "sft_lr": 1e-12})
    ckpt = GPT2LMHeadModel.from_pretrained(gpt2_dir, local_files_only=True)
    pipe = pl.build_pipeline(init_from=gpt2_dir, device="cpu", cache_dir=tmp_path, progress=False)
    assert pipe.preset == "gpt2" and pipe.init_from == str(gpt2_dir.resolve())
    assert f"-init{pl.init_digest(gpt2_dir)}-" in pipe.cache_path
    # the architecture and the weights are the checkpoint's (SFT with lr 1e-12 does not move them),
    # not the gpt2 preset's 12 x 768 built from scratch
    c = pipe.sft_model.config
    assert (c.n_layer, c.n_embd, c.vocab_size) == (2, 32, ckpt.config.vocab_size)
    for (name, a), b in zip(pipe.sft_model.state_dict().items(), ckpt.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    tok = pipe.tokenizer
    assert len(tok) == ckpt.config.vocab_size
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == ckpt.config.eos_token_id
    assert c.pad_token_id == c.eos_token_id
    for model in (pipe.sft_model, pipe.reward_model):
        assert not models.has_dropout(model)
    saved = json.loads((Path(pipe.cache_path) / "sft" / "config.json").read_text())
    assert saved["resid_pdrop"] == saved["embd_pdrop"] == saved["attn_pdrop"] == 0
    # cached: the second call loads; another checkpoint gets its own entry
    entries = sorted(os.listdir(tmp_path))
    again = pl.build_pipeline(init_from=gpt2_dir, device="cpu", cache_dir=tmp_path, progress=False)
    assert sorted(os.listdir(tmp_path)) == entries and again.cache_path == pipe.cache_path
    other = tmp_path / "other"
    write_gpt2_dir(other, seed=1)
    assert pl.init_digest(other) != pl.init_digest(gpt2_dir)
    # PPO runs on it, with the GPT-2 tokenizer's shared BOS/EOS/pad
    cfg = ppo.PPOConfig(batch_size=8, minibatch_size=8, max_new_tokens=6)
    res = ppo.run_rlhf(pipe, beta=0.1, steps=1, config=cfg, progress=False)
    assert all(math.isfinite(v) for v in res.history[0].values())
    with pytest.raises(ValueError, match="init_from"):
        pl.build_pipeline(init_from=tmp_path / "missing", cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="never downloads"):
        pl.build_pipeline(init_from=tmp_path / "empty", cache_dir=tmp_path, device="cpu")


def test_sampling_with_eos_as_pad(gpt2_dir, tmp_path):
    # a policy fine-tuned to finish its sentences: EOS ends a row, later tokens (also EOS ids) are pads
    tok = load_tokenizer(gpt2_dir)
    policy = models.load_policy(gpt2_dir)
    models.train_sft(policy, tok, [r.text for r in data.make_corpus(500, seed=3)], steps=60, batch_size=32,
                     lr=3e-3, progress=False)
    ro = _rollout(policy, tok, n=64, seed=1, max_new_tokens=16)
    eos = tok.eos_token_id
    assert ro.has_eos.float().mean() > 0.5          # most rows finished ...
    lengths = ro.response_mask.sum(1)
    assert (lengths[ro.has_eos] < ro.response_ids.shape[1]).any()   # ... some early: pads (EOS ids) follow
    assert torch.all(ro.response_ids[ro.response_mask == 0] == eos)
    for ids, m, has_eos, text in zip(ro.response_ids, ro.response_mask, ro.has_eos, ro.responses):
        real = ids[m == 1].tolist()
        assert has_eos == (eos in real)
        if has_eos:
            assert real.index(eos) == len(real) - 1      # nothing real after EOS
        assert torch.all(m[len(real):] == 0) and torch.all(m[:len(real)] == 1)
        assert GPT2_EOS not in text


def test_demo_from_a_gpt2_directory(gpt2_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(pl.SETTINGS, "gpt2", FAST)
    out = tmp_path / "demo.json"
    code = demo.main(["--init-from", str(gpt2_dir), "--device", "cpu", "--steps", "2", "--batch-size", "4",
                      "--eval-samples", "4", "--cache-dir", str(tmp_path / "cache"), "--out", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    assert res["args"]["init_from"] == str(gpt2_dir) and res["args"]["preset"] == "gpt2"
    assert len(res["history"]) == 2 and res["timing"]["world_size"] == 1
    assert res["args"]["lr"] is None and demo.DEFAULT_LR["gpt2"] < demo.DEFAULT_LR["tiny"]


# ---- 3. one preset for the RLHF chapters ------------------------------------------------------

def test_book_preset_follows_klbook_size(monkeypatch):
    assert [pl.book_preset(s) for s in ("ci", "small", "large")] == ["tiny", "tiny", "small"]
    for size, preset in (("ci", "tiny"), ("small", "tiny"), ("large", "small")):
        monkeypatch.setenv("KLBOOK_SIZE", size)
        assert pl.book_preset() == preset
    with pytest.raises(ValueError, match="size"):
        pl.book_preset("huge")


@pytest.mark.parametrize("chapter", ["06_rlhf_reverse_kl", "07_token_level_kl", "08_vi_elbo_dpo",
                                     "09_choosing_beta"])
def test_rlhf_chapters_take_the_preset_from_klbook_size(chapter):
    nb = nbformat.read(ROOT / "chapters" / f"{chapter}.ipynb", as_version=4)
    calls = [line for c in nb.cells if c.cell_type == "code" for line in c.source.splitlines()
             if "build_pipeline(" in line]
    assert calls, chapter
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert 'book_preset(RUN["size"])' in code
    for line in calls:       # no preset written into the call: it comes from book_preset
        assert '"tiny"' not in line and '"small"' not in line and "preset=" not in line.replace(" ", ""), line
