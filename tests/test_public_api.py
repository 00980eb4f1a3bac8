"""The small public API in klbook_lib/__init__.py resolves to the documented functions."""
import ast
from pathlib import Path

import numpy as np
import pytest

import klbook_lib as kb


def test_top_level_names_are_the_module_functions():
    assert kb.kl is kb.divergences.kl
    assert kb.k3 is kb.estimators.k3
    assert kb.dpo_loss is kb.dpo.dpo_loss
    assert kb.optimal_policy is kb.optimal.optimal_policy
    assert float(kb.kl(np.array([0.5, 0.5]), np.array([0.5, 0.5]))) == 0.0


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kb.nope


def _modules() -> set[str]:
    """The top-level modules and packages of klbook_lib, from its folder."""
    lib = Path(kb.__file__).parent
    return ({p.stem for p in lib.glob("*.py") if p.stem != "__init__"}
            | {p.parent.name for p in lib.glob("*/__init__.py")})


def test_module_map_lists_every_module():
    """The root docstring's map and the lazily imported submodules name every module."""
    listed = {line.split()[0] for line in kb.__doc__.splitlines()
              if line.startswith("    ") and line.split() and line.split()[0].isidentifier()}
    assert _modules() - listed == set(), "modules missing from klbook_lib's docstring"
    assert listed - _modules() == set(), "the docstring lists modules that do not exist"
    assert set(dir(kb)) >= _modules()                      # the lazy imports offer each of them
    for name in sorted(_modules()):
        assert getattr(kb, name).__name__ == f"klbook_lib.{name}"


def test_the_grader_is_not_part_of_the_library():
    """klbook_lib holds what the chapters teach: the grader is klbook_grader, beside it, and no
    library module imports it (the readers' wheel holds klbook_lib alone, tests/test_publish.py)."""
    for name in ("grading", "tasks", "cli"):
        with pytest.raises(AttributeError, match=f"no attribute '{name}'"):
            getattr(kb, name)
    lib = Path(kb.__file__).parent
    importers = [f"{f.relative_to(lib)}:{line}" for f in sorted(lib.rglob("*.py"))
                 for line in _imports_of(f, "klbook_grader")]
    assert importers == []
    # the control: the same scan sees the grader's tasks import the library
    import klbook_grader.tasks.token_trainer as tt
    assert _imports_of(Path(tt.__file__), "klbook_lib")


def _imports_of(path: Path, package: str) -> list[int]:
    """Lines of ``path`` that import ``package`` or one of its modules."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n.split(".")[0] == package for n in names):
            lines.append(node.lineno)
    return lines
