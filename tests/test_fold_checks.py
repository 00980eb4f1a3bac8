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
