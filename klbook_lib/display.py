"""Tables and figures for reading: what the chapters show instead of a raw ``DataFrame``,
and figures glued with a rendering for phones.

A raw pandas table in a page prints its index column, every float to six digits and
``-0.000`` for tiny negative numbers, and grows wider than the text column. :func:`table`
returns a pandas ``Styler`` that hides the index (unless it carries information),
rounds to a chosen number of significant digits, writes a negative zero as ``0`` and
lets long column names wrap. The numbers themselves are untouched: asserts keep working
on the ``DataFrame``.

:func:`glue_figure` glues a matplotlib figure as ``myst_nb.glue(name, fig, display=False)``
does and, for a figure whose panels sit side by side, a second rendering with the panels
stacked for a phone (see the figures section below).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["table", "format_number", "glue_figure", "phone_key", "phone_layout", "text_fontsize_pt", "tick_fontsize_pt",
           "png_info"]


def format_number(x: Any, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits; integers as integers; ``-0`` as ``0``.

    Large or tiny magnitudes switch to scientific notation (``1.2e-05``). Non-numbers are
    returned as ``str(x)``.
    """
    if not isinstance(digits, int) or digits < 1:
        raise ValueError(f"digits: must be a positive integer, got {digits!r}")
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        return str(x)
    if isinstance(x, int) or (hasattr(x, "is_integer") and type(x).__name__.startswith("int")):
        return str(int(x))
    v = float(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    rounded = float(f"{v:.{digits}g}")          # round to `digits` significant digits first
    magnitude = math.floor(math.log10(abs(rounded)))
    if magnitude >= 6 or magnitude < -4:
        return f"{v:.{max(digits - 1, 0)}e}"
    text = f"{rounded:.{max(digits - 1 - magnitude, 0)}f}"
    if float(text) == 0:  # rounds to zero at this precision: no "-0.000"
        return "0"
    return text


def table(df, digits: int | Mapping[str, int] = 3, index: bool = False, caption: str | None = None):
    """A ``Styler`` of ``df`` for reading: no index column, ``digits`` significant digits.

    Args:
        df: a pandas ``DataFrame``.
        digits: significant digits for every numeric column, or a mapping from column
            name to digits (columns not named get 3).
        index: keep the index column (use it when the index is a label such as ``beta``).
        caption: an optional caption shown above the table.
    """
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: expected a pandas DataFrame, got {type(df).__name__}")
    per_column = dict(digits) if isinstance(digits, Mapping) else {}
    default = 3 if isinstance(digits, Mapping) else digits
    unknown = set(per_column) - set(df.columns)
    if unknown:
        raise ValueError(f"digits: names columns that df does not have: {sorted(map(str, unknown))}")
    formatters = {c: (lambda x, d=per_column.get(c, default): format_number(x, d)) for c in df.columns}
    styler = df.style.format(formatters)
    if index:
        styler = styler.format_index(lambda x: format_number(x, default) if isinstance(x, float) else str(x))
    else:
        styler = styler.hide(axis="index")
    if caption:
        styler = styler.set_caption(caption)
    return styler.set_table_attributes('class="klbook-table"')


# --------------------------------------------------------------------------- figures
# Figures that can be read on a phone (issue 24). A multi-panel figure drawn for the
# 1366 px page shrinks to the phone's text column (about 342 CSS px at 390 px) and its
# tick text to a few pixels. :func:`glue_figure` glues the figure as ``glue`` does and,
# when the figure would be illegible there, a second rendering for phones under
# ``phone_key(name)``: the same axes one above another, 4.8 in wide. The book's Sphinx
# extension (``_ext/klbook_reader.py``) turns the figure of a ``glue:figure`` directive
# that has both into a ``<picture>`` whose phone source is used below 640 px.

PHONE_SUFFIX = "--phone"
PHONE_WIDTH_IN = 4.8          # the phone rendering's width (inches)
PHONE_PANEL_HEIGHT_IN = 3.2   # the height of each stacked panel (inches)
PHONE_COLUMN_CSS_PX = 342     # the text column of the book at a 390 px viewport
PHONE_TICK_CSS_PX = 7.5       # a single column whose ticks would be smaller there gets a phone rendering
PNG_TEXT_KEY = "klbook"       # the PNG tEXt chunk that says how a rendering was drawn
PNG_SCALE = 2                 # glued PNGs are drawn at twice the figure's dpi and shown at its CSS size


def phone_key(name: str) -> str:
    """The glue key of the phone rendering of the figure glued as ``name``."""
    return name + PHONE_SUFFIX


def tick_fontsize_pt(fig: Any) -> float | None:
    """The smallest font size (pt) of the visible, non-empty tick labels of ``fig``.

    ``None`` when no axes of ``fig`` shows a tick label (images with ``axis("off")``).
    """
    sizes = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        for axis in (ax.xaxis, ax.yaxis):
            if not axis.get_visible():
                continue
            for label in axis.get_majorticklabels():
                if label.get_visible() and label.get_text().strip():
                    sizes.append(float(label.get_fontsize()))
    return min(sizes) if sizes else None


def text_fontsize_pt(fig: Any) -> float | None:
    """The smallest font size (pt) of the visible, non-empty text of ``fig``: tick labels (as
    :func:`tick_fontsize_pt`), axis labels, titles, legend entries and titles, annotations
    and figure texts (a suptitle, ``fig.text``).

    ``None`` when the figure shows no text at all.
    """
    from matplotlib.text import Text

    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update((id(tick.label1), id(tick.label2)))
    # an axis label is drawn only when its axes shows its axis (``ax.axis("off")`` hides it)
    labels = {id(axis.label): (ax, axis) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)}
    sizes = []

    def walk(artist) -> None:  # an invisible artist hides what it holds (a hidden legend's texts)
        if not artist.get_visible():
            return
        if isinstance(artist, Text) and id(artist) not in ticks and artist.get_text().strip():
            owner = labels.get(id(artist))
            if owner is None or (owner[0].axison and owner[1].get_visible()):
                sizes.append(float(artist.get_fontsize()))
        for child in artist.get_children():
            if child is not artist:
                walk(child)

    walk(fig)
    tick = tick_fontsize_pt(fig)
    if tick is not None:
        sizes.append(tick)
    return min(sizes) if sizes else None


