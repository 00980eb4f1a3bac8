"""Execute the book's notebooks that the jupyter-cache lacks, several at a time.

``make book`` calls this before ``jupyter-book build``: the notebooks whose code is not
in ``_build/.jupyter_cache`` (new, edited, or never run) are executed by nbval under
pytest-xdist, ``--jobs`` at a time (one torch thread each), and conftest.py writes each
notebook that ran without an error into the cache exactly as myst-nb would have. The
book build that follows then finds every page executed and runs nothing itself.

Heavier notebooks start first (chapters before exercises, each group by the time its
last cached run took, when one is known), so that two workers finish together.

Usage: python tools/execute_book.py [--jobs N] [--dry-run]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = ROOT / "_build" / ".jupyter_cache"
# the notebooks the book shows (exercises/masters/ is excluded from the book in _config.yml)
BOOK_GLOBS = ("chapters/*.ipynb", "exercises/*.ipynb")


def book_notebooks() -> list[Path]:
    return [p for g in BOOK_GLOBS for p in sorted(ROOT.glob(g))]


def _last_seconds(cache) -> dict[str, float]:
    """Execution seconds of each notebook's newest cached run (any version of its code)."""
    seconds: dict[str, tuple] = {}
    for rec in cache.list_cache_records():
        data = rec.data or {}
        if "execution_seconds" in data:
            key = str(Path(rec.uri).resolve())
            if key not in seconds or rec.created > seconds[key][0]:
                seconds[key] = (rec.created, float(data["execution_seconds"]))
    return {k: v[1] for k, v in seconds.items()}


def stale_notebooks(paths: list[Path]) -> list[Path]:
    """The notebooks of ``paths`` whose current code has no cached run, heaviest first."""
    from jupyter_cache import get_cache

    cache = get_cache(str(CACHE_DIR))
    stale = []
    for path in paths:
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            stale.append(path)
    known = _last_seconds(cache)
    # chapters before exercises; within each, longest known run first (unknown: first of all)
    return sorted(stale, key=lambda p: (not p.parent.name == "chapters",
                                        -known.get(str(p.resolve()), float("inf"))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")),
                        help="notebooks executed at the same time (default 2)")
    parser.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    CACHE_DIR.parent.mkdir(parents=True, exist_ok=True)
    todo = stale_notebooks(book_notebooks())
    if not todo:
        print("execute_book: every notebook of the book is in the cache; nothing to run")
        return 0
    print(f"execute_book: {len(todo)} notebook(s) to execute, {args.jobs} at a time:")
    for p in todo:
        print("   ", p.relative_to(ROOT))
    if args.dry_run:
        return 0
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
           "--nbval-cell-timeout=900"]
    if args.jobs > 1 and len(todo) > 1:
        cmd += ["-n", str(min(args.jobs, len(todo))), "--dist", "loadfile"]
    cmd += [str(p.relative_to(ROOT)) for p in todo]
    rc = subprocess.call(cmd, cwd=ROOT)
    if rc != 0:
        print("execute_book: a notebook failed (above); the book build will execute it again "
              "and report the failing cell", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
