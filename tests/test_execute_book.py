"""tools/execute_book.py re-executes a notebook when what its outputs depend on changed.

A notebook's cached run is stale when its code changed (jupyter-cache's own key), or when a
library module it imports (transitively) or requirements.txt changed since that run: the hash
of those files is recorded with the run (conftest.py) and compared. Checked on a copy of the
library in a temporary folder, with a real jupyter-cache there; and ``make book`` stops on a
failing notebook (no leading ``-`` before the command).
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("execute_book_under_test", ROOT / "tools" / "execute_book.py")
eb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(eb)


def _notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a page")] + [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the two packages and requirements.txt, which the tests edit."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in eb.PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=ignore)
    shutil.copy2(ROOT / "requirements.txt", tmp_path / "requirements.txt")
    return tmp_path



def test_dependencies_follow_the_imports(tree):
    nb = _notebook(tree / "a.ipynb", "%matplotlib inline\nimport klbook_lib as kb\nfrom klbook_lib import runtime",
                   "x = kb.divergences.kl([0.5, 0.5], [0.9, 0.1])")
    deps = {f.relative_to(tree).as_posix() for f in eb.dependencies(nb, tree)}
    assert {"klbook_lib/__init__.py", "klbook_lib/divergences.py", "klbook_lib/runtime.py"} <= deps
    assert "klbook_lib/ppo.py" not in deps and not any(d.startswith("klbook_grader") for d in deps)
    # transitively: ppo imports envs (at the top of its file)
    nb2 = _notebook(tree / "b.ipynb", "from klbook_lib.ppo import PPOConfig")
    deps2 = {f.relative_to(tree).as_posix() for f in eb.dependencies(nb2, tree)}
    assert {"klbook_lib/ppo.py", "klbook_lib/envs.py", "klbook_lib/__init__.py"} <= deps2
    # a top-level name of klbook_lib/__init__.py counts the module it comes from
    nb3 = _notebook(tree / "c.ipynb", "import klbook_lib as kb\nkb.dpo_loss")
    assert tree / "klbook_lib" / "objectives.py" in eb.dependencies(nb3, tree)   # kb.dpo_loss lives there
    # the package used as a value: every file counts
    nb4 = _notebook(tree / "d.ipynb", "import klbook_lib as kb\nprint(dir(kb))")
    assert tree / "klbook_lib" / "ppo.py" in eb.dependencies(nb4, tree)
    # an exercise's checker: the grader's modules count too
    nb5 = _notebook(tree / "e.ipynb", "from klbook_grader import checker_for")
    assert tree / "klbook_grader" / "__init__.py" in eb.dependencies(nb5, tree)


def test_hash_changes_with_an_imported_module_and_requirements_only(tree):
    nb = _notebook(tree / "a.ipynb", "import klbook_lib as kb\nkb.divergences.kl([1.0], [1.0])")
    before = eb.deps_hash(nb, tree)
    assert eb.deps_hash(nb, tree) == before
    with (tree / "klbook_lib" / "ppo.py").open("a") as f:       # not imported by this page
        f.write("\n# an unrelated change\n")
    assert eb.deps_hash(nb, tree) == before
    with (tree / "klbook_lib" / "divergences.py").open("a") as f:
        f.write("\n# a change to a module the page imports\n")
    after_lib = eb.deps_hash(nb, tree)
    assert after_lib != before
    with (tree / "requirements.txt").open("a") as f:
        f.write("\n# a changed pin\n")
    assert eb.deps_hash(nb, tree) != after_lib


def test_stale_notebooks_reexecutes_on_a_library_change(tree):
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache_dir = tree / "cache"
    page = _notebook(tree / "page.ipynb", "import klbook_lib as kb\nkb.divergences.kl([1.0], [1.0])")
    other = _notebook(tree / "other.ipynb", "import klbook_lib as kb\nkb.stats")
    cache = get_cache(str(cache_dir))
    for nb in (page, other):
        executed = nbformat.read(nb, as_version=4)
        cache.cache_notebook_bundle(CacheBundleIn(executed, str(nb), data={eb.DEPS_KEY: eb.deps_hash(nb, tree)}),
                                    check_validity=False, overwrite=True)
    assert eb.stale_notebooks([page, other], cache_dir, tree) == []
    # the library changes under one page: that page (and only it) runs again, its old run gone
    with (tree / "klbook_lib" / "divergences.py").open("a") as f:
        f.write("\n# changed\n")
    assert eb.stale_notebooks([page, other], cache_dir, tree, remove=False) == [page]   # a dry run
    get_cache(str(cache_dir)).match_cache_notebook(nbformat.read(page, as_version=4))   # kept
    assert eb.stale_notebooks([page, other], cache_dir, tree) == [page]
    with pytest.raises(KeyError):
        get_cache(str(cache_dir)).match_cache_notebook(nbformat.read(page, as_version=4))
    # a run recorded without the hash (the book build's own) is stale as well
    executed = nbformat.read(other, as_version=4)
    get_cache(str(cache_dir)).cache_notebook_bundle(CacheBundleIn(executed, str(other), data={}),
                                                    check_validity=False, overwrite=True)
    assert eb.stale_notebooks([other], cache_dir, tree) == [other]
    # and a code change, as before
    _notebook(page, "import klbook_lib as kb\nkb.divergences.kl([0.5, 0.5], [0.5, 0.5])")
    assert eb.stale_notebooks([page], cache_dir, tree) == [page]


def test_conftest_records_the_same_hash():
    spec = importlib.util.spec_from_file_location("root_conftest_under_test", ROOT / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    nb = ROOT / "chapters" / "01_kl_definition.ipynb"
    assert conftest._deps_hash(str(nb)) == eb.deps_hash(nb)


def test_make_book_stops_on_a_failing_notebook(monkeypatch):
    recipe = (ROOT / "Makefile").read_text().split("\nbook: setup\n")[1].split("\n\n")[0]
    line = next(l for l in recipe.splitlines() if "tools/execute_book.py" in l)
    assert not line.lstrip("\t").startswith("-"), line          # make ignores nothing
    monkeypatch.setattr(eb, "stale_notebooks", lambda paths, remove=True: [ROOT / "chapters" / "01_kl_definition.ipynb"])
    monkeypatch.setattr(eb.subprocess, "call", lambda cmd, cwd: 1)
    assert eb.main(["--jobs", "1"]) == 1
    monkeypatch.setattr(eb.subprocess, "call", lambda cmd, cwd: 0)
    assert eb.main(["--jobs", "1"]) == 0
