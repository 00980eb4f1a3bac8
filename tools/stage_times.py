"""Time the stages of ``make test`` and print them as a table at the end.

    python tools/stage_times.py run NAME -- CMD [ARG ...]   # run CMD, record NAME's wall time
    python tools/stage_times.py report [--budget MIN]       # the table of every recorded stage
    python tools/stage_times.py reset                        # forget the recorded stages

Each ``run`` appends one line (name, start, end, seconds, exit status) to the file named by
``KLBOOK_TIMES`` (default ``_build/test-times.tsv``) and exits with CMD's status. Stages that
ran side by side (``make -j2``) overlap in time: the report gives each stage's own wall time
and the wall time of the whole run (first start to last end), which is what the budget in the
README counts.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMES = Path(os.environ.get("KLBOOK_TIMES") or ROOT / "_build" / "test-times.tsv")


def _fmt(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s"


def run(name: str, cmd: list[str]) -> int:
    if not cmd:
        raise SystemExit("stage_times run: no command given after --")
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    rc = subprocess.call(cmd)
    end = time.time()
    with TIMES.open("a") as f:
        f.write(f"{name}\t{start:.1f}\t{end:.1f}\t{end - start:.1f}\t{rc}\n")
    return rc


def read() -> list[tuple[str, float, float, float, int]]:
    if not TIMES.exists():
        return []
    rows = []
    for line in TIMES.read_text().splitlines():
        name, start, end, secs, rc = line.split("\t")
        rows.append((name, float(start), float(end), float(secs), int(rc)))
    return rows


def report(budget_min: float | None) -> int:
    rows = read()
    if not rows:
        print("stage_times: no stage recorded")
        return 0
    width = max(len(r[0]) for r in rows)
    t0 = min(r[1] for r in rows)
    print("\nStage timings of this run (wall clock; stages that overlap ran side by side):")
    for name, start, end, secs, rc in rows:
        mark = "" if rc == 0 else f"  FAILED (exit {rc})"
        print(f"  {name:<{width}}  {_fmt(secs):>12}   from +{_fmt(start - t0)}{mark}")
    total = max(r[2] for r in rows) - t0
    line = f"  {'all stages':<{width}}  {_fmt(total):>12}"
    if budget_min is not None:
        line += f"   (budget {budget_min:g} min: {'within' if total <= 60 * budget_min else 'OVER'})"
    print(line)
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "report", "reset"):
        raise SystemExit(__doc__)
    if argv[0] == "reset":
        TIMES.unlink(missing_ok=True)
        return 0
    if argv[0] == "report":
        budget = None
        if "--budget" in argv:
            try:
                budget = float(argv[argv.index("--budget") + 1])
            except (IndexError, ValueError):
                raise SystemExit("stage_times report: --budget needs a number of minutes")
        return report(budget)
    if len(argv) < 3 or argv[2] != "--":
        raise SystemExit("usage: stage_times.py run NAME -- CMD [ARG ...]")
    return run(argv[1], argv[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
