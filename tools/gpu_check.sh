#!/usr/bin/env bash
# The book's GPU checks, in one run (issue 15). On a machine with an NVIDIA GPU:
#
#   1. python -m klbook_lib.bench ppo-cuda     env-steps/s with PPO updates at 1k/16k/131k environments
#   2. the RLHF demo at the small preset       a few PPO iterations (pipeline built or loaded first)
#   3. the RLHF demo at the gpt2 preset        GPT-2 small's shape, random init (or --init-from DIR)
#   4. chapters 6-9 under nbval                KLBOOK_SIZE=large: all four on the small preset
#   5. the small demo on 2 GPUs with torchrun  only if two GPUs are visible
#
# and writes one summary, gpu_check.json and gpu_check.md (plus gpu_check.log, every step's
# output), into $OUT if set, else _build/gpu_check/.
#
# Without a usable CUDA GPU (or with --cpu) it runs the CPU fallback instead: the benchmark at
# tiny sizes, the tiny demo on one process and on two (torchrun, gloo), and a "skipped" line
# for every step that needs a GPU. tests/test_gpu_check.py runs that path in `make test`.
#
# Options:  --cpu              force the CPU fallback
#           --steps N          PPO iterations of each demo (default 5 on a GPU, 2 on the CPU)
#           --init-from DIR    step 3 starts from a local Hugging Face GPT-2 directory
#           --skip-notebooks   leave out step 4
# Environment: PYTHON (default .venv/bin/python, else python3): a Python whose torch is a CUDA
# build on a GPU machine (see the README, "GPU checks"); KLBOOK_CACHE (default
# _build/klbook_cache): the pipeline cache.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PY" ]; then PY="$(command -v python3)"; fi
export KLBOOK_CACHE="${KLBOOK_CACHE:-$PWD/_build/klbook_cache}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONHASHSEED=0 MPLBACKEND=Agg
export KLBOOK_GPU_CHECK_OUT="${OUT:-$PWD/_build/gpu_check}"
exec "$PY" - "$@" <<'PYEOF'
import argparse, datetime, json, os, platform, shutil, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser(prog="tools/gpu_check.sh")
ap.add_argument("--cpu", action="store_true", help="force the CPU fallback")
ap.add_argument("--steps", type=int, default=None, help="PPO iterations per demo")
ap.add_argument("--init-from", default=None, help="local GPT-2 directory for the gpt2 demo")
ap.add_argument("--skip-notebooks", action="store_true")
args = ap.parse_args()

import torch

OUT = os.environ["KLBOOK_GPU_CHECK_OUT"]
os.makedirs(OUT, exist_ok=True)
LOG = os.path.join(OUT, "gpu_check.log")
open(LOG, "w").close()
TMP = tempfile.mkdtemp(prefix="gpu-check-")
PY = sys.executable


def log(text):
    print(text, flush=True)
    with open(LOG, "a") as f:
        f.write(text + "\n")


def nvidia_smi():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=60)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


smi = nvidia_smi()
cuda = torch.cuda.is_available() and not args.cpu
n_gpus = torch.cuda.device_count() if cuda else 0
summary = {
    "when": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
    "mode": "gpu" if cuda else "cpu-fallback", "python": sys.version.split()[0], "torch": torch.__version__,
    "torch_cuda": torch.version.cuda, "nvidia_smi": smi, "gpus": [torch.cuda.get_device_name(i) for i in range(n_gpus)],
    "steps": [],
}
misconfigured = bool(smi) and not torch.cuda.is_available() and not args.cpu
log(f"gpu_check: {summary['mode']} on {summary['host']}; python {summary['python']}, torch {torch.__version__} "
    f"(CUDA {torch.version.cuda}); nvidia-smi: {smi or 'not found'}; GPUs for torch: {n_gpus}")