def _panels(fig) -> tuple[list | None, str]:
    """The panels of ``fig`` in reading order, or ``None`` and why they cannot move.

    A panel is a list of axes that share one place: an axes and its twins (``twinx``,
    ``twiny``), the first one the axes they were made from.
    """
    if getattr(fig, "subfigs", None):
        return None, "the figure has subfigures"
    axes = [ax for ax in fig.axes if ax.get_visible()]
    if not axes:
        return None, "the figure has no axes"
    for ax in axes:
        if ax.get_label() == "<colorbar>" or hasattr(ax, "_colorbar"):
            return None, "the figure has a colorbar"
        if ax.get_axes_locator() is not None:
            return None, "the figure has an inset axes"
        if ax.get_subplotspec() is None:
            return None, "an axes was placed by hand (add_axes): an inset or a custom layout"
    groups: list[list] = []
    for ax in axes:  # fig.axes lists an axes before the twins made from it
        box = ax.get_position().bounds
        for group in groups:
            if all(abs(a - b) < 1e-3 for a, b in zip(box, group[0].get_position().bounds)):
                group.append(ax)
                break
        else:
            groups.append([ax])
    boxes = [g[0].get_position().bounds for g in groups]
    specs = [g[0].get_subplotspec().get_topmost_subplotspec() for g in groups]
    if len({id(s.get_gridspec()) for s in specs}) == 1:
        order = sorted(range(len(groups)), key=lambda i: (specs[i].rowspan.start, specs[i].colspan.start))
    else:  # several grids: read by position, top row first
        order = sorted(range(len(groups)), key=lambda i: (-round(boxes[i][1] + boxes[i][3], 2), boxes[i][0]))
    return [groups[i] for i in order], ""


def _side_by_side(panels) -> bool:
    """True when two of ``panels`` share some height and sit next to each other."""
    boxes = [ax.get_position() for ax in panels]
    for i in range(len(boxes)):
        for j in range(i):
            a, b = boxes[i], boxes[j]
            shared = min(a.y1, b.y1) - max(a.y0, b.y0)
            if shared > 0.25 * min(a.height, b.height) and (a.x1 <= b.x0 + 1e-3 or b.x1 <= a.x0 + 1e-3):
                return True
    return False


def _rendered_width_in(fig) -> float:
    """The width (inches) of ``fig`` drawn with ``bbox_inches="tight"``, as a notebook shows it."""
    import matplotlib as mpl

    pad = mpl.rcParams["savefig.pad_inches"]
    pad = 0.1 if pad == "layout" else float(pad)
    return float(fig.get_tightbbox().width) + 2 * pad


def _copy_figure(fig):
    import pickle

    return pickle.loads(pickle.dumps(fig))


