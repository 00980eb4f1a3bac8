"""klbook_lib.interactive: the estimator family against closed forms, and the glued slider
figure (its HTML, its PNG for the PDF, its checks). The page's behaviour is tested in
tests/test_browser.py (moving the slider shows the library's numbers)."""
from __future__ import annotations

import base64
import json
import math
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from klbook_lib import interactive  # noqa: E402
from klbook_lib.display import format_number, png_info  # noqa: E402


def _closed_form(s: float) -> dict:
    """Under x ~ N(0,1), lr = s x - s^2/2 ~ N(m, v) with m = -s^2/2, v = s^2."""
    m, v = -s * s / 2, s * s
    e_l2 = v + m * m
    e_l4 = m ** 4 + 6 * m * m * v + 3 * v * v
    return {"kl": s * s / 2,
            "k1": (s * s / 2, math.sqrt(v)),
            "k2": (e_l2 / 2, math.sqrt(max(e_l4 - e_l2 ** 2, 0) / 4)),
            # k3 = r - 1 - lr: E[r] = 1, Var r = e^v - 1, Cov(r, lr) = v  => Var k3 = e^v - 1 - v
            "k3": (s * s / 2, math.sqrt(max(math.expm1(v) - v, 0)))}


@pytest.mark.parametrize("s", [0.0, 0.05, 0.3, 0.7, 1.0, 1.5, 2.0, 2.5])
def test_estimator_moments_match_the_closed_forms(s):
    got = interactive.kl_estimator_moments(s)
    ref = _closed_form(s)
    assert got["kl"] == pytest.approx(ref["kl"], abs=1e-15)
    for name in ("k1", "k2", "k3"):
        mean, sd = ref[name]
        assert got[name]["mean"] == pytest.approx(mean, rel=1e-9, abs=1e-12), name
        assert got[name]["sd"] == pytest.approx(sd, rel=1e-7, abs=1e-9), name
        assert got[name]["bias"] == pytest.approx(mean - ref["kl"], abs=1e-9), name


def test_estimator_moments_agree_with_sampling():
    """A second, independent check: a large sample from p = N(0,1) with torch.distributions."""
    import torch

    s = 1.2
    p, q = torch.distributions.Normal(0.0, 1.0), torch.distributions.Normal(s, 1.0)
    torch.manual_seed(0)
    x = p.sample((400_000,))
    lr = (q.log_prob(x) - p.log_prob(x)).double().numpy()
    got = interactive.kl_estimator_moments(s)
    for name, values in (("k1", -lr), ("k2", lr ** 2 / 2), ("k3", np.expm1(lr) - lr)):
        se = values.std() / math.sqrt(len(values))
        assert abs(values.mean() - got[name]["mean"]) < 5 * se, name
        assert values.std() == pytest.approx(got[name]["sd"], rel=0.05), name


@pytest.mark.parametrize("bad", [-0.1, 3.5, float("nan"), "1", True])
def test_estimator_moments_name_a_bad_spread(bad):
    with pytest.raises(ValueError, match="spread"):
        interactive.kl_estimator_moments(bad)
    with pytest.raises(ValueError, match="nodes"):
        interactive.kl_estimator_moments(1.0, nodes=5)


def _draw(v):
    fig, ax = plt.subplots(figsize=(4.8, 3))
    ax.plot([0, 1], [0, v])
    ax.set_title(f"slope {v}")
    return fig


def _slider(**kw):
    args = dict(values=[0.5, 1.0, 2.0], draw=_draw, readout=lambda v: {"a": [v, v * v], "b": [1 / v, -v]},
                label="\u03c3", columns=["", "x", "y"], alt=lambda v: f"A line of slope {v}.", glue=False)
    args.update(kw)
    return interactive.glue_slider("fig-99-slider", **args)


def test_glue_slider_builds_frames_numbers_and_a_static_image():
    before = set(plt.get_fignums())
    fig = _slider()
    assert set(plt.get_fignums()) == before        # every frame's figure is closed
    assert fig.start == 1 and fig.labels == ["0.50", "1.00", "2.00"]
    # the PDF (and any reader without HTML) gets the PNG of the starting frame, 2x with its record
    png = base64.b64decode(fig._repr_png_())
    assert png == fig.frames[1] and png_info(png)["scale"] == 2 and png_info(png)["rendering"] == "wide"
    page = fig._repr_html_()
    data = json.loads(re.search(r'<script type="application/json" class="klbook-interactive-data">(.*?)</script>',
                                page).group(1))
    assert data["labels"] == fig.labels and data["values"] == [0.5, 1.0, 2.0]
    assert data["frames"][1] == "" and base64.b64decode(data["frames"][2]) == fig.frames[2]
    # the table's numbers are the readout's, formatted like every number of the book
    assert data["cells"][2] == [format_number(2.0), format_number(4.0), format_number(0.5), format_number(-2.0)]
    tiny = _slider(readout=lambda v: {"a": [v, -5.55e-17], "b": [1e-12, -v]})
    assert tiny.cells[0][0][1] == "0" and tiny.cells[0][1][0] == "0" and tiny.cells[0][1][1] == format_number(-0.5)
    shown = re.findall(r'<td data-klbook-cell="(\d+)">([^<]*)</td>', page)
    assert [v for _, v in shown] == data["cells"][1] and [int(k) for k, _ in shown] == [0, 1, 2, 3]
    assert 'type="range"' in page and 'max="2"' in page and 'value="1"' in page
    assert 'alt="A line of slope 1.0."' in page and "hidden" in page   # the slider shows only with JavaScript
    width = int(re.search(r'style="width: (\d+)px"', page).group(1))
    assert abs(width - int.from_bytes(fig.frames[1][16:20], "big") / 2) <= 1


