"""Project-wide pytest hooks.

When nbval runs the book's notebooks, the outputs it collects are written into the
book's jupyter-cache (``_build/.jupyter_cache``), exactly as myst-nb would have cached
them. The book build that follows (execute_notebooks: cache) then finds every
notebook already executed and does not run it a second time. A notebook with any
failing cell is not cached, so the build would execute it again and fail loudly.

A cell that shows a matplotlib figure only as the text ``<Figure size ...>`` (no image;
glued figures included) fails here, and its notebook is not cached: the page would
show a grey box instead of the figure.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
CACHE_DIR = ROOT / "_build" / ".jupyter_cache"

_runs: dict[str, dict] = {}


def _site_module():
    """_ext/klbook_site.py (the book's Sphinx extension), loaded by path."""
    spec = importlib.util.spec_from_file_location("klbook_site_for_tests", ROOT / "_ext" / "klbook_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


text_only_figures = _site_module().text_only_figures


def _deps_hash(path: str) -> str:
    """What the notebook's outputs depend on besides its code (tools/execute_book.py's
    deps_hash: the library modules it imports, requirements.txt), recorded with its run."""
    spec = importlib.util.spec_from_file_location("klbook_execute_book", ROOT / "tools" / "execute_book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.deps_hash(Path(path))


def _is_nbval_cell(item) -> bool:
    return type(item).__name__ == "IPyNbCell" and hasattr(item, "cell")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if not _is_nbval_cell(item):
        yield
        return
    path = str(Path(str(item.fspath)).resolve())
    run = _runs.setdefault(path, {"nb": item.parent.nb, "outputs": {}, "failed": False,
                                  "start": time.time(), "end": None})
    outcome = yield
    outputs = getattr(item, "test_outputs", None) or []
    if outcome.excinfo is None:
        bad = text_only_figures({"cells": [{"cell_type": "code", "outputs": outputs}]})
        if bad:
            outcome.force_exception(AssertionError(
                "a figure is output as text only (" + bad[0].split(": ", 1)[1] + ") without an image: "
                "call kb.runtime.setup() before plotting (it selects the inline backend)"))
    if outcome.excinfo is not None:
        run["failed"] = True
    run["outputs"][id(item.cell)] = outputs
    run["end"] = time.time()


def pytest_sessionfinish(session, exitstatus):
    if not _runs or os.environ.get("KLBOOK_NO_NBCACHE"):
        return
    try:
        from jupyter_cache import get_cache
        from jupyter_cache.base import CacheBundleIn
    except ImportError:  # pragma: no cover - the book's requirements provide it
        return
    cache = get_cache(str(CACHE_DIR))
    for path, run in _runs.items():
        nb = run["nb"]
        code_cells = [c for c in nb.cells if c.cell_type == "code"]
        if run["failed"] or any(id(c) not in run["outputs"] for c in code_cells):
            continue
        executed = copy.deepcopy(nb)
        for cell, original in zip(executed.cells, nb.cells):
            if cell.cell_type == "code":
                cell.outputs = copy.deepcopy(run["outputs"][id(original)])
        seconds = (run["end"] or time.time()) - run["start"]
        for attempt in range(5):
            try:
                cache.cache_notebook_bundle(
                    CacheBundleIn(executed, path, data={"execution_seconds": seconds,
                                                        "klbook_deps": _deps_hash(path)}),
                    check_validity=False, overwrite=True,
                )
                break
            except Exception:  # sqlite busy when another worker writes
                time.sleep(1 + attempt)
