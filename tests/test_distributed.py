"""Data-parallel PPO-RLHF (klbook_lib.rlhf.distributed): two CPU processes over gloo.

The reference is a single process running the same code without ``dist`` on the whole
batch. Processes are started with torch.multiprocessing (spawn) or with torchrun as a
subprocess, on a free port, and every start has a deadline: a hang fails the test.
"""
from __future__ import annotations

import copy
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from klbook_lib.rlhf import data, distributed, models, ppo
from klbook_lib.rlhf import pipeline as pl
from rlhf_helpers import micro_policy, small_tokenizer, write_gpt2_dir

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
B = 8                                    # the global batch
CFG = dict(batch_size=B, minibatch_size=B, ppo_epochs=1, max_new_tokens=6, max_grad_norm=1e9)
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


class Recorder(torch.optim.SGD):
    """SGD with lr 0 that keeps the gradients of its first step."""

    def __init__(self, params):
        super().__init__(list(params), lr=0.0)
        self.grads = None

    def step(self, closure=None):
        if self.grads is None:
            self.grads = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]
        return super().step(closure)


class RecordingController:
    """A KL controller that keeps what it was told; its beta stays fixed."""

    def __init__(self, beta=0.1):
        self.value = beta
        self.seen = []

    def update(self, kl, n_steps=1):
        self.seen.append((float(kl), int(n_steps)))
        return self.value


def _models(tok):
    """policy, pi_ref (another init: a KL > 0 from the start), reward model, value model."""
    policy = micro_policy(tok, seed=0)
    ref = models.frozen_copy(micro_policy(tok, seed=2))
    rm = models.ScalarHeadModel.from_policy(micro_policy(tok, seed=1))
    for p in rm.parameters():
        p.requires_grad_(False)
    value = copy.deepcopy(rm).requires_grad_(True)
    return policy, ref, rm, value


def first_update(tok, dist=None, rows=None) -> dict:
    """train_ppo's first iteration written out (prompts, sampling, ppo_step) with recording optimizers.

    ``rows`` (no ``dist``): keep only these rows of the batch, the control of what one rank would
    compute on its own.
    """
    cfg = ppo.PPOConfig(**CFG)
    policy, ref, rm, value = _models(tok)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    prompts = data.all_prompts()
    idx = torch.randint(len(prompts), (cfg.batch_size,), generator=gen).tolist()
    idx = dist.shard(idx) if dist is not None else idx if rows is None else [idx[i] for i in rows]
    ro = ppo.sample_responses(policy, tok, [prompts[i] for i in idx], cfg.max_new_tokens, 1.0, gen, dist=dist)
    pi, v = (policy, value) if dist is None else (dist.wrap(policy), dist.wrap(value))
    opt_pi, opt_v = Recorder(policy.parameters()), Recorder(value.parameters())
    stats, diag = ppo.ppo_step(pi, ref, rm, v, ro, 0.1, cfg, opt_pi, opt_v, gen, dist=dist)
    return {"stats": stats, "diag": diag, "responses": ro.responses, "grads": opt_pi.grads + opt_v.grads}