def test_glue_slider_glues_under_its_name(monkeypatch):
    import myst_nb

    calls = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, obj, display=True: calls.append((name, obj, display)))
    fig = _slider(glue=True)
    assert calls == [("fig-99-slider", fig, False)]


@pytest.mark.parametrize("kw,match", [
    ({"values": [1.0]}, "values"), ({"values": [2.0, 1.0]}, "values"), ({"start": 3}, "start"),
    ({"columns": ["only"]}, "columns"), ({"readout": lambda v: {"a": [v]}}, "readout"),
    ({"alt": lambda v: r"$\beta$"}, "alt"), ({"draw": lambda v: None}, "draw"),
])
def test_glue_slider_names_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        _slider(**kw)
    with pytest.raises(ValueError, match="name"):
        interactive.glue_slider("", [1.0, 2.0], _draw, lambda v: {"a": [v]}, label="x", columns=["", "a"],
                                alt=lambda v: "x", glue=False)


@pytest.mark.parametrize("a", [0.5, 1.5, 2.0, 3.0])
def test_gaussian_fits_forward_matches_moments_and_reverse_is_a_local_minimum(a):
    from klbook_lib import fitting

    w = 0.8
    got = interactive.gaussian_fits_at_separation(a, w)
    # forward KL to a Gaussian is moment matching: mean 0, variance w^2 + a^2 (closed form)
    assert got["forward"]["mu"] == pytest.approx(0.0, abs=1e-6)
    assert got["forward"]["sigma"] == pytest.approx(math.sqrt(w * w + a * a), rel=1e-6)
    # the reverse fit is a local minimum of KL(Q||P): no neighbour on a small cross is lower
    grid = fitting.make_grid(-20.0, 20.0, 8001)

    def log_p(x):
        return fitting.gaussian_mixture_logpdf(x, [0.5, 0.5], [-a, a], [w, w])

    mu, sigma = got["reverse"]["mu"], got["reverse"]["sigma"]
    here = fitting.divergence_to_gaussian(log_p, mu, sigma, "reverse", grid=grid)
    assert here == pytest.approx(got["reverse"]["kl_qp"], abs=1e-12)
    for dm, ds in ((1e-2, 0), (-1e-2, 0), (0, 1e-2), (0, -1e-2)):
        assert fitting.divergence_to_gaussian(log_p, mu + dm, sigma + ds, "reverse", grid=grid) >= here - 1e-9
    # far peaks: the reverse fit sits on the right peak; close peaks: in the middle
    if a >= 2.0:
        assert abs(mu - a) < 0.15 and abs(sigma - w) < 0.15, got["reverse"]
    if a <= 1.5:
        assert abs(mu) < 1e-3, got["reverse"]
    # the forward fit is the global minimum of KL(P||Q) (convex in the natural parameters);
    # the mode-locked reverse fit is only a local minimum of KL(Q||P) (chapter 2)
    assert got["reverse"]["kl_pq"] >= got["forward"]["kl_pq"] - 1e-9


def test_gaussian_fits_name_bad_arguments():
    with pytest.raises(ValueError, match="half_separation"):
        interactive.gaussian_fits_at_separation(-1.0)
    with pytest.raises(ValueError, match="width"):
        interactive.gaussian_fits_at_separation(1.0, width=0.0)


def test_compact_png_keeps_the_picture_and_its_record():
    import io

    from PIL import Image

    from klbook_lib import display

    fig = _draw(1.0)
    try:
        full = display.annotated_png(fig, "wide")
    finally:
        plt.close(fig)
    small = interactive.compact_png(full)
    assert len(small) < 0.6 * len(full), (len(small), len(full))
    assert png_info(small) == png_info(full)
    a = np.asarray(Image.open(io.BytesIO(full)).convert("RGB"), dtype=float)
    b = np.asarray(Image.open(io.BytesIO(small)).convert("RGB"), dtype=float)
    assert a.shape == b.shape and np.abs(a - b).mean() < 2.0      # the same picture, a few levels off
    with pytest.raises(ValueError, match="colours"):
        interactive.compact_png(full, 1)
