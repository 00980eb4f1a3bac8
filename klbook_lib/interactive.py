"""Figures a reader can move (issue 38): a family of figures computed in the notebook on a
grid of one parameter, and a slider on the page that picks one.

Nothing is computed in the browser. The notebook draws one matplotlib figure per grid
value and computes the numbers shown beside it with this library; :func:`glue_slider`
glues all of them as one output:

* in the HTML page, a ``<div class="klbook-interactive">`` holding the figure of the
  starting value (an ordinary ``<img>``, so a reader without JavaScript sees it), a table of
  that value's numbers, and the other frames and numbers as JSON; ``_static/klbook.js``
  shows a range slider (keyboard and touch) that swaps in the frame and the numbers of the
  value picked. The PNGs are drawn at twice the figure's dpi and carry the
  :mod:`klbook_lib.display` record, so the browser check measures their text like any figure.
* in the PDF (and any reader that cannot show HTML), the PNG of the starting value.

The families of the book:

* :func:`kl_estimator_moments`: the exact mean, bias and standard deviation of the
  single-sample estimators k1, k2, k3 of ``KL(p || q)`` when the log-ratio ``log q/p`` under
  ``p`` is Gaussian with standard deviation ``spread`` (``p = N(0, 1)``, ``q = N(spread, 1)``),
  by Gauss-Hermite quadrature of :mod:`klbook_lib.estimators`' own formulas.
* :func:`gaussian_fits_at_separation`: the forward- and reverse-KL Gaussian fits of
  :mod:`klbook_lib.fitting` to two peaks at ``-a`` and ``+a``.
"""
from __future__ import annotations

import base64
import html
import json
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

__all__ = ["kl_estimator_moments", "gaussian_fits_at_separation", "SliderFigure", "glue_slider", "slider_html", "QUADRATURE_NODES"]

QUADRATURE_NODES = 160


# --------------------------------------------------------------------------- families
def kl_estimator_moments(spread: float, nodes: int = QUADRATURE_NODES) -> dict:
    """Exact moments of the single-sample estimators of ``KL(p || q)``, ``p = N(0, 1)``,
    ``q = N(spread, 1)``.

    Under ``x ~ p`` the log-ratio ``lr = log q(x) - log p(x) = spread * x - spread**2 / 2`` is
    Gaussian with standard deviation ``spread``; ``KL(p || q) = spread**2 / 2``. The mean and
    standard deviation of ``k1``, ``k2``, ``k3`` (:func:`klbook_lib.estimators.estimate_from_log_ratio`)
    are integrals over ``x``, computed by Gauss-Hermite quadrature with ``nodes`` points
    (exact for polynomials of degree ``2 * nodes - 1``; ``k3`` holds ``exp(lr)`` and its variance
    ``exp(2 lr)``, integrated to a relative error below 1e-9 for ``spread <= 3``).

    Returns ``{"spread", "kl", "k1": {"mean", "bias", "sd"}, "k2": {...}, "k3": {...}}``.
    """
    from . import estimators

    if isinstance(spread, bool) or not isinstance(spread, (int, float, np.floating)) or not math.isfinite(spread):
        raise ValueError(f"spread: expected a finite number, got {spread!r}")
    if not 0 <= spread <= 3:
        raise ValueError(f"spread: expected 0 <= spread <= 3 (the quadrature's accurate range), got {spread!r}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 20:
        raise ValueError(f"nodes: expected an integer >= 20, got {nodes!r}")
    x, w = np.polynomial.hermite_e.hermegauss(nodes)     # weight exp(-x^2/2)
    w = w / math.sqrt(2 * math.pi)                       # expectations under N(0, 1)
    logp = -0.5 * x ** 2 - 0.5 * math.log(2 * math.pi)
    logq = -0.5 * (x - float(spread)) ** 2 - 0.5 * math.log(2 * math.pi)
    lr = estimators.log_ratio(logp, logq)
    kl = 0.5 * float(spread) ** 2
    out: dict[str, Any] = {"spread": float(spread), "kl": kl}
    for name in ("k1", "k2", "k3"):
        values = estimators.estimate_from_log_ratio(lr, name)
        mean = float(np.sum(w * values))
        var = float(np.sum(w * (values - mean) ** 2))
        out[name] = {"mean": mean, "bias": mean - kl, "sd": math.sqrt(max(var, 0.0))}
    return out


def gaussian_fits_at_separation(half_separation: float, width: float = 0.8) -> dict:
    """The forward- and reverse-KL fits of one Gaussian to the two-peaked target
    ``P = (N(-a, width^2) + N(a, width^2)) / 2``, ``a = half_separation``
    (:func:`klbook_lib.fitting.fit_gaussian` on a grid over [-20, 20]).

    The forward fit starts at ``(0.3, 1)`` (it is convex: any start gives moment matching);
    the reverse fit follows the gradient flow from the right peak, ``(a, width)``
    (``method="flow"``), so it stays on that peak where a mode-locked solution exists and
    slides to the centre where it does not. Returns ``{"forward": row, "reverse": row}``,
    each row ``{"mu", "sigma", "kl_pq", "kl_qp"}`` (``KL(P||Q)`` and ``KL(Q||P)`` at the fit, nats).
    """
    from . import fitting

    for name, v, lo, hi in (("half_separation", half_separation, 0.0, 4.0), ("width", width, 0.3, 2.0)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.floating)) or not lo <= v <= hi:
            raise ValueError(f"{name}: expected a number from {lo} to {hi}, got {v!r}")
    a, w = float(half_separation), float(width)
    grid = fitting.make_grid(-20.0, 20.0, 8001)

    def log_p(x):
        return fitting.gaussian_mixture_logpdf(x, [0.5, 0.5], [-a, a], [w, w])

    fits = {"forward": fitting.fit_gaussian(log_p, "forward", init=(0.3, 1.0), grid=grid),
            "reverse": fitting.fit_gaussian(log_p, "reverse", init=(a, w), grid=grid, method="flow")}
    out = {}
    for key, fit in fits.items():
        out[key] = {"mu": float(fit.mu), "sigma": float(fit.sigma),
                    "kl_pq": float(fitting.divergence_to_gaussian(log_p, fit.mu, fit.sigma, "forward", grid=grid)),
                    "kl_qp": float(fitting.divergence_to_gaussian(log_p, fit.mu, fit.sigma, "reverse", grid=grid))}
    return out


