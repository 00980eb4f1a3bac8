"""Execute the book's notebooks that the jupyter-cache lacks or holds stale, several at a time.

``make book`` calls this before ``jupyter-book build``: a notebook runs again when its code
is not in ``_build/.jupyter_cache`` (new, edited, or never run), or when what it depends on
changed since its cached run: the library modules it imports (``klbook_lib`` and
``klbook_grader``, followed transitively through their imports, see :func:`dependencies`)
or ``requirements.txt``. A cached run records the hash of those files (:func:`deps_hash`,
stored in the record's data by conftest.py); a run without it, or with another one, is
removed from the cache before the notebook runs again, so the build can never serve its old
outputs. The notebooks are executed by nbval under pytest-xdist, ``--jobs`` at a time (one
torch thread each), and conftest.py writes each notebook that ran without an error into the
cache exactly as myst-nb would have. The book build that follows then finds every page
executed and runs nothing itself. A failing notebook makes this command (and ``make book``)
fail.

Heavier notebooks start first (chapters before exercises, each group by the time its
last cached run took, when one is known), so that two workers finish together.

Usage: python tools/execute_book.py [--jobs N] [--dry-run]
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = ROOT / "_build" / ".jupyter_cache"
# the notebooks the book shows (exercises/masters/ is excluded from the book in _config.yml)
BOOK_GLOBS = ("chapters/*.ipynb", "exercises/*.ipynb")
# the packages whose code a notebook's outputs depend on, and the pinned environment
PACKAGES = ("klbook_lib", "klbook_grader")
REQUIREMENTS = "requirements.txt"
DEPS_KEY = "klbook_deps"           # the key of the hash in a cache record's data


def book_notebooks() -> list[Path]:
    return [p for g in BOOK_GLOBS for p in sorted(ROOT.glob(g))]


# ------------------------------------------------------------------ what a notebook depends on
def _module_file(name: str, root: Path) -> Path | None:
    """The file of a module of :data:`PACKAGES` (a package's ``__init__.py``), else ``None``."""
    parts = name.split(".")
    if parts[0] not in PACKAGES or not all(p.isidentifier() for p in parts):
        return None
    base = root.joinpath(*parts)
    for f in (base / "__init__.py", base.with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _imported(tree: ast.AST, package: str) -> tuple[set[str], bool]:
    """Modules of :data:`PACKAGES` that the code ``tree`` imports (``package``: the dotted
    package the code sits in, for relative imports; ``""`` for a notebook), and whether it
    uses a package in a way no static reading can follow (an alias of ``klbook_lib`` passed
    around as a value, ``importlib``): then the whole of every package counts."""
    found: set[str] = set()
    aliases: dict[str, str] = {}           # local name -> module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found.add(a.name)
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            for a in node.names:
                found.add(f"{base}.{a.name}")
                aliases[a.asname or a.name] = f"{base}.{a.name}"
    for _ in range(2):                    # E = kb.estimators: E is an alias of that module too
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Attribute)):
                chain, value = [], node.value
                while isinstance(value, ast.Attribute):
                    chain.insert(0, value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    aliases.setdefault(node.targets[0].id, ".".join([aliases[value.id], *chain]))
    dynamic = False
    attribute_values = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):     # kb.ppo.train -> klbook_lib.ppo, klbook_lib.ppo.train
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                module = aliases[value.id]
                for attr in chain:
                    module = f"{module}.{attr}"
                    found.add(module)
        elif isinstance(node, ast.Name) and node.id in aliases and id(node) not in attribute_values:
            dynamic |= aliases[node.id] in PACKAGES     # the package itself used as a value
        elif isinstance(node, ast.Name) and node.id == "importlib":
            dynamic = True
    return {m for m in found if m.split(".")[0] in PACKAGES}, dynamic


def _parse(src: str) -> ast.AST:
    """A notebook cell's code without IPython's magics and shell lines."""
    lines = [line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return ast.parse("")


def dependencies(notebook: Path, root: Path = ROOT) -> list[Path]:
    """The files of :data:`PACKAGES` whose code a run of ``notebook`` can execute: the modules
    its code cells import (``import klbook_lib as kb`` with ``kb.ppo.train(...)`` counts
    ``klbook_lib.ppo``; the top-level names of ``klbook_lib/__init__.py``, such as ``kb.kl``,
    count their module), every package ``__init__.py`` above them, and, transitively, the
    modules those import (at any depth of their code, functions included). A notebook that
    uses a package in a way this cannot follow depends on all of it."""
    nb = nbformat.read(notebook, as_version=4)
    code = ast.Module(body=[node for cell in nb.cells if cell.cell_type == "code"
                            for node in _parse(cell.source).body], type_ignores=[])
    names, dynamic = _imported(code, "")      # one module: an alias bound in one cell, used in the next
    if dynamic:
        return sorted(f for pkg in PACKAGES for f in (root / pkg).rglob("*.py") if "__pycache__" not in f.parts)
    files: set[Path] = set()
    reexports = _reexports(root)
    todo = sorted(names)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        for k in range(1, len(parts)):                  # the packages above it run first
            todo.append(".".join(parts[:k]))
        f = _module_file(name, root)
        if f is None:                   # a name, not a module: kb.kl is divergences.kl
            if name in reexports:
                todo.append(reexports[name])
            continue
        files.add(f)
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        found, _ = _imported(ast.parse(f.read_text(encoding="utf-8")), package)
        todo += sorted(found - seen)
    return sorted(files)


def _reexports(root: Path) -> dict[str, str]:
    """The top-level names a package's ``__init__`` loads lazily from a submodule (its
    ``_NAMES`` table: ``klbook_lib.kl`` -> ``klbook_lib.divergences``)."""
    out = {}
    for pkg in PACKAGES:
        init = root / pkg / "__init__.py"
        if not init.is_file():
            continue
        for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_NAMES"
                                                     for t in node.targets)
                    and isinstance(node.value, ast.Dict)):
                for k, v in zip(node.value.keys, node.value.values):
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                        out[f"{pkg}.{k.value}"] = f"{pkg}.{v.value}"
    return out


def deps_hash(notebook: Path, root: Path = ROOT) -> str:
    """SHA-256 of what a run of ``notebook`` depends on besides its own code: the contents of
    :func:`dependencies` (with their paths) and of ``requirements.txt``."""
    h = hashlib.sha256()
    for f in dependencies(notebook, root) + [root / REQUIREMENTS]:
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes() if f.is_file() else b"(missing)")
        h.update(b"\0")
    return h.hexdigest()


# ------------------------------------------------------------------ the cache
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


def stale_notebooks(paths: list[Path], cache_dir: Path = CACHE_DIR, root: Path = ROOT,
                    remove: bool = True) -> list[Path]:
    """The notebooks of ``paths`` whose current code has no cached run, or whose cached run
    was made with other library code or requirements (another :func:`deps_hash`, or none
    recorded), heaviest first. The cached run of the second kind is removed from the cache
    (unless not ``remove``: a dry run changes nothing)."""
    from jupyter_cache import get_cache

    cache = get_cache(str(cache_dir))
    stale = []
    for path in paths:
        try:
            record = cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            stale.append(path)
            continue
        if (record.data or {}).get(DEPS_KEY) != deps_hash(path, root):
            if remove:
                cache.remove_cache(record.pk)
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
    todo = stale_notebooks(book_notebooks(), remove=not args.dry_run)
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
        print("execute_book: a notebook failed (above): it is not in the cache and the book "
              "is not built", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
