"""klbook_lib.display: tables for reading."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from klbook_lib.display import format_number, table


@settings(derandomize=True, max_examples=300)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12),
       st.integers(min_value=1, max_value=6))
def test_format_number_keeps_the_value_to_its_digits(x, digits):
    text = format_number(x, digits)
    assert not (text.startswith("-") and float(text) == 0), text
    # the printed value is x rounded to `digits` significant digits, as Python's %g rounds it
    assert float(text) == float(f"{x:.{digits}g}"), (x, digits, text)


def test_negative_zero_and_integers():
    assert format_number(-1e-9, 3) == "-1.00e-09"
    assert format_number(-0.0) == "0"
    assert format_number(np.int64(7)) == "7"
    assert format_number("label") == "label"
    with pytest.raises(ValueError, match="digits"):
        format_number(1.0, 0)


def test_table_hides_the_index_and_formats_columns():
    df = pd.DataFrame({"estimator": ["k1", "k3"], "bias": [-0.00001234, 0.5], "n": [10, 20]},
                      index=[7, 8])
    html = table(df, digits={"bias": 2}).to_html()
    assert ">7<" not in html and ">8<" not in html          # no index column
    assert "-1.2e-05" in html and "0.50" in html and ">10<" in html
    assert ">7<" in table(df, index=True).to_html()
    with pytest.raises(ValueError, match="digits"):
        table(df, digits={"nope": 2})
    with pytest.raises(ValueError, match="df"):
        table([1, 2])


# ------------------------------------------------------------------ figures for phones
import base64
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import nbformat

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from klbook_lib import display  # noqa: E402
from klbook_lib.display import (glue_figure, phone_key, phone_layout, png_info, text_fontsize_pt,  # noqa: E402
                                tick_fontsize_pt)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _boxes(fig):
    return [ax.get_position() for ax in fig.axes]


def _two_panels(**kw):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), **kw)
    for k, ax in enumerate(axes):
        ax.plot([0, 1, 2], [k, k + 1, k + 3], label=f"line {k}")
        ax.set_title(f"panel {k}")
        ax.legend()
    axes[0].set_ylabel("value")
    fig.tight_layout()
    return fig, axes


def test_two_panels_side_by_side_are_stacked_in_one_column():
    fig, axes = _two_panels(sharey=True)
    before = [b.bounds for b in _boxes(fig)]
    phone, why = phone_layout(fig)
    assert phone is not None, why
    assert tuple(phone.get_size_inches()) == pytest.approx((4.8, 6.4))
    top, bottom = _boxes(phone)
    # one column: the same left and right edges, panel 0 above panel 1, no overlap
    assert top.x0 == pytest.approx(bottom.x0, abs=0.02) and top.x1 == pytest.approx(bottom.x1, abs=0.02)
    assert top.y0 > bottom.y1, (top, bottom)
    assert top.width > 0.6 and top.height > 0.25  # each panel gets the width and about half the height
    assert [ax.get_title() for ax in phone.axes] == ["panel 0", "panel 1"]
    assert all(ax.get_legend() is not None for ax in phone.axes)
    # sharey hid panel 1's tick labels and it had no ylabel: stacked, it shows both
    assert phone.axes[1].get_ylabel() == "value"
    assert any(t.get_visible() and t.get_text() for t in phone.axes[1].yaxis.get_majorticklabels())
    # the figure itself is unchanged
    assert [b.bounds for b in _boxes(fig)] == before and tuple(fig.get_size_inches()) == (10, 3.6)
    assert axes[1].get_ylabel() == ""


def test_a_grid_is_read_row_by_row():
    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    for k, ax in enumerate(axes.flat):
        ax.set_title(str(k))
    phone, _ = phone_layout(fig)
    assert [ax.get_title() for ax in phone.axes] == ["0", "1", "2", "3"]
    tops = [b.y1 for b in _boxes(phone)]
    assert tops == sorted(tops, reverse=True) and len(set(round(b.x0, 3) for b in _boxes(phone))) == 1


def test_one_panel_needs_no_phone_rendering():
    fig, ax = plt.subplots()  # matplotlib's 6.4 x 4.8 in
    ax.plot([0, 1], [0, 1])
    phone, why = phone_layout(fig)
    assert phone is None and "legible" in why


def test_a_very_wide_single_panel_is_narrowed():
    fig, ax = plt.subplots(figsize=(10, 3.2))  # ~4.5 CSS px ticks at 342 px
    ax.plot([0, 1], [0, 1])
    phone, why = phone_layout(fig)
    assert phone is not None, why
    assert phone.get_size_inches()[0] == pytest.approx(4.8)


def test_text_fontsize_counts_every_visible_text_and_nothing_hidden():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    ax.tick_params(labelsize=11)
    ax.set_xlabel("x", fontsize=12)
    ax.set_title("title", fontsize=14)
    assert text_fontsize_pt(fig) == 11.0                     # the ticks are the smallest
    legend = ax.legend(fontsize=6)
    assert text_fontsize_pt(fig) == 6.0 and tick_fontsize_pt(fig) == 11.0
    legend.set_visible(False)                                # a hidden legend does not count ...
    assert text_fontsize_pt(fig) == 11.0
    ax.annotate("note", (0.5, 0.5), fontsize=7)              # ... an annotation does
    fig.suptitle("the whole figure", fontsize=5)             # and a figure text
    assert text_fontsize_pt(fig) == 5.0
    ax.text(0.1, 0.1, "   ", fontsize=3)                     # blank text is not text
    assert text_fontsize_pt(fig) == 5.0
    empty = plt.figure()
    assert text_fontsize_pt(empty) is None
    off, ax_off = plt.subplots()
    ax_off.axis("off")
    ax_off.set_title("only a title", fontsize=9)
    ax_off.set_xlabel("hidden with the axis", fontsize=4)    # not drawn when the axis is off
    assert text_fontsize_pt(off) == 9.0


def test_a_long_title_wraps_on_the_phone_instead_of_widening_the_png():
    import io

    from IPython.core.pylabtools import print_figure

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].set_title("a title that is far longer than a phone's column is wide, with more words")
    fig.suptitle("and a suptitle that is longer still than the four point eight inches of the phone")
    for ax in axes:
        ax.plot([0, 1], [0, 1])
    phone, why = phone_layout(fig)
    assert phone is not None, why
    width = Image.open(io.BytesIO(print_figure(phone, "png", bbox_inches="tight"))).size[0]
    assert width <= 4.8 * phone.dpi * 1.02, (width, phone.dpi)      # the tight PNG stays 4.8 in wide
    assert axes[0].title.get_wrap() is False                            # the wide figure is unchanged


def test_one_panel_with_a_small_legend_is_narrowed_for_the_phone():
    fig, ax = plt.subplots(figsize=(6.4, 4.0))  # 11 pt ticks are legible at 342 px ...
    ax.tick_params(labelsize=11)
    ax.plot([0, 1], [0, 1], label="line")
    ax.legend(fontsize=7)                      # ... a 7 pt legend (5 CSS px there) is not
    phone, why = phone_layout(fig)
    assert phone is not None, why
    assert phone.get_size_inches()[0] == pytest.approx(4.8)
    ax.get_legend().remove()
    assert phone_layout(fig)[0] is None


@pytest.mark.parametrize("case", ["colorbar", "add_axes", "subfigures"])
def test_figures_whose_axes_cannot_move_get_no_phone_rendering(case):
    if case == "subfigures":
        fig = plt.figure(figsize=(10, 4))
        for sub in fig.subfigures(1, 2):
            sub.subplots().plot([0, 1])
    else:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        if case == "colorbar":
            fig.colorbar(axes[0].imshow(np.eye(3)), ax=axes[0])
        else:
            fig.add_axes((0.2, 0.6, 0.1, 0.1))
    phone, why = phone_layout(fig)
    assert phone is None and why, case


def test_twin_axes_move_with_their_panel():
    fig, axes = _two_panels()
    twin = axes[0].twinx()
    twin.plot([0, 1, 2], [5, 3, 1], color="tab:orange")
    twin.set_ylabel("right")
    fig.tight_layout()
    phone, why = phone_layout(fig)
    assert phone is not None, why
    phone.canvas.draw()
    first, copy_twin, second = phone.axes[0], phone.axes[2], phone.axes[1]
    assert copy_twin.get_ylabel() == "right"
    assert np.allclose(first.get_position().bounds, copy_twin.get_position().bounds)
    assert first.get_position().y0 > second.get_position().y1  # panel 0 (with its twin) above panel 1


def test_an_inset_made_with_inset_axes_moves_with_its_panel():
    fig, axes = _two_panels()
    inset = axes[0].inset_axes([0.6, 0.1, 0.3, 0.3])
    inset.plot([0, 1], [1, 0])
    phone, why = phone_layout(fig)
    assert phone is not None, why
    parent, child = phone.axes[0], phone.axes[0].child_axes[0]
    phone.canvas.draw()
    p, c = parent.get_position(), child.get_position()
    assert p.x0 < c.x0 < c.x1 < p.x1 and p.y0 < c.y0 < c.y1 < p.y1


def test_phone_layout_refuses_what_is_not_a_figure():
    with pytest.raises(ValueError, match="fig"):
        phone_layout("figure")


def _decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))


def test_glue_figure_glues_the_wide_rendering_and_a_stacked_one(monkeypatch):
    import myst_nb
    from IPython.core.pylabtools import print_figure

    calls = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, obj, display=True: calls.append((name, obj, display)))
    fig, _ = _two_panels()
    assert glue_figure("fig-99-demo", fig) is None
    assert [(n, d) for n, _, d in calls] == [("fig-99-demo", False), (phone_key("fig-99-demo"), False)]
    wide, phone = (base64.b64decode(obj._repr_png_()) for _, obj, _ in calls)
    # the wide rendering has the pixels of glue(name, fig)'s PNG drawn at twice the dpi:
    # print_figure, bbox "tight", dpi 2 x the figure's (the same layout, twice the pixels each way)
    s = display.PNG_SCALE
    assert s == 2
    assert np.array_equal(_decode(wide), _decode(print_figure(fig, "png", bbox_inches="tight", dpi=s * fig.dpi)))
    one_x = Image.open(io.BytesIO(print_figure(fig, "png", bbox_inches="tight"))).size
    two_x = Image.open(io.BytesIO(wide)).size
    assert all(abs(b - s * a) <= 2 for a, b in zip(one_x, two_x)), (one_x, two_x)
    assert repr(calls[0][1]) == repr(fig)
    info_w, info_p = png_info(wide), png_info(phone)
    assert info_w["rendering"] == "wide" and info_p["rendering"] == "phone"
    assert info_w["dpi"] == s * fig.dpi and info_w["scale"] == s and info_w["tick_pt"] == tick_fontsize_pt(fig)
    # the phone PNG is about 4.8 in wide at twice the figure's dpi and 6.4 in tall (two 3.2 in panels)
    w, h = Image.open(io.BytesIO(phone)).size
    assert 0.85 * 4.8 * s * fig.dpi < w < 1.1 * 4.8 * s * fig.dpi and 1.2 * w < h < 6.5 * s * fig.dpi, (w, h)
    assert plt.fignum_exists(fig.number) and len(plt.get_fignums()) == 1  # the copy is closed


def test_glue_figure_of_one_panel_or_without_phone_glues_one_rendering(monkeypatch):
    import myst_nb

    calls = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, obj, display=True: calls.append(name))
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    glue_figure("fig-99-one", fig)
    fig2, _ = _two_panels()
    glue_figure("fig-99-two", fig2, phone=False)
    fig3, axes = plt.subplots(1, 2, figsize=(10, 4))
    fig3.colorbar(axes[0].imshow(np.eye(2)), ax=axes[0])
    glue_figure("fig-99-colorbar", fig3)
    assert calls == ["fig-99-one", "fig-99-two", "fig-99-colorbar"]


def test_glue_figure_names_bad_arguments():
    fig, _ = _two_panels()
    with pytest.raises(ValueError, match="name"):
        glue_figure("", fig)
    with pytest.raises(ValueError, match="name"):
        glue_figure("fig-x--phone", fig)
    with pytest.raises(ValueError, match="fig"):
        glue_figure("fig-x", np.zeros(3))


def test_png_text_chunk_keeps_the_image_valid():
    fig, _ = _two_panels()
    png = display._png_of(fig)
    assert png_info(png) == {}
    marked = display.png_with_text(png, "klbook", '{"dpi": 100}')
    Image.open(io.BytesIO(marked)).verify()  # checks every chunk's CRC
    assert png_info(marked) == {"dpi": 100} and np.array_equal(_decode(png), _decode(marked))
    with pytest.raises(ValueError, match="png"):
        png_info(b"GIF89a")
    with pytest.raises(ValueError, match="scale"):
        display._png_of(fig, 0.5)


def test_the_book_extension_reads_the_scale_of_a_glued_png(tmp_path):
    """_ext/klbook_reader.py gives a 2x PNG a CSS width of half its pixels, and leaves any
    other PNG alone."""
    import importlib.util
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "_ext"))
    spec = importlib.util.spec_from_file_location("klbook_reader_for_display", ROOT / "_ext" / "klbook_reader.py")
    reader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reader)
    fig, _ = _two_panels()
    sharp, plain = tmp_path / "sharp.png", tmp_path / "plain.png"
    sharp.write_bytes(display.annotated_png(fig, "wide"))
    plain.write_bytes(display._png_of(fig))
    width = Image.open(sharp).size[0]
    assert reader.png_scale_and_width(sharp) == (2.0, width)
    assert reader.png_scale_and_width(plain) is None and reader.png_scale_and_width(tmp_path / "none.png") is None


def test_figure_style_sets_legible_defaults():
    from klbook_lib import runtime

    with matplotlib.rc_context():
        runtime.figure_style()
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        assert tick_fontsize_pt(fig) == 11.0 and matplotlib.rcParams["lines.linewidth"] == 1.8
    # a 6.4 in figure at the phone's 342 px column: 11 pt ticks are 11/72 * 342/6.4 = 8.2 CSS px
    assert 11.0 / 72 * 342 / 6.4 > 8


# ---- a tiny book built with the book's extensions: the <picture> of a glued figure
CONFIG = """title: glue_figure fixture
author: tests
only_build_toc_files: true
execute:
  execute_notebooks: force
  allow_errors: false
  timeout: 300
  stderr_output: remove
