"""The book's structure: every notebook is in the table of contents and is executed.

These tests read files only; they do not execute notebooks (nbval and the book build
do that in `make test`).
"""
from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
import yaml

from booktools import EXCLUDED_DIRS, ROOT, disk_notebooks, toc_files, toc_notebooks


def test_every_toc_entry_exists():
    missing = [f for f in toc_files()
               if not any((ROOT / f"{f}{ext}").exists() for ext in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml names files that do not exist: {missing}"


def test_every_notebook_on_disk_is_in_toc_or_explicitly_excluded():
    listed = {ROOT / f"{f}.ipynb" for f in toc_files()}
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    for d in EXCLUDED_DIRS:
        assert f"{d}/*" in config["exclude_patterns"], f"{d} must be excluded in _config.yml"
    stray = [str(p.relative_to(ROOT)) for p in disk_notebooks()
             if p not in listed and not any(str(p.relative_to(ROOT)).startswith(d) for d in EXCLUDED_DIRS)]
    assert not stray, f"notebooks neither in _toc.yml nor excluded: {stray}"


def test_nbval_collects_every_notebook_in_toc():
    """`make test-notebooks` passes exactly the Makefile's NOTEBOOKS list to nbval:
    collect it the same way and check that no notebook of the book is skipped."""
    listed = subprocess.run(["make", "-s", "--no-print-directory", "print-notebooks"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert listed, "the Makefile lists no notebooks"
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--nbval-lax",
                          "-p", "no:cacheprovider", *listed],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    for nb in toc_notebooks():
        rel = str(nb.relative_to(ROOT))
        assert rel in collected, f"{rel} is in _toc.yml but nbval did not collect it"
    for nb in disk_notebooks():
        rel = str(nb.relative_to(ROOT))
        assert rel in collected, f"{rel} is on disk but nbval would not run it"


@pytest.mark.parametrize("nb_path", disk_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_notebooks_are_committed_clean(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} carry outputs: run tools/strip_outputs.py {nb_path.name}"
    assert nb.cells and nb.cells[0].cell_type == "markdown" and nb.cells[0].source.lstrip().startswith("# "), \
        "the first cell must be a markdown title"