if misconfigured:
    log("ERROR: nvidia-smi sees a GPU but this torch has no CUDA (a CPU build). Install the CUDA build of the "
        "pinned torch first, e.g.\n  .venv/bin/pip install --force-reinstall torch==2.13.0 "
        "--index-url https://download.pytorch.org/whl/cu130\n(cu126, cu128 or cu130: not above the CUDA version "
        "nvidia-smi reports), then run this script again.")
    summary.update(mode="misconfigured", ok=False, misconfigured_torch=True)
    with open(os.path.join(OUT, "gpu_check.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(OUT, "gpu_check.md"), "w") as f:
        f.write(f"# GPU check, {summary['when']}\n\nnvidia-smi sees a GPU ({smi}) but torch {torch.__version__} has "
                f"no CUDA: install the CUDA build of torch (README, 'GPU checks'). Nothing was run.\n")
    sys.exit(3)
steps = args.steps or (5 if cuda else 2)


def run(name, cmd, timeout, env=None, result_file=None):
    """Run one step; record status, seconds and the result file's contents."""
    log(f"\n=== {name}\n$ {' '.join(cmd)}")
    t0 = time.time()
    step = {"name": name, "command": " ".join(cmd)}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
        with open(LOG, "a") as f:
            f.write(p.stdout + p.stderr)
        step["status"] = "ok" if p.returncode == 0 else "failed"
        if p.returncode != 0:
            step["reason"] = f"exit code {p.returncode}: " + (p.stderr.strip().splitlines() or ["?"])[-1][-300:]
    except subprocess.TimeoutExpired:
        step["status"], step["reason"] = "failed", f"timed out after {timeout} s"
    step["seconds"] = round(time.time() - t0, 1)
    if result_file and os.path.exists(result_file):
        with open(result_file) as f:
            step["result"] = json.load(f)
    log(f"--- {name}: {step['status']} in {step['seconds']} s" + (f" ({step['reason']})" if "reason" in step else ""))
    summary["steps"].append(step)
    return step


def skip(name, reason):
    log(f"\n=== {name}\nSKIPPED: {reason}")
    summary["steps"].append({"name": name, "status": "skipped", "reason": reason})


def demo_cmd(preset, device, out, extra=()):
    batch = ["--batch-size", "256", "--eval-samples", "512"] if cuda else \
            ["--batch-size", "8", "--minibatch-size", "8", "--eval-samples", "8"]
    return ["-m", "klbook_lib.rlhf.demo", "--preset", preset, "--device", device, "--steps", str(steps),
            *batch, "--out", out, *extra]


bench_json = os.path.join(TMP, "bench.json")
if cuda:
    run("bench ppo-cuda", [PY, "-m", "klbook_lib.bench", "ppo-cuda", "--json", bench_json], 3600,
        result_file=bench_json)
    for preset in ("small", "gpt2"):
        out = os.path.join(TMP, f"demo_{preset}.json")
        extra = ("--init-from", args.init_from) if preset == "gpt2" and args.init_from else ()
        run(f"demo {preset} (1 GPU)", [PY, *demo_cmd(preset, "cuda", out, extra)], 3600, result_file=out)
    if args.skip_notebooks:
        skip("chapters 6-9, KLBOOK_SIZE=large", "--skip-notebooks")
    else:
        for nb in ("06_rlhf_reverse_kl", "07_token_level_kl", "08_vi_elbo_dpo", "09_choosing_beta"):
            run(f"nbval {nb} (KLBOOK_SIZE=large)",
                [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax", "--nbval-cell-timeout=1800",
                 f"chapters/{nb}.ipynb"], 3600, env={"KLBOOK_SIZE": "large", "KLBOOK_NO_NBCACHE": "1"})
    if n_gpus >= 2:
        out = os.path.join(TMP, "demo_small_2gpu.json")
        run("demo small (torchrun, 2 GPUs, nccl)", [PY, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", *demo_cmd("small", "cuda", out)], 3600, result_file=out)
    else:
        skip("demo small (torchrun, 2 GPUs, nccl)", f"needs two GPUs, {n_gpus} visible")
else:
    reason = "needs an NVIDIA GPU and a CUDA build of torch" if not args.cpu else "--cpu given"
    run("bench ppo-cuda (CPU fallback: --allow-cpu, 64 and 256 envs)",
        [PY, "-m", "klbook_lib.bench", "ppo-cuda", "--allow-cpu", "--sizes", "64,256", "--updates", "2",
         "--seeds", "0", "--json", bench_json], 900, result_file=bench_json)
    out = os.path.join(TMP, "demo_tiny.json")
    run("demo tiny (CPU fallback, 1 process)", [PY, *demo_cmd("tiny", "cpu", out)], 1800,
        env={"OMP_NUM_THREADS": "1"}, result_file=out)
    skip("demo small (1 GPU)", reason)
    skip("demo gpt2 (1 GPU)", reason)
    skip("chapters 6-9, KLBOOK_SIZE=large", reason)
    out = os.path.join(TMP, "demo_tiny_2proc.json")
    run("demo tiny (CPU fallback, torchrun, 2 processes, gloo)",
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *demo_cmd("tiny", "cpu", out)],
        1800, env={"OMP_NUM_THREADS": "1"}, result_file=out)
    skip("demo small (torchrun, 2 GPUs, nccl)", reason)

# ---- the summary ------------------------------------------------------------------------------
failed = [s["name"] for s in summary["steps"] if s["status"] == "failed"]
summary["ok"] = not failed
summary["misconfigured_torch"] = False
with open(os.path.join(OUT, "gpu_check.json"), "w") as f:
    json.dump(summary, f, indent=1)


def figures(step):
    r = step.get("result") or {}
    if "train_env_steps_per_s" in r:
        return "; ".join(f"{int(n):,} envs: {v:,.0f} steps/s with updates" for n, v in r["train_env_steps_per_s"].items())
    if "timing" in r:
        t, b, a = r["timing"], r["before"], r["after"]
        return (f"{t['world_size']} process(es), {t['seconds_per_iteration_median']:.3f} s/iteration (median); "
                f"score {b['score']:.2f} -> {a['score']:.2f}, KL {a['kl_exact_seq']:.2f} nats")
    return step.get("reason", "")


lines = [f"# GPU check, {summary['when']}", "",
         f"Mode **{summary['mode']}** on `{summary['host']}`: Python {summary['python']}, torch {summary['torch']} "
         f"(CUDA {summary['torch_cuda']}), GPUs: {', '.join(summary['gpus']) or 'none'}; nvidia-smi: "
         f"{smi or 'not found'}.", ""]
lines += ["| step | status | seconds | figures |", "|---|---|---|---|"]
for s in summary["steps"]:
    lines.append(f"| {s['name']} | {s['status']} | {s.get('seconds', '')} | {figures(s)} |")
bench = next((s.get("result") for s in summary["steps"] if s["name"].startswith("bench") and s.get("result")), None)
if bench:
    lines += ["", f"Benchmark on {bench['device']}:", "", "| environments | env steps/s (stepping only) | "
              "env steps/s (PPO, with updates) | s per update |", "|---|---|---|---|"]
    for r in bench["train"]:
        n = r["num_envs"]
        stepping = bench["env_steps_per_s"].get(str(n), float("nan"))     # JSON keys are strings
        lines.append(f"| {n:,} | {stepping:,.0f} | {r['env_steps_per_s']:,.0f} | {r['seconds_per_update']:.3f} |")
lines += ["", f"{'All steps passed' if summary['ok'] else 'Failed: ' + ', '.join(failed) if failed else 'See above'}"
          f" (log: gpu_check.log).", ""]
with open(os.path.join(OUT, "gpu_check.md"), "w") as f:
    f.write("\n".join(lines))
shutil.rmtree(TMP, ignore_errors=True)
log("\n" + "\n".join(lines))
log(f"gpu_check: wrote {os.path.join(OUT, 'gpu_check.json')} and gpu_check.md")
sys.exit(1 if failed else 0)
PYEOF
