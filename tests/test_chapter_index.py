"""The chapter-to-function index in AUTHORING.md is the one tools/chapter_index.py generates
from the chapters' code, and every function it names exists in the library."""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("chapter_index_under_test", ROOT / "tools" / "chapter_index.py")
ci = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci)


def test_authoring_md_holds_the_generated_index():
    text = (ROOT / "AUTHORING.md").read_text(encoding="utf-8")
    assert ci.current(text) == ci.section(), "stale: run python tools/chapter_index.py --write"
    assert ci.main(["--check"]) == 0


def test_every_indexed_function_exists():
    rows = [line for line in ci.table().splitlines()[2:]]
    chapters = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    assert len(rows) == len(chapters) and len(rows) >= 15
    for nb in chapters:
        for name in ci.chapter_functions(nb):
            module, _, attr = name.rpartition(".")
            assert hasattr(importlib.import_module(f"klbook_lib.{module}"), attr), (nb.name, name)


def test_the_reading_of_a_page(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%matplotlib inline\nimport klbook_lib as kb\n"
                                          "from klbook_lib.rlhf import rewards as R\nE = kb.estimators"),
                nbformat.v4.new_code_cell("kb.kl([0.5, 0.5], [0.9, 0.1])\nE.k3(a, b)\nR.kl_per_token(x, y)\n"
                                          "kb.ppo.PPOConfig(total_timesteps=1)")]
    path = tmp_path / "01_x.ipynb"
    nbformat.write(nb, path)
    assert ci.chapter_functions(path) == ["divergences.kl", "estimators.k3", "ppo.PPOConfig",
                                          "rlhf.rewards.kl_per_token"]
