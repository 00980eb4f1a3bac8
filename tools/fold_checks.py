"""Tag the verification cells of a notebook ``klbook-check`` (they render folded).

A code cell whose lines are mostly bookkeeping (``assert`` statements and ``glue(``
calls, with their continuation lines) proves a claim of the text rather than showing the
idea; ``_ext/klbook_reader.py`` shows such a cell with its source behind a "Show the
check" toggle. By default this script only adds the tag, and it leaves cells already
tagged ``hide-input``/``remove-input`` alone.

With ``--split`` it first splits a cell whose *last* statements are bookkeeping into the
idea (the cell as it was, without them) and a check cell after it (those statements,
tagged): the kernel runs the same statements in the same order, so nothing computed
changes. A cell is split only when the display cannot change either: the statement that
ends the first part is not a bare expression (whose value the notebook would then show),
apart from a ``print(...)``/``display(...)`` call.

With ``--budget F`` it then folds (``hide-input``: the reader opens them with "Show code
cell source") the longest visible code cells until the visible code is predicted to be at
most the fraction ``F`` of the page's height at 1366 px. The prediction is a model
calibrated on the book's pages in Chromium (tests/test_browser.py measures the real
fraction): 18.5 px per code line against 0.357 px per Markdown character, 506 px per
figure and toggle, 1543 px per page (residuals within 13 %). A cell tagged ``klbook-show``
always stays visible.

Usage:
    .venv/bin/python tools/fold_checks.py NOTEBOOK.ipynb [...] [--split] [--budget 0.2]
        [--threshold 0.6] [--dry-run]

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
        return name in ("glue", "assert_better", "assert_prob_better", "assert_no_difference") or name.startswith("assert")
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
        source = _source(cell)
        if bookkeeping_fraction(source) >= threshold:
            tags.append(TAG)
            tagged.append(index)
    return tagged


def _shows_nothing(stmt: ast.stmt) -> bool:
    """True when ``stmt``, as a cell's last statement, adds no displayed value."""
    if not isinstance(stmt, ast.Expr):
        return True
    call = stmt.value
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
            and call.func.id in ("print", "display"))


def split_source(source: str) -> tuple[str, str] | None:
    """``(idea, check)``: ``source`` cut before its trailing bookkeeping statements, or None.

    The comment lines directly above the first trailing statement go with the check.
    None when there is nothing to cut off, nothing would be left, the source does not
    parse, or the first part would end in an expression whose value the cell would show.
    """
    if not isinstance(source, str):
        raise ValueError(f"source: expected a str, got {type(source).__name__}")
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    k = len(body)
    while k > 0 and _is_bookkeeping(body[k - 1]):
        k -= 1
    if k == 0 or k == len(body) or not _shows_nothing(body[k - 1]):
        return None
    lines = source.splitlines()
    cut = body[k].lineno - 1  # 0-based first line of the check
    while cut > body[k - 1].end_lineno and lines[cut - 1].strip().startswith("#"):
        cut -= 1
    idea = "\n".join(lines[:cut]).rstrip()
    check = "\n".join(lines[cut:]).strip("\n")
    if not idea or not check:
        return None
    return idea, check


def split_notebook(nb: dict) -> list[int]:
    """Split every visible code cell that :func:`split_source` cuts; tag the check cells.

    Changes ``nb`` in place (outputs of a split cell are dropped: run the notebook again);
    returns the indices, in the new notebook, of the check cells made.
    """
    made, cells = [], []
    for cell in nb.get("cells", []):
        cells.append(cell)
        if cell.get("cell_type") != "code":
            continue
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if set(tags) & LEAVE_ALONE:
            continue
        source = _source(cell)
        parts = split_source(source)
        if parts is None:
            continue
        cell["source"], cell["outputs"], cell["execution_count"] = parts[0], [], None
        check = {"cell_type": "code", "execution_count": None, "outputs": [], "source": parts[1],
                 "metadata": {"tags": [TAG]}}
        if "id" in cell:
            check["id"] = f"{cell['id']}-check"[:64]
        cells.append(check)
        made.append(len(cells) - 1)
    nb["cells"] = cells
    return made