# --------------------------------------------------------------------------- the figure
class SliderFigure:
    """A glued family of figures: ``_repr_html_`` for the page, ``_repr_png_`` (the starting
    frame) for the PDF. Built by :func:`glue_slider`."""

    def __init__(self, name: str, values: Sequence[float], labels: Sequence[str], frames: Sequence[bytes],
                 columns: Sequence[str], rows: Sequence[str], cells: Sequence[Sequence[Sequence[str]]],
                 alts: Sequence[str], label: str, start: int):
        self.name, self.values, self.labels, self.frames = name, list(values), list(labels), list(frames)
        self.columns, self.rows, self.cells, self.alts = list(columns), list(rows), [list(c) for c in cells], list(alts)
        self.label, self.start = label, start

    def _repr_png_(self) -> str:
        return base64.b64encode(self.frames[self.start]).decode("ascii")

    def _repr_html_(self) -> str:
        return slider_html(self)

    def __repr__(self) -> str:
        return f"<SliderFigure {self.name}: {len(self.values)} frames, {self.label} from {self.labels[0]} to {self.labels[-1]}>"


FRAME_COLOURS = 96   # a frame is stored with a palette of this many colours (plots use few)


def compact_png(png: bytes, colours: int = FRAME_COLOURS) -> bytes:
    """``png`` with a palette of ``colours`` colours (no dithering), its ``klbook`` record kept:
    a line plot has few colours, and a frame's bytes shrink about fourfold, which matters
    when a page carries every frame of a family."""
    import io

    from PIL import Image

    from .display import PNG_TEXT_KEY, png_with_text, png_info

    if isinstance(colours, bool) or not isinstance(colours, int) or not 2 <= colours <= 256:
        raise ValueError(f"colours: expected an integer from 2 to 256, got {colours!r}")
    info = png_info(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        out, "PNG", optimize=True, dpi=image.info.get("dpi", (72, 72)))
    data = out.getvalue()
    return png_with_text(data, PNG_TEXT_KEY, json.dumps(info, sort_keys=True)) if info else data