html:
  favicon: _static/favicon.png
parse:
  myst_enable_extensions: [dollarmath, colon_fence]
sphinx:
  local_extensions:
    klbook_offline: _ext/
  config:
    numfig: true
    nb_execution_raise_on_error: true
    nb_ipywidgets_js: {}
    suppress_warnings: ["mystnb.unknown_mime_type"]
    html_js_files: []
    html_context:
      default_mode: light
"""
TOC = "format: jb-book\nroot: intro\nchapters:\n  - file: figures\n"

SETUP = """import numpy as np
import matplotlib.pyplot as plt
from myst_nb import glue
import klbook_lib as kb
RUN = kb.runtime.setup(threads=1, seed=0)"""
PANELS = """x = np.linspace(0, 4, 50)
fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
for k, ax in enumerate(axes):
    ax.plot(x, np.exp(-x) * (k + 1), label="decay")
    ax.plot(x, np.exp(-2 * x) * (k + 1), "--", label="faster")
    ax.set_title(f"panel {k + 1}")
    ax.set_xlabel("time (s)")
    ax.legend(loc="upper right")
axes[0].set_ylabel("value")
fig.tight_layout()
kb.display.glue_figure("fig-demo-panels", fig)
plt.close(fig)"""
SINGLE = """fig, ax = plt.subplots(figsize=(5, 3.4))
ax.plot(x, np.sin(x), label="sine")
ax.set_xlabel("x"); ax.set_ylabel("sin x"); ax.legend()
fig.tight_layout()
kb.display.glue_figure("fig-demo-single", fig)
plt.close(fig)"""
COLORBAR = """fig, axes = plt.subplots(1, 2, figsize=(6.4, 3.2))
im = axes[0].imshow(np.outer(x, x), aspect="auto")
fig.colorbar(im, ax=axes[0])
axes[1].plot(x, x ** 2)
kb.display.glue_figure("fig-demo-colorbar", fig)
plt.close(fig)"""
PLAIN = """fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
axes[0].plot(x, x); axes[1].plot(x, -x)
glue("fig-demo-plain", fig, display=False)
plt.close(fig)"""
TEXT = """# Figures for phones