# the page-height model of --budget (px at 1366 px; fitted on chapters 1-13 in Chromium)
PX_PER_CODE_LINE = 18.5
PX_PER_MARKDOWN_CHAR = 0.357
PX_PER_FIGURE_OR_FOLD = 506.0
PX_PER_PAGE = 1543.0
SHOW_TAG = "klbook-show"
FOLD_TAG = "hide-input"


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _visible(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and not set(cell.get("metadata", {}).get("tags", [])) & LEAVE_ALONE


def predicted_code_fraction(nb: dict) -> float:
    """The page-height model's visible-code fraction of ``nb`` at 1366 px."""
    cells = nb.get("cells", [])
    code = PX_PER_CODE_LINE * sum(len(_source(c).splitlines()) for c in cells if _visible(c))
    md = sum(len(_source(c)) for c in cells if c.get("cell_type") == "markdown")
    figures = sum(_source(c).count("{glue:figure}") for c in cells if c.get("cell_type") == "markdown")
    folds = sum(1 for c in cells if c.get("cell_type") == "code" and not _visible(c))
    rest = PX_PER_MARKDOWN_CHAR * md + PX_PER_FIGURE_OR_FOLD * (figures + folds) + PX_PER_PAGE
    return code / (code + rest)


def _asserts(source: str) -> bool:
    try:
        return any(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(source)))
    except SyntaxError:
        return False


def fold_to_budget(nb: dict, budget: float = 0.2) -> list[int]:
    """Fold visible code cells until :func:`predicted_code_fraction` <= ``budget``.

    The cells that are most bookkeeping go first, then the longest. A cell that asserts
    anything, or is at least a third assert/glue lines, is folded as a check
    (``klbook-check``: "Show the check"), any other as ``hide-input``. Changes
    ``nb`` in place; returns the indices of the cells folded. Cells tagged ``klbook-show``
    are never folded.
    """
    if not 0 < budget < 1:
        raise ValueError(f"budget: expected a fraction in (0, 1), got {budget}")
    cells = nb.get("cells", [])
    order = sorted((i for i, c in enumerate(cells)
                    if _visible(c) and SHOW_TAG not in c.get("metadata", {}).get("tags", [])),
                   key=lambda i: (-min(bookkeeping_fraction(_source(cells[i])), 1 / 3),
                                  -len(_source(cells[i]).splitlines())))
    folded = []
    for i in order:
        if predicted_code_fraction(nb) <= budget:
            break
        src = _source(cells[i])
        # a cell that asserts a claim folds as a check (its toggle says so), never hide-input
        checks = bookkeeping_fraction(src) >= 1 / 3 or _asserts(src)
        cells[i].setdefault("metadata", {}).setdefault("tags", []).append(TAG if checks else FOLD_TAG)
        folded.append(i)
    return sorted(folded)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--threshold", type=float, default=0.6,
                    help="tag a cell when at least this fraction of its lines are assert/glue (default 0.6)")
    ap.add_argument("--split", action="store_true",
                    help="first split trailing assert/glue statements off into check cells")
    ap.add_argument("--budget", type=float, default=None,
                    help="then fold the longest code cells until visible code is predicted <= this fraction")
    ap.add_argument("--dry-run", action="store_true", help="only list the cells")
    args = ap.parse_args(argv)
    for path in args.notebooks:
        nb = json.loads(path.read_text(encoding="utf-8"))
        split = split_notebook(nb) if args.split else []
        for i in split:
            print(f"{path}: check cell {i} split off")
        tagged = tag_notebook(nb, args.threshold)
        for i in tagged:
            print(f"{path}: cell {i} tagged {TAG}")
        folded = fold_to_budget(nb, args.budget) if args.budget is not None else []
        for i in folded:
            print(f"{path}: cell {i} folded ({FOLD_TAG})")
        if args.budget is not None:
            print(f"{path}: predicted visible code {100 * predicted_code_fraction(nb):.1f} %")
        if (tagged or split or folded) and not args.dry_run:
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
