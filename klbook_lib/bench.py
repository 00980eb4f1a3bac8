"""Benchmarks (not unit tests): ``python -m klbook_lib.bench ppo``, ``... ppo-cuda`` and ``... seeds``.

``ppo``
    Trains this library's PPO (``PPOConfig.cartpole_bench()``) and Stable-Baselines3's PPO with the
    rl-baselines3-zoo CartPole-v1 hyperparameters side by side, alternating which goes first,
    for several seeds, on one torch thread. For each run it prints the environment steps and
    wall-clock seconds until the mean return of the last 20 finished episodes reaches 475,
    then the fraction of seeds that got there and the median wall-time ratio SB3 / ours.
    Both sides' hyperparameters are printed first. Wall time covers everything from building
    the environments and networks to the solving update (no evaluation on either side).
    Needs the extras in ``requirements-bench.txt`` (stable-baselines3, gymnasium).

``ppo-cuda``
    Environment steps per second of the batched CartPole on CUDA at 1k, 16k and 131k
    environments: stepping alone (random actions), and PPO training (rollouts plus updates,
    :func:`ppo_throughput`); then the time to solve CartPole with 1024 environments on the
    GPU. Exits with an error when CUDA is not available (``--allow-cpu`` runs the same code
    on the CPU, at ``--sizes`` of your choice, to check it; ``--seeds 0`` skips the solving runs).

``seeds``
    Many seeds for the price of a few, side by side in one process on one torch thread:
    (a) 10 seeds of the CartPole PPO one after another, one :func:`klbook_lib.ppo.train` per
    seed (the way the chapters ran them), and (b) the same 10 seeds as one batched
    :func:`klbook_lib.ppo.train_seeds`, each to the 475 rolling mean (or 100k steps), with the
    chapters' preset (``PPOConfig()``, i.e. ``cartpole_fast``; ``--preset bench`` for
    ``cartpole_bench``). Prints both times, the ratio (a) / (b), and whether every seed's run
    is the same in (a) and (b) (updates, solve step, final weights). Then, if the module
    exists, the tiny GPT-2 PPO-RLHF's own comparison, ``klbook_lib.rlhf.seeds.seed_benchmark``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

SOLVE_RETURN = 475.0
WINDOW = 20

# rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1
SB3_ZOO = dict(n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
               ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, n_timesteps=100_000)


def run_ours(seed: int, max_steps: int = 100_000, **overrides) -> dict:
    from klbook_lib import ppo

    cfg = ours_config(seed=seed, total_timesteps=max_steps, **overrides)
    t0 = time.perf_counter()
    res = ppo.train(cfg, progress=False)
    wall = time.perf_counter() - t0
    return {"algo": "ours", "seed": seed, "solved": res.solved, "steps": res.solved_at_step,
            "seconds": wall if res.solved else None, "total_seconds": wall}


# the fields of our preset that the benchmark prints (all of them are PPOConfig fields)
OURS_FIELDS = ("num_envs", "num_steps", "total_timesteps", "update_epochs", "num_minibatches",
               "learning_rate", "anneal_lr", "clip_coef", "anneal_clip", "gamma", "gae_lambda",
               "norm_adv", "vf_coef", "ent_coef", "max_grad_norm", "adam_eps", "fused_adam",
               "hidden_sizes", "objective", "target_kl", "device")


def ours_config(seed: int = 0, total_timesteps: int = 100_000, **overrides):
    """Our side of the benchmark: ``PPOConfig.cartpole_bench`` with the shared solve criterion."""
    from klbook_lib import ppo

    return ppo.PPOConfig.cartpole_bench(seed=seed, total_timesteps=total_timesteps,
                                        stop_at_return=SOLVE_RETURN, solve_window=WINDOW, **overrides)


def run_sb3(seed: int, max_steps: int = SB3_ZOO["n_timesteps"]) -> dict:
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_vec_env
        from stable_baselines3.common.logger import Logger
    except ImportError as exc:  # pragma: no cover - depends on the optional extras
        raise SystemExit("bench ppo: stable-baselines3 and gymnasium are needed: "
                         "pip install -r requirements-bench.txt") from exc
    from collections import deque

    class SolveCallback(BaseCallback):
        def __init__(self):
            super().__init__()
            self.recent = deque(maxlen=WINDOW)
            self.solved_at = None
            self.solved_time = None

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    self.recent.append(float(ep["r"]))
            if len(self.recent) == WINDOW and sum(self.recent) / WINDOW >= SOLVE_RETURN:
                self.solved_at = self.num_timesteps
                self.solved_time = time.perf_counter()
                return False
            return True

    zoo = SB3_ZOO
    t0 = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=zoo["n_envs"], seed=seed)
    model = PPO("MlpPolicy", env, n_steps=zoo["n_steps"], batch_size=zoo["batch_size"],
                gae_lambda=zoo["gae_lambda"], gamma=zoo["gamma"], n_epochs=zoo["n_epochs"],
                ent_coef=zoo["ent_coef"], learning_rate=lambda f: f * zoo["learning_rate"],
                clip_range=lambda f: f * zoo["clip_range"], seed=seed, device="cpu", verbose=0)
    model.set_logger(Logger(folder=None, output_formats=[]))  # no log folder in /tmp
    cb = SolveCallback()
    model.learn(total_timesteps=max_steps, callback=cb)
    wall = time.perf_counter() - t0
    solved = cb.solved_at is not None
    env.close()
    return {"algo": "sb3", "seed": seed, "solved": solved, "steps": cb.solved_at,
            "seconds": (cb.solved_time - t0) if solved else None, "total_seconds": wall}


def _fmt(r: dict) -> str:
    if r["solved"]:
        return (f"{r['algo']:>5}  seed {r['seed']}  solved after {r['steps']:>7,d} steps "
                f"in {r['seconds']:6.2f} s")
    return f"{r['algo']:>5}  seed {r['seed']}  NOT solved ({r['total_seconds']:.1f} s)"


def bench_ppo(seeds: int = 5, json_path: str | None = None) -> dict:
    torch.set_num_threads(1)
    print(f"bench ppo: {seeds} seeds, 1 torch thread, solved = mean of last {WINDOW} episodes "
          f">= {SOLVE_RETURN:g}", flush=True)
    cfg = ours_config()
    print("  ours: PPOConfig.cartpole_bench(): "
          + ", ".join(f"{k}={getattr(cfg, k)!r}" for k in OURS_FIELDS), flush=True)
    print("  sb3:  rl-zoo CartPole-v1, lr and clip decayed linearly to 0: "
          + ", ".join(f"{k}={v!r}" for k, v in SB3_ZOO.items()), flush=True)
    # warm-up (imports, first optimizer step), not timed
    run_ours(0, max_steps=512)
    run_sb3(0, max_steps=512)
    runs = []
    for seed in range(seeds):
        order = (run_ours, run_sb3) if seed % 2 == 0 else (run_sb3, run_ours)
        for fn in order:
            r = fn(seed)
            runs.append(r)
            print(_fmt(r), flush=True)
    summary = {}
    for algo in ("ours", "sb3"):
        rs = [r for r in runs if r["algo"] == algo]
        ok = [r for r in rs if r["solved"]]
        summary[algo] = {
            "solved_fraction": len(ok) / len(rs),
            "median_steps": statistics.median(r["steps"] for r in ok) if ok else None,
            "median_seconds": statistics.median(r["seconds"] for r in ok) if ok else None,
        }
    ratios = []
    for seed in range(seeds):
        o = next(r for r in runs if r["algo"] == "ours" and r["seed"] == seed)
        s = next(r for r in runs if r["algo"] == "sb3" and r["seed"] == seed)
        if o["solved"] and s["solved"]:
            ratios.append(s["seconds"] / o["seconds"])
    summary["median_ratio_sb3_over_ours"] = statistics.median(ratios) if ratios else None
    print()
    for algo in ("ours", "sb3"):
        s = summary[algo]
        med_steps = f"{s['median_steps']:,.0f}" if s["median_steps"] is not None else "-"
        med_sec = f"{s['median_seconds']:.2f}" if s["median_seconds"] is not None else "-"
        print(f"{algo:>5}: solved {s['solved_fraction']:.0%} of seeds, median {med_steps} steps, "
              f"median {med_sec} s")
    if ratios:
        print(f"median wall-time ratio SB3/ours over seeds solved by both: "
              f"{summary['median_ratio_sb3_over_ours']:.2f} (per seed: "
              + ", ".join(f"{x:.2f}" for x in ratios) + ")")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"ours_config": {k: getattr(cfg, k) for k in OURS_FIELDS}, "sb3_config": SB3_ZOO,
                       "runs": runs, "summary": summary}, f, indent=2)
    return summary


# Many-environment preset for a GPU: the batch grows, the number of gradient steps stays small.
CUDA_PRESET = dict(num_envs=1024, num_steps=16, update_epochs=4, num_minibatches=4,
                   learning_rate=3e-3, clip_coef=0.2, total_timesteps=4_000_000)
CUDA_SIZES = (1024, 16384, 131072)
CPU_SIZES = (256, 4096)


def ppo_throughput(num_envs: int, device: str, updates: int = 5, seed: int = 0) -> dict:
    """Environment steps per second of PPO training (rollouts and updates) with ``num_envs`` copies.

    :data:`CUDA_PRESET` with ``num_envs`` environments runs ``updates + 1`` updates; the first
    (warm-up: kernel compilation, allocator) is not timed. Each update collects
    ``num_envs * 16`` steps and makes 4 epochs of 4 minibatch steps.
    """
    from klbook_lib import ppo

    if updates < 1:
        raise ValueError(f"updates: must be >= 1, got {updates!r}")
    cfg = ppo.PPOConfig(device=device, seed=seed, **{
        **CUDA_PRESET, "num_envs": num_envs, "stop_at_return": None,
        "total_timesteps": num_envs * CUDA_PRESET["num_steps"] * (updates + 1)})
    res = ppo.train(cfg, progress=False)
    h = res.history                      # wall_time: seconds from the start to the end of each update
    steps = h["global_step"][-1] - h["global_step"][0]
    seconds = h["wall_time"][-1] - h["wall_time"][0]
    return {"num_envs": num_envs, "updates_timed": len(h["update"]) - 1, "env_steps": steps,
            "seconds": seconds, "env_steps_per_s": steps / seconds,
            "seconds_per_update": seconds / (len(h["update"]) - 1),
            "first_update_seconds": h["wall_time"][0]}


def bench_ppo_cuda(allow_cpu: bool = False, seeds: int = 3, json_path: str | None = None,
                   sizes: tuple[int, ...] | None = None, updates: int = 5) -> dict:
    from klbook_lib import envs, ppo

    if torch.cuda.is_available():
        device = "cuda"
    elif allow_cpu:
        device = "cpu"
        print("bench ppo-cuda: CUDA is not available; --allow-cpu runs the same code on the CPU")
    else:
        raise SystemExit("bench ppo-cuda: CUDA is not available (torch.cuda.is_available() is False). "
                         "Run it on a machine with an NVIDIA GPU and a CUDA build of torch, or use "
                         "`python -m klbook_lib.bench ppo` for the CPU benchmark.")

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    out = {"device": device, "torch": torch.__version__, "env_steps_per_s": {}, "train_env_steps_per_s": {},
           "train": [], "runs": []}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
    sizes = tuple(sizes) if sizes else (CUDA_SIZES if device == "cuda" else CPU_SIZES)
    if any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"sizes: must be positive integers, got {sizes!r}")
    for n in sizes:
        env = envs.CartPole(n, device=device, seed=0)
        gen = torch.Generator(device=device).manual_seed(0)
        for _ in range(10):
            env.step(torch.randint(0, 2, (n,), device=device, generator=gen))
        sync()
        steps = 200
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step(torch.randint(0, 2, (n,), device=device, generator=gen))
        sync()
        rate = n * steps / (time.perf_counter() - t0)
        out["env_steps_per_s"][n] = rate
        print(f"CartPole x {n:>7,d} on {device}: {rate:,.0f} env steps/s (random actions)", flush=True)
    for n in sizes:
        r = ppo_throughput(n, device, updates=updates)
        out["train"].append(r)
        out["train_env_steps_per_s"][n] = r["env_steps_per_s"]
        print(f"PPO training x {n:>7,d} envs on {device}: {r['env_steps_per_s']:,.0f} env steps/s including "
              f"updates ({r['seconds_per_update']:.3f} s per update of {n * CUDA_PRESET['num_steps']:,d} steps)",
              flush=True)
    if seeds == 0:
        if json_path:
            with open(json_path, "w") as f:
                json.dump(out, f, indent=2)
        return out
    ppo.train(ppo.PPOConfig(device=device, **{**CUDA_PRESET, "total_timesteps": 2 * 16 * 1024,
                                              "stop_at_return": None}), progress=False)  # warm-up
    for seed in range(seeds):
        cfg = ppo.PPOConfig(device=device, seed=seed, **CUDA_PRESET)
        t0 = time.perf_counter()
        res = ppo.train(cfg, progress=False)
        wall = time.perf_counter() - t0
        r = {"seed": seed, "solved": res.solved, "steps": res.solved_at_step,
             "seconds": res.solved_at_time, "updates": len(res.history["update"]), "total_seconds": wall}
        out["runs"].append(r)
        if res.solved:
            print(f"PPO {CUDA_PRESET['num_envs']} envs seed {seed}: solved after {res.solved_at_step:,d} "
                  f"steps ({r['updates']} updates) in {res.solved_at_time:.2f} s", flush=True)
        else:
            print(f"PPO {CUDA_PRESET['num_envs']} envs seed {seed}: NOT solved in {wall:.1f} s", flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=2)
    return out


def bench_seeds(n_seeds: int = 10, preset: str = "fast", rlhf: bool = True, rlhf_iterations: int = 10,
                json_path: str | None = None) -> dict:
    """(a) ``n_seeds`` CartPole PPO runs one by one against (b) one batched run; see the module docstring."""
    from dataclasses import replace

    from klbook_lib import ppo

    if preset not in ("fast", "bench"):
        raise ValueError(f"preset: must be 'fast' or 'bench', got {preset!r}")
    torch.set_num_threads(1)
    cfg = (ppo.PPOConfig.cartpole_fast if preset == "fast" else ppo.PPOConfig.cartpole_bench)(
        stop_at_return=SOLVE_RETURN, solve_window=WINDOW)
    seeds = list(range(n_seeds))
    print(f"bench seeds: {n_seeds} seeds of the CartPole PPO, PPOConfig.cartpole_{preset}() (the chapters' "
          f"preset is cartpole_fast, the defaults), to a mean of the last {WINDOW} episodes >= "
          f"{SOLVE_RETURN:g} or {cfg.total_timesteps:,d} steps, 1 torch thread", flush=True)
    warm = replace(cfg, total_timesteps=2 * cfg.num_envs * cfg.num_steps, stop_at_return=None)
    ppo.train(warm, progress=False)                      # warm-up (imports, first steps), not timed
    ppo.train_seeds(warm, seeds[:2], progress=False)
    # wall clock, and this process's CPU time (less moved by other work on a shared machine)
    t0, c0 = time.perf_counter(), time.process_time()
    alone = [ppo.train(replace(cfg, seed=s), progress=False) for s in seeds]
    t1, c1 = time.perf_counter(), time.process_time()
    batched = ppo.train_seeds(cfg, seeds, progress=False)
    t2, c2 = time.perf_counter(), time.process_time()
    same = [len(a.history["update"]) == len(b.history["update"]) and a.solved_at_step == b.solved_at_step
            and all(torch.equal(p, q) for p, q in zip(a.agent.parameters(), b.agent.parameters()))
            for a, b in zip(alone, batched)]
    out = {"preset": f"cartpole_{preset}", "n_seeds": n_seeds, "seconds_one_by_one": t1 - t0,
           "seconds_batched": t2 - t1, "ratio": (t1 - t0) / (t2 - t1),
           "cpu_seconds_one_by_one": c1 - c0, "cpu_seconds_batched": c2 - c1, "cpu_ratio": (c1 - c0) / (c2 - c1),
           "updates": [len(a.history["update"]) for a in alone], "solved": [a.solved for a in alone],
           "identical_runs": sum(same)}
    print(f"  (a) one by one: {out['seconds_one_by_one']:.2f} s; (b) batched: {out['seconds_batched']:.2f} s; "
          f"ratio (a)/(b) = {out['ratio']:.2f} (CPU time: {out['cpu_seconds_one_by_one']:.2f} s and "
          f"{out['cpu_seconds_batched']:.2f} s, ratio {out['cpu_ratio']:.2f})", flush=True)
    print(f"  updates per seed {out['updates']}, solved {sum(out['solved'])} of {n_seeds}; "
          f"{sum(same)} of {n_seeds} batched runs identical to their run alone (weights bit for bit)", flush=True)
    if rlhf:
        try:
            from klbook_lib.rlhf.seeds import seed_benchmark
        except ImportError as exc:
            print(f"  tiny RLHF PPO: skipped, klbook_lib.rlhf.seeds.seed_benchmark is not importable ({exc})")
        else:
            r = seed_benchmark(n_seeds=n_seeds, iterations=rlhf_iterations)
            out["rlhf"] = r
            print(f"  tiny RLHF PPO, {r['n_seeds']} seeds x {r['iterations']} iterations: (a) one by one "
                  f"{r['seconds_sequential']:.2f} s; (b) batched {r['seconds_batched']:.2f} s; ratio (a)/(b) = "
                  f"{r['ratio']:.2f} (largest score difference {r['max_abs_score_diff']:.2g})", flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m klbook_lib.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("which", choices=["ppo", "ppo-cuda", "seeds"])
    parser.add_argument("--seeds", type=int, default=None,
                        help="number of seeds (ppo: 5, ppo-cuda: 3 solving runs, 0 skips them; seeds: 10)")
    parser.add_argument("--preset", choices=["fast", "bench"], default="fast",
                        help="seeds: the CartPole preset (fast: the chapters' defaults)")
    parser.add_argument("--no-rlhf", action="store_true", help="seeds: skip the tiny RLHF PPO comparison")
    parser.add_argument("--sizes", default=None,
                        help="ppo-cuda: comma-separated numbers of environments (default 1024,16384,131072 on CUDA)")
    parser.add_argument("--updates", type=int, default=5, help="ppo-cuda: timed PPO updates per size")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--allow-cpu", action="store_true", help="ppo-cuda: run on the CPU if CUDA is absent")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < (0 if args.which == "ppo-cuda" else 1):
        parser.error("--seeds: must be a positive integer (0 allowed for ppo-cuda)")
    if args.updates < 1:
        parser.error("--updates: must be a positive integer")
    sizes = None
    if args.sizes:
        try:
            sizes = tuple(int(x) for x in args.sizes.split(","))
        except ValueError:
            parser.error(f"--sizes: expected comma-separated integers, got {args.sizes!r}")
        if any(n < 1 for n in sizes):
            parser.error(f"--sizes: must be positive, got {args.sizes!r}")
    if args.which == "ppo":
        bench_ppo(args.seeds or 5, args.json)
    elif args.which == "seeds":
        bench_seeds(args.seeds or 10, args.preset, not args.no_rlhf, json_path=args.json)
    else:
        bench_ppo_cuda(args.allow_cpu, 3 if args.seeds is None else args.seeds, args.json, sizes, args.updates)
    return 0


if __name__ == "__main__":
    sys.exit(main())
