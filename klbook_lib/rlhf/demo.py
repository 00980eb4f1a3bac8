"""Command-line RLHF demo for the bigger presets, real GPT-2 weights and several processes.

    python -m klbook_lib.rlhf.demo --preset small --device cuda --beta 0.05 --steps 200
    python -m klbook_lib.rlhf.demo --init-from /path/to/gpt2 --device cuda
    torchrun --nproc_per_node=2 -m klbook_lib.rlhf.demo --preset small --device cuda

Builds (or loads from the cache) the pipeline for the preset, runs PPO-RLHF with a fixed
``beta`` (or the proportional controller with ``--target-kl``), and prints the reward,
the KL to ``pi_ref``, the policy entropy and sample responses before and after, plus how
many distinct responses each policy gives to the same prompts (mode seeking).
``--device cuda`` on a machine without CUDA stops at once with a clear message.

``--init-from DIR`` starts from a local Hugging Face GPT-2 directory (``config.json``,
``model.safetensors`` or ``pytorch_model.bin``, the tokenizer files), read offline; the
preset then defaults to ``gpt2`` and only sets the training sizes.

Under ``torchrun`` the run is data-parallel (:mod:`klbook_lib.rlhf.distributed`): each
process samples its share of the batch, statistics are combined over processes, gradients
averaged; ``--batch-size``, ``--minibatch-size`` and ``--eval-samples`` are global and must
be multiples of the number of processes. Rank 0 prints and writes ``--out``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

DEFAULT_LR = {"tiny": 3e-4, "small": 1e-4, "gpt2": 2e-5}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m klbook_lib.rlhf.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=None, choices=("tiny", "small", "gpt2"),
                    help="model and training sizes (default: small; gpt2 with --init-from)")
    ap.add_argument("--init-from", default=None, metavar="DIR",
                    help="start from a local Hugging Face GPT-2 directory (weights and tokenizer, offline)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (under torchrun: cuda or cpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--beta", type=float, default=0.05, help="fixed KL coefficient")
    ap.add_argument("--target-kl", type=float, default=None,
                    help="use the proportional controller with this per-sequence KL target instead")
    ap.add_argument("--steps", type=int, default=200, help="PPO iterations")
    ap.add_argument("--batch-size", type=int, default=256, help="prompts per iteration, over all processes")
    ap.add_argument("--minibatch-size", type=int, default=None,
                    help="responses per gradient step, over all processes (default: min(64, batch size))")
    ap.add_argument("--lr", type=float, default=None,
                    help="policy learning rate (default: 3e-4 tiny, 1e-4 small, 2e-5 gpt2)")
    ap.add_argument("--eval-samples", type=int, default=512)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--out", default=None, help="write the history and summary as JSON here (rank 0)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dist-timeout", type=float, default=1800.0,
                    help="seconds a process waits for the others in a collective call before it fails")
    return ap.parse_args(argv)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from klbook_lib.rlhf import distributed

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        return _error(f"--device {args.device} was requested but CUDA is not available on this machine "
                      f"(torch {torch.__version__}); use --device cpu --preset tiny on a CPU.")
    if args.steps < 1 or args.batch_size < 1 or args.eval_samples < 1:
        return _error("--steps, --batch-size and --eval-samples must be >= 1")
    if args.minibatch_size is None:
        args.minibatch_size = min(64, args.batch_size)
    if not 1 <= args.minibatch_size <= args.batch_size:
        return _error(f"--minibatch-size must lie in [1, --batch-size], got {args.minibatch_size}")
    if args.preset is None:
        args.preset = "gpt2" if args.init_from else "small"
    try:
        ctx = distributed.init("cuda" if args.device.startswith("cuda") and distributed.launched_by_torchrun()
                               else args.device, timeout_s=args.dist_timeout)
    except ValueError as err:
        return _error(str(err))
    try:
        if ctx is not None:
            for name in ("batch_size", "minibatch_size", "eval_samples"):
                try:
                    ctx.check_divisible("--" + name.replace("_", "-"), getattr(args, name))
                except ValueError as err:
                    return _error(f"rank {ctx.rank}: {err}")
        return _run(args, ctx)
    except torch.distributed.DistError as err:
        rank = ctx.rank if ctx is not None else 0
        return _error(f"rank {rank}: a collective call failed ({type(err).__name__}): another process "
                      f"failed (see its error) or did not answer within --dist-timeout "
                      f"{args.dist_timeout:g} s. {err}")
    finally:
        if ctx is not None:
            ctx.close()


def _run(args, ctx) -> int:
    import torch

    from klbook_lib.rlhf.pipeline import build_pipeline
    from klbook_lib.rlhf.ppo import PPOConfig, evaluate_policy, run_rlhf

    main_rank = ctx is None or ctx.is_main
    say = print if main_rank else (lambda *a, **k: None)
    torch.set_num_threads(args.threads)
    device = args.device if ctx is None else str(ctx.device)
    t0 = time.time()

    def build():
        return build_pipeline(args.preset, seed=args.seed, device=device, cache_dir=args.cache_dir,
                              progress=main_rank, init_from=args.init_from)

    if ctx is None:
        pipe = build()
    else:                       # one build per machine, then everyone loads it from the cache
        pipe = build() if ctx.local_rank == 0 else None
        ctx.barrier()
        if pipe is None:
            pipe = build()
    world = 1 if ctx is None else ctx.world_size
    say(pipe.summary(), f"({time.time() - t0:.0f} s)")
    if ctx is not None:
        say(f"data-parallel: {world} processes, backend {ctx.backend}, {args.batch_size // world} prompts each")
    controller = None
    if args.target_kl is not None:
        from klbook_lib.controllers import ProportionalKL
        controller = ProportionalKL(beta=args.beta, target=args.target_kl, horizon=10000)
    lr = args.lr if args.lr is not None else DEFAULT_LR[args.preset]
    cfg = PPOConfig(batch_size=args.batch_size, minibatch_size=args.minibatch_size, lr=lr, value_lr=3 * lr)
    before, ro_before = evaluate_policy(pipe, pipe.ref_model, n=args.eval_samples, seed=args.seed + 1, dist=ctx)
    t_train = time.time()
    res = run_rlhf(pipe, beta=args.beta, steps=args.steps, seed=args.seed, controller=controller, config=cfg,
                   progress=main_rank, dist=ctx)
    t_train = time.time() - t_train
    after, ro_after = evaluate_policy(pipe, res.policy, n=args.eval_samples, seed=args.seed + 1, dist=ctx)
    seconds = [row["seconds"] for row in res.history]
    timing = {"world_size": world, "seconds_train": t_train,
              "seconds_per_iteration_mean": statistics.fmean(seconds),
              "seconds_per_iteration_median": statistics.median(seconds),
              "seconds_per_iteration_after_first": statistics.fmean(seconds[1:]) if len(seconds) > 1 else None}
    keys = ("score", "true_reward", "kl_exact_seq", "k1_seq", "entropy_seq", "distinct_fraction", "response_length")
    say(f"{'':>18} {'pi_ref':>10} {'tuned':>10}")
    for k in keys:
        say(f"{k:>18} {before[k]:10.3f} {after[k]:10.3f}")
    for name, ro in (("pi_ref", ro_before), ("tuned", ro_after)):
        say(f"\nsamples from {name}:")
        for p, r in list(zip(ro.prompts, ro.responses))[:8]:
            say("  ", p + r)
    say(f"\n{args.steps} PPO iterations of {args.batch_size} prompts on {world} process(es): "
        f"{timing['seconds_per_iteration_median']:.3f} s per iteration (median)")
    if args.out and main_rank:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "before": before, "after": after, "history": res.history,
                       "pipeline_metrics": pipe.metrics, "timing": timing,
                       "backend": None if ctx is None else ctx.backend,
                       "device": device, "torch": torch.__version__}, f)
    say(f"\ntotal {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