def _png_size(png: bytes) -> tuple[int, int]:
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def slider_html(figure: SliderFigure) -> str:
    """The HTML of a :class:`SliderFigure` (see the module's docstring)."""
    from .display import png_info

    esc = html.escape
    i = figure.start
    key = "".join(c if c.isalnum() or c in "-_" else "-" for c in figure.name)
    png = figure.frames[i]
    scale = float(png_info(png).get("scale", 1) or 1)
    width = round(_png_size(png)[0] / scale)
    head = "".join(f"<th>{esc(c)}</th>" for c in figure.columns)
    body = "".join(
        "<tr><th scope=\"row\">" + esc(row) + "</th>"
        + "".join(f'<td data-klbook-cell="{r * len(figure.columns[1:]) + j}">{esc(v)}</td>'
                  for j, v in enumerate(figure.cells[i][r]))
        + "</tr>" for r, row in enumerate(figure.rows))
    data = {"values": figure.values, "labels": figure.labels, "alts": figure.alts,
            "frames": ["" if k == i else base64.b64encode(f).decode("ascii") for k, f in enumerate(figure.frames)],
            "cells": [[v for row in frame for v in row] for frame in figure.cells]}
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    n = len(figure.values)
    return (
        f'<div class="klbook-interactive" id="klbook-interactive-{key}" data-start="{i}">'
        f'<div class="klbook-interactive-controls" hidden>'
        f'<label for="klbook-slider-{key}">{esc(figure.label)} = '
        f'<output class="klbook-interactive-value" for="klbook-slider-{key}">{esc(figure.labels[i])}</output></label>'
        f'<input type="range" class="klbook-interactive-slider" id="klbook-slider-{key}" min="0" max="{n - 1}" '
        f'step="1" value="{i}" aria-valuetext="{esc(figure.label)} = {esc(figure.labels[i])}" /></div>'
        f'<img class="klbook-interactive-frame klbook-hidpi" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}" alt="{esc(figure.alts[i])}" style="width: {width}px" />'
        f'<table class="klbook-interactive-readout"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        f'<script type="application/json" class="klbook-interactive-data">{payload}</script>'
        f'</div>')


def glue_slider(name: str, values: Sequence[float], draw: Callable[[float], Any],
                readout: Callable[[float], Mapping[str, Sequence[float]]], *, label: str, columns: Sequence[str],
                alt: Callable[[float], str], start: int | None = None, value_format: str = "{:.2f}",
                digits: int = 3, zero_below: float = 1e-9, glue: bool = True) -> SliderFigure:
    """Glue a family of figures under ``name`` for a ``glue:figure`` directive.

    Args:
        values: the grid of the parameter (at least 2, increasing).
        draw: ``draw(v)`` returns the matplotlib figure for ``v`` (closed here after drawing).
        readout: ``readout(v)`` returns ``{row name: [numbers]}``, one number per column after
            the first of ``columns``, computed by the library for ``v``; shown as a table under
            the figure with ``digits`` significant digits (:func:`klbook_lib.display.format_number`).
        label: the parameter's name on the page (symbols read in both editions: ``"σ(log r)"``).
        columns: the table's header, first the rows' header.
        alt: ``alt(v)``, the plain-text alt text of the frame of ``v``.
        start: the index of the frame shown first and in the PDF (default: the middle one).
        zero_below: a number of the table smaller than this in size is shown as 0.
        glue: glue it (``myst_nb.glue(name, ..., display=False)``); ``False`` only builds it.

    Returns the :class:`SliderFigure`.
    """
    from matplotlib.figure import Figure
    import matplotlib.pyplot as plt

    from .display import annotated_png, format_number

    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name: expected a non-empty glue key, got {name!r}")
    vals = [float(v) for v in values]
    if len(vals) < 2 or any(b <= a for a, b in zip(vals, vals[1:])) or not all(map(math.isfinite, vals)):
        raise ValueError(f"values: expected at least two finite, increasing numbers, got {list(values)!r}")
    start = len(vals) // 2 if start is None else start
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < len(vals):
        raise ValueError(f"start: expected an index from 0 to {len(vals) - 1}, got {start!r}")
    if len(columns) < 2:
        raise ValueError(f"columns: expected the rows' header and at least one column, got {list(columns)!r}")
    frames, cells, alts, rows = [], [], [], None
    for v in vals:
        fig = draw(v)
        if not isinstance(fig, Figure):
            raise ValueError(f"draw: must return a matplotlib Figure, got {type(fig).__name__} for {v}")
        try:
            frames.append(compact_png(annotated_png(fig, "wide")))
        finally:
            plt.close(fig)
        table = readout(v)
        if rows is None:
            rows = list(table)
        if list(table) != rows or any(len(table[r]) != len(columns) - 1 for r in rows):
            raise ValueError(f"readout: expected rows {rows} with {len(columns) - 1} numbers each for every value, "
                             f"got {dict(table)!r} for {v}")
        # a number that is zero up to rounding (an unbiased estimator's bias by quadrature,
        # a symmetric fit's mean) reads as 0, not -5.55e-17
        cells.append([[format_number(0.0 if abs(float(x)) < zero_below else float(x), digits) for x in table[r]]
                      for r in rows])
        text = alt(v)
        if not isinstance(text, str) or not text.strip() or "\\" in text or "$" in text:
            raise ValueError(f"alt: must return plain text (no TeX), got {text!r}")
        alts.append(text.strip())
    figure = SliderFigure(name, vals, [value_format.format(v) for v in vals], frames, columns, rows, cells, alts,
                          label, start)
    if glue:
        import myst_nb

        myst_nb.glue(name, figure, display=False)
    return figure
