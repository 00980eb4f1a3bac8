"""Tag the verification cells of a notebook ``klbook-check`` (they render folded).

A code cell whose lines are mostly bookkeeping (``assert`` statements and ``glue(``
calls, with their continuation lines) proves a claim of the text rather than showing the
idea; ``_ext/klbook_reader.py`` shows such a cell with its source behind a "Show the
check" toggle. This script only adds the tag: it never splits or edits a cell, and it
leaves cells already tagged ``hide-input``/``remove-input`` alone.

Usage:
    .venv/bin/python tools/fold_checks.py NOTEBOOK.ipynb [...] [--threshold 0.6] [--dry-run]

Prints one line per tagged cell. Run it on a notebook without outputs (AUTHORING.md).
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

TAG = "klbook-check"
LEAVE_ALONE = {"hide-input", "remove-input", "remove_input", "hide-cell", "remove-cell", TAG}


def _is_bookkeeping(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Assert):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in ("glue", "assert_better", "assert_no_difference") or name.startswith("assert")
    return False


def bookkeeping_fraction(source: str) -> float:
    """Fraction of the non-blank, non-comment lines of ``source`` in ``assert``/``glue(`` statements.

    Each top-level statement counts with all its lines (a multi-line ``assert`` counts
    every line). Source that does not parse (IPython magics) counts as 0.
    """
    if not isinstance(source, str):
        raise ValueError(f"source: expected a str, got {type(source).__name__}")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return 0.0
    lines = source.splitlines()
    code_lines = {i for i, line in enumerate(lines, 1)
                  if line.strip() and not line.strip().startswith("#")}
    if not code_lines:
        return 0.0
    booked = set()
    for stmt in tree.body:
        if _is_bookkeeping(stmt):
            booked |= set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)) & code_lines
    return len(booked) / len(code_lines)


def tag_notebook(nb: dict, threshold: float = 0.6) -> list[int]:
    """Tag ``klbook-check`` every code cell whose bookkeeping fraction is at least ``threshold``.

    Changes ``nb`` in place; returns the indices of the cells tagged now.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold: expected a fraction in (0, 1], got {threshold}")
    tagged = []
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if set(tags) & LEAVE_ALONE:
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        if bookkeeping_fraction(source) >= threshold:
            tags.append(TAG)
            tagged.append(index)
    return tagged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--threshold", type=float, default=0.6,
                    help="tag a cell when at least this fraction of its lines are assert/glue (default 0.6)")
    ap.add_argument("--dry-run", action="store_true", help="only list the cells")
    args = ap.parse_args(argv)
    for path in args.notebooks:
        nb = json.loads(path.read_text(encoding="utf-8"))
        tagged = tag_notebook(nb, args.threshold)
        for i in tagged:
            print(f"{path}: cell {i} tagged {TAG}")
        if tagged and not args.dry_run:
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
