"""tools/fold_checks.py: which cells are verification bookkeeping, and the tag it adds;
_ext/klbook_reader.py: the fold it renders, alt texts that are never paths."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fold = _load("fold_checks_for_tests", ROOT / "tools" / "fold_checks.py")
sys.path.insert(0, str(ROOT / "_ext"))
reader = _load("klbook_reader_for_tests", ROOT / "_ext" / "klbook_reader.py")


def test_bookkeeping_fraction_counts_assert_and_glue_lines():
    assert fold.bookkeeping_fraction("assert x > 0\nglue('a', 1, display=False)\n") == 1.0
    mixed = "y = f(x)\nassert y > 0, (\n    'y must be positive')\n# a comment\n\nprint(y)\n"
    assert fold.bookkeeping_fraction(mixed) == pytest.approx(2 / 4)
    assert fold.bookkeeping_fraction("plt.plot(x)\nplt.show()\n") == 0.0
    assert fold.bookkeeping_fraction("%timeit f()\n") == 0.0  # a magic does not parse
    assert fold.bookkeeping_fraction("") == 0.0
    with pytest.raises(ValueError, match="source"):
        fold.bookkeeping_fraction(None)


def _nb(*sources, tags=None):
    return {"cells": [{"cell_type": "code", "source": s, "metadata": {"tags": list(tags or [])},
                       "outputs": []} for s in sources]
            + [{"cell_type": "markdown", "source": "assert x", "metadata": {}}]}


def test_tag_notebook_tags_only_mostly_bookkeeping_cells():
    nb = _nb("x = 1\ny = 2\nz = 3\n", "assert a\nassert b\nc = 1\n", ["glue('k', v)\n", "assert v\n"])
    assert fold.tag_notebook(nb, threshold=0.6) == [1, 2]
    assert nb["cells"][1]["metadata"]["tags"] == ["klbook-check"]
    assert nb["cells"][0]["metadata"]["tags"] == []
    assert fold.tag_notebook(nb) == [], "tagging twice adds nothing"
    hidden = _nb("assert a\n", tags=["hide-input"])
    assert fold.tag_notebook(hidden) == [] and hidden["cells"][0]["metadata"]["tags"] == ["hide-input"]
    with pytest.raises(ValueError, match="threshold"):
        fold.tag_notebook(_nb("assert a"), threshold=0)


def test_main_writes_the_tag_and_dry_run_does_not(tmp_path):
    import json

    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(_nb("assert a\n")))
    fold.main([str(path), "--dry-run"])
    assert json.loads(path.read_text())["cells"][0]["metadata"]["tags"] == []
    fold.main([str(path)])
    assert json.loads(path.read_text())["cells"][0]["metadata"]["tags"] == ["klbook-check"]


def test_fold_check_cells_sets_the_prompts():
    from docutils import nodes
    from docutils.utils import new_document
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser

    doc = new_document("t", get_default_settings(Parser))
    checked = nodes.container(nb_element="cell_code", classes=["cell", "tag_klbook-check"])
    plain = nodes.container(nb_element="cell_code", classes=["cell"])
    out_hidden = nodes.container(nb_element="cell_code", classes=["cell", "tag_klbook-check"], hide_mode="output")
    doc += [checked, plain, out_hidden]
    assert reader.fold_check_cells(doc) == 2
    assert checked["hide_mode"] == "input" and checked["prompt_show"] == "Show the check"
    assert "klbook-check" in checked["classes"]
    assert out_hidden["hide_mode"] == "input+output"
    assert "hide_mode" not in plain


@pytest.mark.parametrize("alt,uri,missing", [
    ("", "x.png", True), (None, "x.png", True), ("../_images/abc.png", "../_images/abc.png", True),
    ("_build/jupyter_execute/3f2a.png", "other", True), ("C:\\fig.png", None, True),
    ("KL against beta for three seeds", "x.png", False), ("k3 is unbiased", None, False),
])
def test_alt_is_missing(alt, uri, missing):
    assert reader.alt_is_missing(alt, uri) is missing


def test_set_alt_texts_uses_the_caption_or_the_section():
    from docutils import nodes
    from docutils.utils import new_document
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser

    doc = new_document("t", get_default_settings(Parser))
    section = nodes.section()
    section += nodes.title(text="Estimating KL")
    figure = nodes.figure()
    in_figure = nodes.image(uri="_build/jupyter_execute/a.png")
    figure += in_figure
    figure += nodes.caption(text="The bias of $k_1$ against $\\beta$ for $D_{\\mathrm{KL}}(p\\|q)$.")
    plot = nodes.image(uri="b.png", alt="b.png")
    kept = nodes.image(uri="c.png", alt="A hand-drawn sketch")
    section += [figure, plot, kept]
    doc += section
    assert reader.set_alt_texts(doc, "Chapter") == 2
    assert in_figure["alt"] == "The bias of k_1 against beta for D_KL(p||q)."
    assert "Estimating KL" in plot["alt"] and not reader.alt_is_missing(plot["alt"], "b.png")
    assert kept["alt"] == "A hand-drawn sketch"


def test_shorten():
    text = "word " * 100
    short = reader.shorten(text.strip(), 50)
    assert len(short) <= 50 and short.endswith("\u2026")
    with pytest.raises(ValueError, match="limit"):
        reader.shorten("x", 3)


def test_split_source_cuts_only_a_trailing_check_and_keeps_the_display():
    src = "x = f()\ny = g(x)\n# the claim\nassert y > 0\nglue('y', y, display=False)\n"
    assert fold.split_source(src) == ("x = f()\ny = g(x)", "# the claim\nassert y > 0\nglue('y', y, display=False)")
    # a bare expression before the check would start showing its value: not split
    assert fold.split_source("x = f()\nx\nassert x\n") is None
    assert fold.split_source("x = f()\nprint(x)\nassert x\n") == ("x = f()\nprint(x)", "assert x")
    assert fold.split_source("assert a\nglue('b', 1)\n") is None  # nothing would be left
    assert fold.split_source("x = 1\ny = 2\n") is None  # nothing to cut off
    assert fold.split_source("%time x = 1\nassert x\n") is None  # magics do not parse
    # an assert in the middle stays where it is (moving it could change what it checks)
    assert fold.split_source("x = [1]\nassert x\nx += [2]\nassert len(x) == 2\n") == (
        "x = [1]\nassert x\nx += [2]", "assert len(x) == 2")
    # a call's value might be shown (a method returning something): not split
    assert fold.split_source("x = [1]\nx.append(2)\nassert x\n") is None
    with pytest.raises(ValueError, match="source"):
        fold.split_source(None)


def test_split_notebook_runs_the_same_statements_in_the_same_order():
    src = "x = 1\nfor i in range(3):\n    x += i\nassert x == 4\nglue('x', x, display=False)\n"
    nb = _nb(src, "assert a\n", "y = 2\nassert y\n", tags=None)
    nb["cells"][2]["metadata"]["tags"] = ["hide-input"]  # left alone
    made = fold.split_notebook(nb)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert made == [1]
    assert code[0]["source"] + "\n" + code[1]["source"] == src.rstrip("\n")
    assert code[1]["metadata"]["tags"] == ["klbook-check"]
    ns: dict = {"glue": lambda *a, **k: None}
    exec("\n".join(c["source"] for c in code[:2]), ns)  # the two parts run as the cell did
    assert ns["x"] == 4
    assert code[3]["source"] == "y = 2\nassert y\n", "a hide-input cell is not split"


def test_fold_to_budget_folds_the_longest_cells_first_and_spares_klbook_show():
    long_src = "\n".join(f"x{i} = {i}" for i in range(40))
    nb = {"cells": [{"cell_type": "markdown", "source": "words " * 600, "metadata": {}},
                    {"cell_type": "code", "source": long_src, "metadata": {"tags": ["klbook-show"]}, "outputs": []},
                    {"cell_type": "code", "source": long_src[:200], "metadata": {}, "outputs": []},
                    {"cell_type": "code", "source": "y = 1", "metadata": {}, "outputs": []}]}
    before = fold.predicted_code_fraction(nb)
    folded = fold.fold_to_budget(nb, budget=0.3)
    assert folded == [2], "the longest cell not marked klbook-show goes first"
    assert nb["cells"][2]["metadata"]["tags"] == ["hide-input"]
    assert fold.predicted_code_fraction(nb) < before
    assert fold.fold_to_budget(nb, budget=0.99) == []
    # a cell that is mostly checks folds before a longer one that is not, and as a check
    import copy

    mixed = {"cells": [{"cell_type": "markdown", "source": "words " * 600, "metadata": {}},
                       {"cell_type": "code", "source": long_src, "metadata": {}, "outputs": []},
                       {"cell_type": "code", "source": "z = 1\nassert z\nassert z > 0", "metadata": {},
                        "outputs": []}]}
    only_check = copy.deepcopy(mixed)
    only_check["cells"][2]["metadata"]["tags"] = ["klbook-check"]
    assert fold.fold_to_budget(mixed, budget=fold.predicted_code_fraction(only_check) + 1e-9) == [2]
    assert mixed["cells"][2]["metadata"]["tags"] == ["klbook-check"]
    assert fold.fold_to_budget(mixed, budget=0.01) == [1]
    assert mixed["cells"][1]["metadata"]["tags"] == ["hide-input"]
    # a long cell with a single assert in it still folds as a check
    asserting = {"cells": [{"cell_type": "markdown", "source": "words", "metadata": {}},
                           {"cell_type": "code", "source": long_src + "\nassert x1 == 1", "metadata": {},
                            "outputs": []}]}
    assert fold.fold_to_budget(asserting, budget=0.01) == [1]
    assert asserting["cells"][1]["metadata"]["tags"] == ["klbook-check"]
    with pytest.raises(ValueError, match="budget"):
        fold.fold_to_budget(nb, budget=1.5)
