"""Glue the figures of chapter notebooks with ``kb.display.glue_figure`` (issue 24).

Replaces, in code cells, every call

    glue("fig-...", fig, display=False)

(a figure key, by the book's convention ``fig-``, any variable name, either quote) with

    kb.display.glue_figure("fig-...", fig)

where ``kb`` is whatever the notebook imports ``klbook_lib`` as (``import klbook_lib as
kb``); a notebook that imports ``from klbook_lib import display as D`` gets
``D.glue_figure``, one that imports ``from klbook_lib.display import glue_figure`` gets
``glue_figure``. A notebook that imports none of them is reported and left unchanged. The
markdown (the ``glue:figure`` directives) does not change: ``glue_figure`` glues the wide
rendering under the same key, and the phone rendering under ``KEY--phone``, which the
book's extension finds by itself (``_ext/klbook_reader.py``).

Only the source of code cells changes; outputs are left as they are (the notebooks are
committed without outputs). Running it twice changes nothing the second time.

Usage:
    .venv/bin/python tools/use_glue_figure.py CHAPTER.ipynb [...] [--dry-run]

Prints one line per replaced call and a summary per notebook; exits 1 when a notebook
glues figures but does not import ``klbook_lib``.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

CALL = re.compile(
    r"""(?<![\w.])glue\(\s*(?P<q>["'])(?P<key>fig-[^"']+)(?P=q)\s*,\s*(?P<var>[A-Za-z_][\w.]*)\s*,"""
    r"""\s*display\s*=\s*False\s*,?\s*\)""")
IMPORT_KB = re.compile(r"^\s*import\s+klbook_lib\s+as\s+(\w+)\s*$", re.M)
IMPORT_PLAIN = re.compile(r"^\s*import\s+klbook_lib\s*$", re.M)
IMPORT_DISPLAY = re.compile(r"^\s*from\s+klbook_lib\s+import\s+(?:.*,\s*)?display(?:\s+as\s+(\w+))?\b", re.M)
IMPORT_FUNCTION = re.compile(r"^\s*from\s+klbook_lib\.display\s+import\s+(?:.*,\s*)?glue_figure\b", re.M)


def glue_figure_name(sources: list[str]) -> str | None:
    """How the notebook's code can call ``glue_figure``, from its imports; ``None`` if it cannot."""
    code = "\n".join(sources)
    if m := IMPORT_KB.search(code):
        return f"{m.group(1)}.display.glue_figure"
    if m := IMPORT_DISPLAY.search(code):
        return f"{m.group(1) or 'display'}.glue_figure"
    if IMPORT_FUNCTION.search(code):
        return "glue_figure"
    if IMPORT_PLAIN.search(code):
        return "klbook_lib.display.glue_figure"
    return None


def replace_calls(source: str, function: str) -> tuple[str, list[str]]:
    """``source`` with each figure ``glue(..., display=False)`` call replaced; the keys replaced."""
    keys: list[str] = []

    def sub(m: re.Match) -> str:
        keys.append(m.group("key"))
        return f'{function}({m.group("q")}{m.group("key")}{m.group("q")}, {m.group("var")})'

    return CALL.sub(sub, source), keys


def convert(path: Path, dry_run: bool = False) -> tuple[list[str], str | None]:
    """Convert one notebook; return the keys replaced and an error (or ``None``)."""
    nb = nbformat.read(path, as_version=4)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    if not any(CALL.search(c.source) for c in code_cells):
        return [], None
    function = glue_figure_name([c.source for c in code_cells])
    if function is None:
        return [], f"{path}: glues figures but does not import klbook_lib (add `import klbook_lib as kb`)"
    keys: list[str] = []
    for cell in code_cells:
        cell.source, found = replace_calls(cell.source, function)
        keys += found
    if keys and not dry_run:
        nbformat.write(nb, path)
    return keys, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="only print what would change")
    args = ap.parse_args(argv)
    status = 0
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            print(f"{path}: not a notebook", file=sys.stderr)
            status = 1
            continue
        keys, error = convert(path, dry_run=args.dry_run)
        if error:
            print(error, file=sys.stderr)
            status = 1
            continue
        for key in keys:
            print(f"{path}: {key}")
        print(f"{path}: {len(keys)} figure(s) {'would be ' if args.dry_run else ''}glued with glue_figure")
    return status


if __name__ == "__main__":
    sys.exit(main())