def _show_shared_labels(panels) -> None:
    """Stacked in one column, every panel shows its own tick labels and axis labels.

    ``plt.subplots(sharey=True)`` hides the inner panels' y tick labels and authors often
    label only the first panel's shared axis; on top of each other each panel needs them.
    """
    for ax in panels:
        for name, axis, siblings in (("x", ax.xaxis, ax.get_shared_x_axes().get_siblings(ax)),
                                     ("y", ax.yaxis, ax.get_shared_y_axes().get_siblings(ax))):
            if len(siblings) < 2:
                continue
            ax.tick_params(axis=name, **({"labelbottom": True} if name == "x" else {"labelleft": True}))
            if not axis.label.get_text():
                for other in siblings:
                    text = (other.xaxis if name == "x" else other.yaxis).label.get_text()
                    if other is not ax and text:
                        axis.set_label_text(text)
                        break


def _legends_below(panels) -> bool:
    """Move a legend placed beside its axes (``bbox_to_anchor=(1.02, 1)``) below it.

    On a 4.8 in wide page a legend to the right of a panel takes a third of the width;
    below the panel's x label it takes none. Its entries, font size and frame are kept.
    Call after a draw; returns whether a legend moved.
    """
    moved = False
    for ax in panels:
        legend = ax.get_legend()
        if legend is None or not legend.get_visible():
            continue
        box, frame = legend.get_window_extent(), ax.bbox
        if not (box.x0 >= frame.x1 - 2 or box.x1 <= frame.x0 + 2):
            continue  # inside (or above/below) the axes: where the author put it
        pairs = [(h, t.get_text()) for h, t in zip(legend.legend_handles, legend.get_texts()) if h is not None]
        if not pairs:
            continue
        texts = legend.get_texts()
        size = texts[0].get_fontsize()
        widest = max(t.get_window_extent().width for t in texts)
        legend.set_visible(False)
        below = ax.get_tightbbox()  # the axes with its tick labels and x label, without the legend
        y = (below.y0 - frame.y0) / max(frame.height, 1.0) - 0.03
        column = widest + 4 * size * ax.get_figure(root=True).dpi / 72  # text, handle and padding (px)
        ncols = int(max(1, min(len(pairs), 3, 0.85 * ax.get_figure(root=True).bbox.width // column)))
        title = legend.get_title().get_text()
        ax.legend([h for h, _ in pairs], [t for _, t in pairs], loc="upper center", bbox_to_anchor=(0.5, y),
                  ncols=ncols, fontsize=size, frameon=legend.get_frame_on(), title=title or None)
        moved = True
    return moved


def _wrap_titles(fig) -> None:
    """Let the titles of ``fig`` (axes titles, a suptitle) wrap at the figure's edge: a title
    longer than the phone's width would otherwise widen the tight PNG and shrink everything."""
    from matplotlib.text import Text

    for child in fig.get_children():
        if isinstance(child, Text):            # the suptitle, supxlabel/supylabel
            child.set_wrap(True)
    for ax in fig.axes:
        for child in ax.get_children():         # the three title slots, not the annotations
            if isinstance(child, Text) and child not in ax.texts:
                child.set_wrap(True)


def phone_layout(fig: Any) -> tuple[Any, str]:
    """A copy of ``fig`` laid out for a phone, or ``None``; and a sentence saying which.

    Returns ``(phone_fig, reason)``. ``fig`` itself is not changed.

    * Panels side by side (``plt.subplots(1, 3)``, a 2 x 2 grid, a mosaic): every axes
      moves to an N x 1 GridSpec in reading order (row by row), the figure becomes
      ``PHONE_WIDTH_IN`` wide and ``PHONE_PANEL_HEIGHT_IN`` per panel, with tight layout.
      Legends, titles and a suptitle come along (a legend placed beside its panel moves
      below it; a title wider than the figure wraps); shared axes show their tick labels on every panel; twin axes
      (``twinx``/``twiny``) and insets made with ``ax.inset_axes`` move with their axes.
    * One column (one axes, or panels already stacked) that is so wide that its tick
      labels would be smaller than ``PHONE_TICK_CSS_PX`` CSS px in the phone's 342 px
      column: the same layout, ``PHONE_WIDTH_IN`` wide. A narrower one needs no phone
      rendering (``None``).
    * No phone rendering (``None``, the reason says why) when the figure has a colorbar,
      an axes placed by hand (``fig.add_axes``: an inset in figure coordinates, a custom
      layout) or by an axes locator (``mpl_toolkits`` insets), subfigures, or cannot be
      copied (pickled): moving those axes would break what they show. Such a figure keeps
      its one rendering; design it to be legible at 342 px (the browser check measures it).
    """
    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        raise ValueError(f"fig: expected a matplotlib Figure, got {type(fig).__name__}")
    groups, reason = _panels(fig)
    if groups is None:
        return None, reason
    panels = [g[0] for g in groups]
    width, height = (float(v) for v in fig.get_size_inches())
    stacked = not _side_by_side(panels)
    if stacked:
        shown = _rendered_width_in(fig)
        tick = text_fontsize_pt(fig) or 10.0
        css = tick / 72 * fig.dpi * min(1.0, PHONE_COLUMN_CSS_PX / max(shown * fig.dpi, 1e-6))
        if shown <= PHONE_WIDTH_IN or css >= PHONE_TICK_CSS_PX:
            return None, (f"one column, {shown:.1f} in wide as drawn: its smallest text ({tick:g} pt) is "
                          f"{css:.1f} CSS px on a phone, legible as it is")
    try:
        copy = _copy_figure(fig)
    except Exception as exc:  # a lambda formatter, an unpicklable artist ...
        return None, f"the figure cannot be copied ({type(exc).__name__}: {exc})"
    try:
        from matplotlib.gridspec import GridSpec

        copy.set_dpi(fig.dpi)
        copied, _ = _panels(copy)
        if copied is None or [len(g) for g in copied] != [len(g) for g in groups]:
            raise ValueError("the copied figure lost its axes")
        moved = [g[0] for g in copied]
        n = len(moved)
        grid = GridSpec(n, 1, figure=copy)
        for i, group in enumerate(copied):
            for ax in group:  # an axes and its twins move together
                ax.set_subplotspec(grid[i, 0])
        if n > 1:
            _show_shared_labels(moved)
        _wrap_titles(copy)
        new_height = PHONE_PANEL_HEIGHT_IN * n if n > 1 else min(max(height, 2.8), 4.0)
        copy.set_size_inches(PHONE_WIDTH_IN, new_height, forward=False)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "not compatible with tight_layout"
            copy.set_layout_engine("tight")
            copy.canvas.draw()
            if _legends_below([ax for g in copied for ax in g]):
                copy.canvas.draw()
    except Exception:
        _close(copy)
        raise
    what = "panels side by side, stacked" if not stacked else "one column, narrowed"
    return copy, f"{what}: {n} axes in one column, {PHONE_WIDTH_IN:g} x {new_height:g} in"


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


# ---- PNG bytes: what the inline backend draws, with a note of how it was drawn
def _png_of(fig, scale: float = 1) -> bytes:
    """``fig`` as the PNG a notebook shows: the kernel's own PNG formatter if it has one
    (``%matplotlib inline``, which ``kb.runtime.setup`` selects), else IPython's
    ``print_figure(fig, "png", bbox_inches="tight")``, which is what that formatter calls.

    ``scale`` > 1 draws the same figure at ``scale`` times its dpi (the same layout, more
    pixels): ``print_figure(fig, "png", bbox_inches="tight", dpi=scale * fig.dpi)``."""
    import base64

    if not isinstance(scale, (int, float)) or not 1 <= scale <= 4:
        raise ValueError(f"scale: expected a number from 1 to 4, got {scale!r}")
    data = None
    if scale != 1:
        from IPython.core.pylabtools import print_figure

        data = print_figure(fig, "png", bbox_inches="tight", dpi=float(fig.dpi) * scale)
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:  # pragma: no cover
        shell = None
    if data is None and shell is not None and hasattr(shell, "kernel"):
        formatter = shell.display_formatter.formatters.get("image/png")
        if formatter is not None and formatter.enabled:
            data = formatter(fig)  # None when no PNG printer is registered for figures
    if data is None:
        from IPython.core.pylabtools import print_figure

        data = print_figure(fig, "png", bbox_inches="tight")
    if isinstance(data, str):
        data = base64.b64decode(data)
    if not data or not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("fig: did not render to a PNG (an empty figure?)")
    return data


def _png_chunks(png: bytes):
    import struct

    pos = 8
    while pos + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        yield kind, pos, png[pos + 8:pos + 8 + length]
        pos += 12 + length


def png_with_text(png: bytes, key: str, text: str) -> bytes:
    """``png`` with a ``tEXt`` chunk ``key: text`` after its header (pixels unchanged)."""
    import struct
    import zlib

    body = key.encode("latin-1") + b"\0" + text.encode("latin-1")
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body) & 0xFFFFFFFF)
    first = next(_png_chunks(png))
    if first[0] != b"IHDR":
        raise ValueError("png: the first chunk is not IHDR")
    end = 8 + 12 + len(first[2])
    return png[:end] + chunk + png[end:]


def png_info(png: bytes) -> dict:
    """What :func:`glue_figure` wrote into a PNG (``{}`` for any other PNG):
    ``rendering`` ("wide" or "phone"), ``dpi`` (of the PNG's pixels), ``scale`` (pixels per CSS
    px the page shows it at: 2 for a sharp rendering; absent in PNGs drawn before), ``tick_pt`` (smallest tick label, pt),
    ``text_pt`` (smallest text of any kind: labels, titles, legends, annotations, pt),
    ``width_in``/``height_in`` (figure size) and ``panels``."""
    import json

    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("png: not a PNG file")
    for kind, _, body in _png_chunks(png):
        if kind == b"tEXt" and body.startswith(PNG_TEXT_KEY.encode() + b"\0"):
            return json.loads(body.split(b"\0", 1)[1].decode("latin-1"))
        if kind == b"IDAT":
            break
    return {}


def annotated_png(fig, rendering: str, scale: float = PNG_SCALE) -> bytes:
    """``fig`` as a PNG drawn at ``scale`` times its dpi, carrying (``png_info``) its dpi, scale,
    ``rendering`` ("wide" or "phone") and smallest text size for the site's checks."""
    import json

    png = _png_of(fig, scale)
    width, height = (float(v) for v in fig.get_size_inches())
    # dpi: the pixels per inch of this PNG (scale x the figure's); the page shows it at
    # 1/scale of its pixel width (_ext/klbook_reader.py), so a point of text is
    # dpi / 72 / scale CSS px before the column narrows it
    info = {"rendering": rendering, "dpi": float(fig.dpi) * scale, "scale": scale, "tick_pt": tick_fontsize_pt(fig),
            "text_pt": text_fontsize_pt(fig),
            "width_in": round(width, 3), "height_in": round(height, 3),
            "panels": sum(1 for ax in fig.axes if ax.get_visible())}
    return png_with_text(png, PNG_TEXT_KEY, json.dumps(info, sort_keys=True))


class _RenderedFigure:
    """A figure already drawn: what ``glue`` stores is its PNG, its text is the figure's."""

    def __init__(self, png: bytes, text: str):
        self._png, self._text = png, text

    def _repr_png_(self) -> str:
        import base64

        return base64.b64encode(self._png).decode("ascii")  # as matplotlib-inline returns it

    def __repr__(self) -> str:
        return self._text


def glue_figure(name: str, fig: Any, *, phone: bool = True) -> None:
    """Glue ``fig`` as ``glue(name, fig, display=False)`` does, plus a phone rendering.

    The wide rendering under ``name`` is the PNG the notebook's inline backend draws
    (``bbox_inches="tight"``), drawn at ``PNG_SCALE`` times the figure's dpi so that it is
    sharp on high-density screens (the page shows it at the figure's size: the book's
    extension gives the ``<img>`` a CSS width of its pixel width / ``PNG_SCALE``), with one
    ``tEXt`` chunk added that records
    the dpi and the smallest tick label size (:func:`png_info`), so that the browser check
    can compute the tick text's size on screen. When ``phone`` is true and
    :func:`phone_layout` lays the figure out for a phone (panels side by side, or a single
    column too wide to read at 342 px), that rendering is glued under
    ``phone_key(name)``; the ``glue:figure`` directive that names ``name`` shows it below
    640 px (``_ext/klbook_reader.py``). Nothing else is displayed, and ``fig`` is not
    changed. Colorbars, hand-placed axes and subfigures get no phone rendering
    (see :func:`phone_layout`). Returns ``None`` (so that a notebook cell ending with this
    call shows nothing).
    """
    from matplotlib.figure import Figure
    import myst_nb

    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name: expected a non-empty glue key, got {name!r}")
    if name.endswith(PHONE_SUFFIX):
        raise ValueError(f"name: must not end with {PHONE_SUFFIX!r} (kept for the phone rendering), got {name!r}")
    if not isinstance(fig, Figure):
        raise ValueError(f"fig: expected a matplotlib Figure, got {type(fig).__name__}")
    myst_nb.glue(name, _RenderedFigure(annotated_png(fig, "wide"), repr(fig)), display=False)
    if not phone:
        return None
    small, _reason = phone_layout(fig)
    if small is None:
        return None
    try:
        myst_nb.glue(phone_key(name), _RenderedFigure(annotated_png(small, "phone"), repr(small)), display=False)
    finally:
        _close(small)
    return None
