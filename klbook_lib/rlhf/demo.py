"""Command-line RLHF demo for the bigger presets (meant for a GPU).

    python -m klbook_lib.rlhf.demo --preset small --device cuda --beta 0.05 --steps 200

Builds (or loads from the cache) the pipeline for the preset, runs PPO-RLHF with a fixed
``beta`` (or the proportional controller with ``--target-kl``), and prints the reward,
the KL to ``pi_ref``, the policy entropy and sample responses before and after, plus how
many distinct responses each policy gives to the same prompts (mode seeking).
``--device cuda`` on a machine without CUDA stops at once with a clear message.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m klbook_lib.rlhf.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=("tiny", "small", "gpt2"))
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--beta", type=float, default=0.05, help="fixed KL coefficient")
    ap.add_argument("--target-kl", type=float, default=None,
                    help="use the proportional controller with this per-sequence KL target instead")
    ap.add_argument("--steps", type=int, default=200, help="PPO iterations")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=None,
                    help="policy learning rate (default: 3e-4 tiny, 1e-4 small, 2e-5 gpt2)")
    ap.add_argument("--eval-samples", type=int, default=512)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None, help="write the history and summary as JSON here")
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {args.device} was requested but CUDA is not available on this machine "
              f"(torch {torch.__version__}); use --device cpu --preset tiny on a CPU.", file=sys.stderr)
        return 2
    if args.steps < 1 or args.batch_size < 1:
        print("error: --steps and --batch-size must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    from klbook_lib.rlhf.pipeline import build_pipeline
    from klbook_lib.rlhf.ppo import PPOConfig, evaluate_policy, run_rlhf

    t0 = time.time()
    pipe = build_pipeline(args.preset, seed=args.seed, device=args.device, cache_dir=args.cache_dir)
    print(pipe.summary(), f"({time.time() - t0:.0f} s)")
    controller = None
    if args.target_kl is not None:
        from klbook_lib.controllers import ProportionalKL
        controller = ProportionalKL(beta=args.beta, target=args.target_kl, horizon=10000)
    lr = args.lr if args.lr is not None else {"tiny": 3e-4, "small": 1e-4, "gpt2": 2e-5}[args.preset]
    cfg = PPOConfig(batch_size=args.batch_size, minibatch_size=min(64, args.batch_size), lr=lr,
                    value_lr=3 * lr)
    before, ro_before = evaluate_policy(pipe, pipe.ref_model, n=args.eval_samples, seed=args.seed + 1)
    res = run_rlhf(pipe, beta=args.beta, steps=args.steps, seed=args.seed, controller=controller, config=cfg)
    after, ro_after = evaluate_policy(pipe, res.policy, n=args.eval_samples, seed=args.seed + 1)
    keys = ("score", "true_reward", "kl_exact_seq", "k1_seq", "entropy_seq", "distinct_fraction", "response_length")
    print(f"{'':>18} {'pi_ref':>10} {'tuned':>10}")
    for k in keys:
        print(f"{k:>18} {before[k]:10.3f} {after[k]:10.3f}")
    for name, ro in (("pi_ref", ro_before), ("tuned", ro_after)):
        print(f"\nsamples from {name}:")
        for p, r in list(zip(ro.prompts, ro.responses))[:8]:
            print("  ", p + r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "before": before, "after": after, "history": res.history,
                       "pipeline_metrics": pipe.metrics}, f)
    print(f"\ntotal {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