def short_run(tok, dist=None, checkpoint_dir=None) -> dict:
    """Three iterations of train_ppo with a recording controller."""
    policy, ref, rm, value = _models(tok)
    ctl = RecordingController()
    cfg = ppo.PPOConfig(**{**CFG, "minibatch_size": B // 2, "ppo_epochs": 2, "max_grad_norm": 1.0})
    hist = ppo.train_ppo(policy, ref, rm, value, tok, data.all_prompts(), iterations=3, controller=ctl,
                         config=cfg, seed=0, progress=False, dist=dist, checkpoint_dir=checkpoint_dir,
                         checkpoint_every=3)
    return {"history": hist, "seen": ctl.seen, "params": [p.detach().clone() for p in policy.parameters()]}


def _local_first_kl(tok, dist) -> float:
    """The mean k1 KL of this rank's first-iteration responses alone (what a controller fed locally would see)."""
    policy, ref, rm, _ = _models(tok)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    prompts = data.all_prompts()
    idx = dist.shard(torch.randint(len(prompts), (B,), generator=gen).tolist())
    ro = ppo.sample_responses(policy, tok, [prompts[i] for i in idx], CFG["max_new_tokens"], 1.0, gen, dist=dist)
    return ppo.measure(policy, ref, rm, tok, ro)["k1_seq"]


def _worker(rank: int, world: int, port: int, out: str, mode: str) -> None:
    _env(rank, world, port)
    torch.set_num_threads(1)
    timeout = {"stall": 5.0}.get(mode, 600.0)
    ctx = distributed.init("cpu", timeout_s=timeout)
    assert ctx.backend == "gloo" and ctx.world_size == world and ctx.rank == rank
    if mode == "stall" and rank == 1:
        time.sleep(120)                  # alive but silent: rank 0 must not wait for ever
    tok = small_tokenizer()
    if mode == "stall":
        short_run(tok, dist=ctx)         # blocks in its first collective call
        return
    res = {"first": first_update(tok, dist=ctx), "local_kl": _local_first_kl(tok, ctx),
           "run": short_run(tok, dist=ctx, checkpoint_dir=os.path.join(out, f"ckpt{rank}"))}
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    ctx.close()


def _spawn(mode: str, out: Path, world: int = 2, deadline_s: float = 300.0) -> float:
    """Run ``_worker`` on ``world`` processes; return the seconds taken. Kills them at the deadline."""
    t0 = time.time()
    ctx = mp.start_processes(_worker, args=(world, free_port(), str(out), mode), nprocs=world, join=False,
                             start_method="spawn")
    while not ctx.join(timeout=1):
        if time.time() - t0 > deadline_s:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{mode}: the processes did not finish within {deadline_s:g} s (a hang)")
    return time.time() - t0


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    _spawn("equivalence", out)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


def test_two_ranks_match_one_process_in_the_first_update(two_ranks, tok):
    _, ranks = two_ranks
    ref = first_update(tok)                                      # one process, the whole batch
    # each rank sampled exactly its half of the single-process rollout
    assert ranks[0]["first"]["responses"] + ranks[1]["first"]["responses"] == ref["responses"]
    for r in ranks:
        d, s = r["first"]["diag"], r["first"]["stats"]
        for key in ("pg_loss", "vf_loss", "clipfrac", "approx_kl_k3", "score_clipped_fraction"):
            assert d[key] == pytest.approx(ref["diag"][key], rel=1e-4, abs=1e-6), key
        for key, value in ref["stats"].items():                  # every logged statistic is the global one
            assert s[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        for g, g_ref in zip(r["first"]["grads"], ref["grads"]):  # DDP's averaged gradient = the full batch's
            torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-6)
    for g0, g1 in zip(ranks[0]["first"]["grads"], ranks[1]["first"]["grads"]):
        assert torch.equal(g0, g1)
    # the control: one rank's gradient on its own half is far from the full batch's
    half = first_update(tok, rows=range(B // 2))
    gap = max(float((g - g_ref).abs().max() / g_ref.abs().max()) for g, g_ref in zip(half["grads"], ref["grads"]))
    assert gap > 0.05, gap


def test_short_run_feeds_the_controller_the_global_kl(two_ranks, tok):
    out, ranks = two_ranks
    ref = short_run(tok)                                         # one process, the whole batch
    seen0, seen1 = ranks[0]["run"]["seen"], ranks[1]["run"]["seen"]
    assert len(seen0) == 3 and seen0 == seen1                    # both ranks' controllers heard the same
    assert all(n == B for _, n in seen0)                         # n_steps: the global batch
    local = [r["local_kl"] for r in ranks]
    assert abs(local[0] - local[1]) > 1e-3, local                # the halves disagree ...
    assert seen0[0][0] == pytest.approx((local[0] + local[1]) / 2, rel=1e-5)   # ... the controller got their mean
    assert seen0[0][0] == pytest.approx(ref["seen"][0][0], rel=1e-5)          # = one process on the whole batch
    assert ranks[0]["run"]["history"][0]["k1_seq"] == seen0[0][0]
    for a, b in zip(ranks[0]["run"]["params"], ranks[1]["run"]["params"]):   # the replicas stayed identical
        assert torch.equal(a, b)
    assert all(math.isfinite(row["pg_loss"]) for row in ranks[0]["run"]["history"])
    assert (out / "ckpt0" / "iter_0003" / "config.json").exists() and not (out / "ckpt1").exists()


def test_world_size_must_divide_the_batch(tok):
    # checked before any collective call, so no process group is needed to see it
    fake = distributed.DataParallel(rank=0, world_size=3, local_rank=0, device=torch.device("cpu"), backend="gloo")
    policy, ref, rm, value = _models(tok)
    with pytest.raises(ValueError, match="batch_size: 8 is not a positive multiple of the world size 3"):
        ppo.train_ppo(policy, ref, rm, value, tok, data.all_prompts(), iterations=1,
                      config=ppo.PPOConfig(**CFG), dist=fake)
    two = distributed.DataParallel(rank=1, world_size=2, local_rank=1, device=torch.device("cpu"), backend="gloo")
    with pytest.raises(ValueError, match="minibatch_size"):
        ppo.train_ppo(policy, ref, rm, value, tok, data.all_prompts(), iterations=1,
                      config=ppo.PPOConfig(**{**CFG, "minibatch_size": 3}), dist=two)
    assert two.shard(list(range(8))) == [4, 5, 6, 7]
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    full = torch.randperm(8, generator=g1).tolist()
    assert two.local_permutation(4, g2) == [i - 4 for i in full if i >= 4]   # rank 1's rows, in the global order


def test_a_silent_rank_makes_the_others_fail_after_the_timeout(tmp_path):
    with pytest.raises(mp.ProcessRaisedException, match="(?i)timed out|timeout"):
        _spawn("stall", tmp_path, deadline_s=240)   # past the deadline: pytest.fail, not this error


def _torchrun(args: list[str], tmp_path: Path, timeout: float = 240,
              target: tuple = ("-m", "klbook_lib.rlhf.demo")) -> subprocess.CompletedProcess:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", *target, *args]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun did not finish within {timeout} s (a hang): {' '.join(cmd)}")


def test_torchrun_refuses_a_batch_the_world_size_does_not_divide(tmp_path):
    r = _torchrun(["--device", "cpu", "--preset", "tiny", "--batch-size", "5", "--steps", "1",
                   "--cache-dir", str(tmp_path)], tmp_path, timeout=120)
    assert r.returncode != 0
    assert "--batch-size: 5 is not a positive multiple of the world size 2" in r.stderr, r.stderr[-3000:]
    assert not any(p.name.startswith("rlhf-") for p in tmp_path.iterdir())   # stopped before building anything


def test_torchrun_demo_runs_data_parallel(tmp_path, monkeypatch):
    # the pipeline is built here, small and fast, into the cache the demo then loads
    gpt2 = tmp_path / "gpt2"
    write_gpt2_dir(gpt2)
    monkeypatch.setitem(pl.SETTINGS, "gpt2", dict(n_corpus=300, n_pairs=200, sft_steps=20, sft_batch=16,
                                                  sft_lr=3e-3, rm_steps=5, rm_batch=8, rm_lr=1e-3))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pl.build_pipeline(init_from=gpt2, device="cpu", cache_dir=tmp_path / "cache", progress=False)
    out = tmp_path / "demo.json"
    r = _torchrun(["--init-from", str(gpt2), "--device", "cpu", "--steps", "2", "--batch-size", "8",
                   "--minibatch-size", "4", "--eval-samples", "8", "--target-kl", "0.5",
                   "--cache-dir", str(tmp_path / "cache"), "--out", str(out)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["timing"]["world_size"] == 2 and res["backend"] == "gloo" and len(res["history"]) == 2
    assert res["history"][1]["beta"] != res["history"][0]["beta"]       # the controller acted on the KL
    assert r.stdout.count("s per iteration (median)") == 1               # rank 0 alone prints


def test_torchrun_stops_every_rank_when_one_dies(tmp_path):
    script = tmp_path / "die.py"
    script.write_text("import torch\nfrom klbook_lib.rlhf import distributed\n"
                      "ctx = distributed.init('cpu', timeout_s=600)\n"
                      "if ctx.rank == 1:\n    raise SystemExit('rank 1 dies on purpose')\n"
                      "torch.distributed.all_reduce(torch.ones(1))   # rank 0 waits here for rank 1\n")
    t0 = time.time()
    r = _torchrun([], tmp_path, timeout=120, target=(str(script),))
    assert r.returncode != 0 and time.time() - t0 < 100          # torchrun stopped rank 0, no 600 s wait
    assert "rank 1 dies on purpose" in r.stderr and "rank      : 1" in r.stderr, r.stderr[-3000:]
