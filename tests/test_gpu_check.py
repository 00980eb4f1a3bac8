"""tools/gpu_check.sh: the CPU-fallback path runs every step it can, skips the GPU-only ones with
a clear line, and writes the JSON and markdown summary; a GPU that torch cannot use stops it."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from klbook_lib import bench
from klbook_lib.rlhf import pipeline as pl

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.sh"
GPU_ONLY = ("demo small (1 GPU)", "demo gpt2 (1 GPU)", "chapters 6-9, KLBOOK_SIZE=large",
            "demo small (torchrun, 2 GPUs, nccl)")


def _env(tmp_path, cache):
    return {**os.environ, "OUT": str(tmp_path / "out"), "KLBOOK_CACHE": str(cache), "PYTHON": sys.executable,
            "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}


@pytest.mark.slow
def test_cpu_fallback_runs_and_writes_the_summary(tmp_path, monkeypatch):
    # a small, fast tiny pipeline in a private cache, which the script's demos then load
    monkeypatch.setitem(pl.SETTINGS, "tiny", dict(n_corpus=300, n_pairs=200, sft_steps=20, sft_batch=16,
                                                  sft_lr=3e-3, rm_steps=5, rm_batch=8, rm_lr=1e-3))
    cache = tmp_path / "cache"
    pl.build_pipeline("tiny", seed=0, device="cpu", cache_dir=cache, progress=False)
    r = subprocess.run(["bash", str(SCRIPT), "--cpu"], cwd=ROOT, env=_env(tmp_path, cache), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["mode"] == "cpu-fallback" and summary["ok"] is True
    steps = {s["name"]: s for s in summary["steps"]}
    for name in GPU_ONLY:                                 # skipped, each with its line and reason
        assert steps[name]["status"] == "skipped" and steps[name]["reason"] == "--cpu given"
        assert f"=== {name}\nSKIPPED: --cpu given" in r.stdout
    ran = [s for s in summary["steps"] if s["status"] != "skipped"]
    assert len(ran) == 3 and all(s["status"] == "ok" for s in ran), ran
    bench, one, two = (s["result"] for s in ran)
    assert bench["device"] == "cpu" and set(bench["train_env_steps_per_s"]) == {"64", "256"}
    assert all(v > 0 for v in bench["train_env_steps_per_s"].values())
    assert one["timing"]["world_size"] == 1 and two["timing"]["world_size"] == 2 and two["backend"] == "gloo"
    assert len(one["history"]) == len(two["history"]) == 2
    md = (out / "gpu_check.md").read_text()
    assert "cpu-fallback" in md and "All steps passed" in md
    for s in summary["steps"]:
        assert f"| {s['name']} | {s['status']} |" in md


def test_a_gpu_without_cuda_torch_stops_with_the_install_line(tmp_path):
    # an nvidia-smi that reports a GPU, with this CPU build of torch: stop at once, say how to fix it
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 580.159.03, 143771 MiB'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = _env(tmp_path, tmp_path / "cache")
    env["PATH"] = f"{fake}:{env['PATH']}"
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine's torch has CUDA")
    r = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3
    assert "pip install --force-reinstall torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130" in r.stdout
    summary = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert summary["mode"] == "misconfigured" and summary["steps"] == [] and "H200" in summary["nvidia_smi"]


def test_ppo_throughput_counts_the_timed_updates():
    r = bench.ppo_throughput(32, "cpu", updates=2)
    assert r["updates_timed"] == 2 and r["env_steps"] == 2 * 32 * bench.CUDA_PRESET["num_steps"]
    assert r["env_steps_per_s"] == pytest.approx(r["env_steps"] / r["seconds"])
    assert r["seconds_per_update"] == pytest.approx(r["seconds"] / 2)
    with pytest.raises(ValueError, match="updates"):
        bench.ppo_throughput(32, "cpu", updates=0)
