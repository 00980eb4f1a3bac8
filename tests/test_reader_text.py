"""_ext/klbook_reader.py: figure alt text made from captions, formulas read as plain text
(issue 38). The checks over the built pages are in tests/test_browser.py."""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "_ext"))
_spec = importlib.util.spec_from_file_location("klbook_reader_for_alt_tests", ROOT / "_ext" / "klbook_reader.py")
reader = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reader)

# what an alt text must never hold: a backslash, TeX words that lost their backslash,
# TeX braces after a sub/superscript, a dollar, a trailing ellipsis (a cut)
TEX_LEFTOVER = re.compile(r"\\|\$|[_^]\{|\b(?:mathrm|mathcal|mathbb|mathbf|operatorname|tfrac|dfrac|frac|infty|"
                          r"varepsilon|cdot|ldots|sqrt[A-Za-z0-9]|text\{|left[(\[|]|right[)\]|]|qquad|quad)\b")
TRAILING_CUT = re.compile(r"(\u2026|\.\.\.)\s*$")


@pytest.mark.parametrize("tex,plain", [
    (r"$q\to 0$", "q \u2192 0"),
    (r"$95\,\%$ bootstrap", "95 % bootstrap"),
    (r"$95\%$", "95%"),
    (r"$-\infty$", "-\u221e"),
    (r"$\sqrt{B}$", "sqrt(B)"),
    (r"$k_2=\tfrac12(\log r)^2$", "k_2=1/2 (log r)^2"),
    (r"$D_{\mathrm{KL}}(\pi_\theta\|\pi_{\text{ref}})$", "D_KL(pi_theta||pi_ref)"),
    (r"$D_{\mathrm{KL}}(\pi(\cdot|s)\,\|\,u)$", "D_KL(pi(\u00b7|s) || u)"),
    (r"$\varepsilon$ and $\beta$", "epsilon and beta"),
    (r"$\operatorname{tr}F$", "tr F"),
    (r"$\frac{a+b}{2}$", "(a+b)/2"),
    (r"$s^2\ge 2$", "s^2 \u2265 2"),
    (r"$\pm2$", "\u00b1 2"),
    (r"$d(\alpha_{\mathrm{bon}}-\beta_{\mathrm{bon}}d)$", "d(alpha_bon-beta_bon d)"),
    (r"$n=1,2,4,\dots,m$", "n=1,2,4,...,m"),
    (r"$\mathcal N(0, 0.5^2)$", "N(0, 0.5^2)"),
    (r"\pi^*_\beta", "pi^*_beta"),  # a caption's math node gives its TeX without dollars
])
def test_plain_text_reads_formulas_as_words_or_symbols(tex, plain):
    assert reader.plain_text(tex) == plain


def test_whole_sentences_never_cuts_a_sentence():
    text = "First sentence is here. Second one, with 0.5 and e.g. a number. Third sentence ends it."
    assert reader.whole_sentences(text, 300) == text
    assert reader.whole_sentences(text, 70) == "First sentence is here. Second one, with 0.5 and e.g. a number."
    assert reader.whole_sentences(text, 30) == "First sentence is here."
    long_first = "word " * 80 + "end."
    assert reader.whole_sentences(long_first, 50) == long_first.strip()   # kept whole, not cut
    assert reader.whole_sentences("\u7b2c\u4e00\u53e5\u3002\u7b2c\u4e8c\u53e5\u3002" * 20, 10) == "\u7b2c\u4e00\u53e5\u3002\u7b2c\u4e8c\u53e5\u3002"
    with pytest.raises(ValueError, match="limit"):
        reader.whole_sentences("x", 3)


def test_caption_nodes_with_math_become_plain_alt_text():
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    doc = new_document("t", get_default_settings(Parser))
    figure = nodes.figure()
    image = nodes.image(uri="_build/jupyter_execute/a.png")
    caption = nodes.caption()
    caption += [nodes.Text("The KL "), nodes.math(text=r"D_{\mathrm{KL}}(\pi_\theta\|\pi_{\mathrm{ref}})"),
                nodes.Text(" as "), nodes.math(text=r"q\to 0"), nodes.Text(". " + "A long second sentence. " * 20)]
    caption2 = nodes.caption()
    caption2 += [nodes.Text("The adaptive-"), nodes.math(text=r"\beta"), nodes.Text(" rule.")]
    assert reader.caption_text(caption2) == "The adaptive-beta rule."
    figure += [image, caption]
    doc += figure
    assert reader.set_alt_texts(doc, "Chapter") == 1
    alt = image["alt"]
    assert alt.startswith("The KL D_KL(pi_theta||pi_ref) as q \u2192 0. A long second sentence."), alt
    assert len(alt) <= reader.ALT_MAX and alt.endswith(".") and not TRAILING_CUT.search(alt)


def _captions() -> list[tuple[str, str]]:
    found = []
    for path in sorted(ROOT.glob("chapters/*.ipynb")) + sorted(ROOT.glob("exercises/*.ipynb")):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            source = "".join(cell["source"])
            for match in re.finditer(r"```\{(?:glue:figure|figure)\}[^\n]*\n(.*?)```", source, re.S):
                body = " ".join(l for l in match.group(1).splitlines() if not l.startswith(":")).strip()
                body = re.sub(r"\{[a-z:]+\}`[^`]*`", "X", body)   # roles become text or links in the build
                if body:
                    found.append((path.name, body))
    return found


def test_every_caption_of_the_book_gives_a_plain_uncut_alt_text():
    captions = _captions()
    assert len(captions) >= 40, f"expected the book's figure captions, found {len(captions)}"
    bad = []
    for name, caption in captions:
        alt = reader.whole_sentences(reader.plain_text(caption))
        if TEX_LEFTOVER.search(alt) or TRAILING_CUT.search(alt) or not alt:
            bad.append(f"{name}: {alt!r}")
        if alt != reader.plain_text(caption).strip() and not alt.endswith((".", "!", "?")):
            bad.append(f"{name}: cut mid-sentence: {alt!r}")
    assert not bad, "\n".join(bad)