Three panels side by side, stacked on a phone:

```{glue:figure} fig-demo-panels
:name: fig-demo-panels

Three decays; the dashed one is faster.
```

One narrow panel (no phone rendering):

```{glue:figure} fig-demo-single
:name: fig-demo-single

A sine.
```

A colorbar (no phone rendering):

```{glue:figure} fig-demo-colorbar
:name: fig-demo-colorbar

An image with a colorbar and a parabola.
```

Glued with glue() (one rendering):

```{glue:figure} fig-demo-plain
:name: fig-demo-plain

Two lines.
```
"""


def write_fixture_book(dest: Path, root: Path) -> Path:
    """Write the fixture book into ``dest`` (the book's extensions and static files from ``root``)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "_config.yml").write_text(CONFIG)
    (dest / "_toc.yml").write_text(TOC)
    (dest / "intro.md").write_text("# Fixture\n\nA book of one page: {doc}`figures`.\n")
    for name in ("_ext", "_static"):
        if (dest / name).exists():
            shutil.rmtree(dest / name)
        shutil.copytree(root / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(TEXT.split("\n\n", 1)[0]),
                nbformat.v4.new_code_cell(SETUP)]
    for code in (PANELS, SINGLE, COLORBAR, PLAIN):
        cell = nbformat.v4.new_code_cell(code)
        cell.metadata["tags"] = ["hide-input"]
        nb.cells.append(cell)
    nb.cells.append(nbformat.v4.new_markdown_cell(TEXT.split("\n\n", 1)[1]))
    nbformat.write(nb, dest / "figures.ipynb")
    return dest


@pytest.mark.slow
def test_a_built_page_shows_the_phone_rendering_in_a_picture(tmp_path):
    from bs4 import BeautifulSoup

    book = write_fixture_book(tmp_path / "book", ROOT)
    jb = Path(sys.executable).with_name("jupyter-book")
    run = subprocess.run([str(jb), "build", str(book), "-W", "--keep-going"], capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    html = book / "_build" / "html"
    soup = BeautifulSoup((html / "figures.html").read_text(), "html.parser")
    figures = {f["id"]: f for f in soup.select("figure[id]")}
    assert set(figures) == {"fig-demo-panels", "fig-demo-single", "fig-demo-colorbar", "fig-demo-plain"}
    pictures = soup.select("picture")
    assert len(pictures) == 1 and pictures[0].find_parent("figure")["id"] == "fig-demo-panels"
    source, img = pictures[0].find("source"), pictures[0].find("img")
    assert source["media"] == "(max-width: 640px)" and img["alt"] == "Three decays; the dashed one is faster."
    phone_png, wide_png = (html / source["srcset"]).read_bytes(), (html / img["src"]).read_bytes()
    assert png_info(phone_png)["rendering"] == "phone" and png_info(wide_png)["rendering"] == "wide"
    assert png_info(wide_png)["panels"] == 3 and Image.open(io.BytesIO(phone_png)).size[1] > 2 * 342
    # the phone PNG is no <img> anywhere, and no figure other than the stacked one has a source
    assert source["srcset"] not in {i.get("src") for i in soup.find_all("img")}
    for key in ("fig-demo-single", "fig-demo-colorbar", "fig-demo-plain"):
        assert figures[key].find("source") is None and len(figures[key].find_all("img")) == 1
    assert png_info((html / figures["fig-demo-plain"].img["src"]).read_bytes()) == {}  # glue(): no record
    # a glue_figure PNG is drawn at 2x and shown at half its pixel width; a glue() PNG as it is
    wide_px = Image.open(io.BytesIO(wide_png)).size[0]
    assert "klbook-hidpi" in img.get("class", []), img
    assert f"{round(wide_px / 2)}px" in (img.get("style", "") + str(img.get("width", ""))) + "px", img
    assert "klbook-hidpi" not in figures["fig-demo-plain"].img.get("class", [])
    # every image of the page is inside a figure: no glued rendering leaks as an output
    assert all(i.find_parent("figure") for i in soup.select("article img"))


def test_a_legend_beside_a_panel_moves_below_it_on_the_phone():
    fig, axes = _two_panels()
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    phone, _ = phone_layout(fig)
    ax = phone.axes[1]
    legend, frame = ax.get_legend().get_window_extent(), ax.bbox
    assert legend.y1 <= frame.y0 and frame.x0 <= legend.x0 and legend.x1 <= frame.x1 + 1, (legend, frame)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["line 1"]
    assert ax.bbox.width > 0.75 * phone.bbox.width  # the panel keeps the page's width


# ---- every figure is glued through display.glue_figure (the migration of issue 27 is
# finished and its tool, tools/use_glue_figure.py, removed; this keeps it finished)
PLAIN_FIGURE_GLUE = re.compile(r"""(?<![\w.])glue\(\s*["']fig-""")


def test_no_chapter_glues_a_figure_with_plain_glue():
    found = [f"{src.name}: {c.source.splitlines()[0][:60]}"
             for src in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
             for c in nbformat.read(src, as_version=4).cells
             if c.cell_type == "code" and PLAIN_FIGURE_GLUE.search(c.source)]
    assert found == []
    # the control: the pattern sees the old spelling
    assert PLAIN_FIGURE_GLUE.search("glue('fig-01-a', fig, display=False)")
    assert not PLAIN_FIGURE_GLUE.search("K.display.glue_figure('fig-01-a', fig)")
