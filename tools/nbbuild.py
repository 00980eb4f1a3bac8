"""Build a clean .ipynb from a simple text source (used by authors; optional).

Source format: cells separated by lines `# %% [markdown]` or `# %%` (jupytext "percent"
style). Markdown cells are written as plain markdown (no comment prefix).

Usage: python tools/nbbuild.py SOURCE.py OUT.ipynb
"""
from __future__ import annotations

import re
import sys

import nbformat


def build(src: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    parts = re.split(r"^# %%( \[markdown\])?[ \t]*\n", src, flags=re.M)
    # parts: [preamble, flag, body, flag, body, ...]
    for flag, body in zip(parts[1::2], parts[2::2]):
        body = body.strip("\n")
        if not body.strip():
            continue
        if flag:
            nb.cells.append(nbformat.v4.new_markdown_cell(body))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(body))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:03d}"
    return nb


if __name__ == "__main__":
    source, out = sys.argv[1], sys.argv[2]
    nbformat.write(build(open(source).read()), out)
    print("wrote", out)
