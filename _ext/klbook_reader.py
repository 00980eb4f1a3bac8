"""Reading the book on a phone, and reading less code (issue 24).

Loaded by ``klbook_offline`` (the local extension named in ``_config.yml``). The browser
side is ``_static/klbook.js`` and ``_static/klbook.css``; this module does what has to
happen while the pages are built.

* **Figures have real alt text.** Sphinx writes an image's file path as its ``alt`` when
  the image has none, which is what every notebook figure (a glued or plain matplotlib
  output) gets. A post-transform gives each image inside a figure the figure's caption
  as its alt text, and an image outside a figure (a plot shown by a code cell) a
  sentence naming the section it is in. An alt an author wrote is kept, unless it is a
  file path.
* **Verification code behind a fold.** A code cell tagged ``klbook-check`` (see
  ``tools/fold_checks.py``, which tags the cells that are mostly ``assert`` and
  ``glue(`` bookkeeping) is shown with its source collapsed behind a "Show the check"
  toggle, like myst-nb's ``hide-input`` but with its own words and class
  (``klbook-check``), so that the "show code" toggles of plotting cells stay as they are.
* **Multi-panel figures for phones.** ``kb.display.glue_figure(name, fig)`` glues a
  second rendering of a figure whose panels sit side by side, with the panels stacked,
  under ``name + "--phone"``. The ``glue:figure`` directive (replaced here by a subclass
  of myst-nb's) looks that key up: when the page has it, the figure's image becomes
  ``<picture><source media="(max-width: 640px)" srcset="PHONE.png"><img src="WIDE.png"
  alt="..."></picture>``, so a phone loads the stacked panels and everything wider (and
  the PDF, printed at 860 px) the wide one. The phone PNG is never an ``<img>`` of its
  own; a glued key is never shown unless a directive names it. Other builders (LaTeX)
  keep only the wide image.
* **Search ranks the chapters first.** ``_static/klbook-scorer.js`` is Sphinx's
  ``html_search_scorer``: a hit in a chapter ranks above the same hit in an exercise
  notebook.
* **The repository where the text asks for it.** The role ``{klbook-repo}`text``` links
  ``text`` to the repository named at build time (``make book REPO_URL=...``, see
  ``klbook_publish``); without one it is plain text followed by where the sources come
  from instead.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHECK_TAG = "klbook-check"
CHECK_SHOW, CHECK_HIDE = "Show the check", "Hide the check"
ALT_MAX = 300
_IMAGE_SUFFIX = re.compile(r"\.(png|jpe?g|gif|svg|webp|pdf)$", re.IGNORECASE)


# ----------------------------------------------------------------------- alt text
def alt_is_missing(alt: str | None, uri: str | None = None) -> bool:
    """True when ``alt`` says nothing a reader can use: empty, the image's URI, or a path."""
    text = (alt or "").strip()
    if not text:
        return True
    if uri and text == str(uri).strip():
        return True
    if not re.search(r"\s", text) and ("/" in text or "\\" in text or _IMAGE_SUFFIX.search(text)):
        return True
    return bool(_IMAGE_SUFFIX.search(text) and ("/" in text or "\\" in text))


_GREEK = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
          "upsilon phi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega").split()
# control words read as a word (Greek letters, operators named by a word) ...
_WORDS = {**{g: g for g in _GREEK}, "varepsilon": "epsilon", "vartheta": "theta", "varphi": "phi",
          "varrho": "rho", "varsigma": "sigma", "log": "log", "ln": "ln", "exp": "exp", "min": "min",
          "max": "max", "arg": "arg", "argmax": "argmax", "argmin": "argmin", "sup": "sup", "inf": "inf",
          "lim": "lim", "sum": "sum", "prod": "prod", "int": "integral", "nabla": "nabla", "partial": "d",
          "det": "det", "tr": "tr", "sin": "sin", "cos": "cos", "tanh": "tanh", "Pr": "Pr",
          "sqrt": "sqrt", "ell": "l", "mathbb": "", "E": "E"}
# ... or as a plain symbol
_SYMBOLS = {"to": "\u2192", "rightarrow": "\u2192", "leftarrow": "\u2190", "mapsto": "\u21a6",
            "Rightarrow": "\u21d2", "iff": "\u21d4", "implies": "\u21d2",
            "le": "\u2264", "leq": "\u2264", "ge": "\u2265", "geq": "\u2265", "ne": "\u2260", "neq": "\u2260",
            "approx": "\u2248", "sim": "~", "simeq": "\u2243", "equiv": "\u2261", "propto": "\u221d",
            "ll": "\u226a", "gg": "\u226b", "pm": "\u00b1", "mp": "\u2213", "times": "\u00d7",
            "cdot": "\u00b7", "cdots": "...", "ldots": "...", "dots": "...", "dotsc": "...", "dotsb": "...",
            "infty": "\u221e", "star": "*", "ast": "*", "circ": "\u2218", "in": "\u2208", "notin": "\u2209",
            "subset": "\u2282", "subseteq": "\u2286", "cup": "\u222a", "cap": "\u2229", "mid": "|",
            "vert": "|", "lvert": "|", "rvert": "|", "Vert": "||", "lVert": "||", "rVert": "||",
            "langle": "\u27e8", "rangle": "\u27e9", "forall": "for all", "exists": "there is",
            "prime": "'", "top": "T", "emptyset": "\u2205", "setminus": "\\", "perp": "\u22a5",
            "lfloor": "\u230a", "rfloor": "\u230b", "lceil": "\u2308", "rceil": "\u2309",
            "colon": ":", "mathbb": ""}
_DROP = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "displaystyle",
         "textstyle", "limits", "nolimits", "quad", "qquad", "nonumber", "notag", "label"}
_UNWRAP = ("mathrm", "text", "textrm", "textit", "textbf", "mathbf", "mathit", "mathsf", "mathtt", "operatorname",
           "mathcal", "mathbb", "boldsymbol", "bm", "mathscr", "mathfrak", "emph", "mbox", "hbox")
_ACCENTS = {"hat": "hat ", "widehat": "hat ", "tilde": "tilde ", "widetilde": "tilde ", "bar": "bar ",
            "overline": "bar ", "vec": "", "dot": "dot "}
_CONTROL_WORD = re.compile(r"\\[A-Za-z]+")


def _group(text: str, start: int) -> tuple[str, int]:
    """The TeX argument at ``text[start:]`` (a ``{...}`` group or one character) and where it ends."""
    while start < len(text) and text[start] == " ":
        start += 1
    if start >= len(text):
        return "", start
    if text[start] == "{":
        depth = 0
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start + 1:i], i + 1
        return text[start + 1:], len(text)
    if text[start] == "\\":
        match = _CONTROL_WORD.match(text, start)
        if match:
            return match.group(0), match.end()
        return text[start:start + 2], start + 2
    return text[start], start + 1


def _compound(text: str) -> bool:
    return len(text.strip()) > 1 and bool(re.search(r"[\s+\-*/=<>,]", text.strip()))


def _math_text(tex: str) -> str:
    """One TeX formula as plain text: ``\\pi_{\\mathrm{ref}}`` -> ``pi_ref``, ``q\\to 0`` -> ``q → 0``,
    ``\\tfrac12(\\log r)^2`` -> ``1/2 (log r)^2``, ``\\sqrt{B}`` -> ``sqrt(B)``."""
    out: list[str] = []
    i = 0
    n = len(tex)

    def emit_word(word: str, symbol: bool) -> None:
        prev = "".join(out)[-1:] if out else ""
        if word and prev and (prev.isalnum() or prev in ")]") and not prev == "_" and not prev == "^":
            out.append(" ")
        out.append(word)
        nxt = tex[j:j + 1] if j < n else ""
        if word and nxt.isalnum():
            out.append(" ")

    while i < n:
        ch = tex[i]
        if ch == "\\":
            match = _CONTROL_WORD.match(tex, i)
            if not match:                       # \, \; \! \| \% \{ \} \\ and the like
                nxt = tex[i + 1:i + 2]
                out.append({"|": "||", "%": "%", "{": "{", "}": "}", "_": "_", "&": "&", "#": "#", "$": "$",
                            ",": " ", ";": " ", ":": " ", " ": " ", "!": "", "\\": " "}.get(nxt, ""))
                i += 2
                continue
            name = match.group(0)[1:]
            j = match.end()
            if name in _UNWRAP:
                arg, j = _group(tex, j)
                inner = _math_text(arg)
                out.append(inner)
                if j < n and tex[j].isalnum() and not "".join(out).endswith(" "):
                    out.append(" ")
            elif name in ("frac", "tfrac", "dfrac", "cfrac"):
                num, j = _group(tex, j)
                den, j = _group(tex, j)
                num, den = _math_text(num), _math_text(den)
                text = (f"({num})" if _compound(num) else num) + "/" + (f"({den})" if _compound(den) else den)
                prev = "".join(out)[-1:]
                if prev and (prev.isalnum() or prev in ")]"):
                    out.append(" ")
                out.append(text)
                if j < n and (tex[j].isalnum() or tex[j] == "("):
                    out.append(" ")
            elif name == "sqrt":
                arg, j = _group(tex, j)
                out.append(f"sqrt({_math_text(arg)})")
            elif name in _ACCENTS:
                arg, j = _group(tex, j)
                out.append(_ACCENTS[name] + _math_text(arg))
            elif name in _DROP:
                if name == "label":
                    _, j = _group(tex, j)
                elif name in ("quad", "qquad"):
                    out.append(" ")
            elif name in _SYMBOLS:
                emit_word(_SYMBOLS[name], True)
            else:
                emit_word(_WORDS.get(name, name), False)
            i = j
        elif ch in "_^":
            arg, j = _group(tex, i + 1)
            inner = _math_text(arg)
            out.append(ch + (f"({inner})" if _compound(inner) else inner))
            if j < n and tex[j].isalnum():
                out.append(" ")
            i = j
        elif ch in "{}":
            i += 1
        elif ch == "&":
            out.append(" ")
            i += 1
        else:
            out.append(ch)
            i += 1
    return re.sub(r"\s+", " ", "".join(out)).strip()


_MATH = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)


def plain_text(tex_text: str) -> str:
    """Caption text for an alt attribute: every formula turned into words or plain symbols.

    ``$D_{\\mathrm{KL}}(p\\|q)$ against $\\beta$`` -> ``D_KL(p||q) against beta``;
    ``$q\\to 0$`` -> ``q → 0``; ``$95\\,\\%$`` -> ``95 %``; ``$-\\infty$`` -> ``-∞``. Text outside
    ``$...$`` that still holds TeX (a caption whose math nodes were flattened to their
    source) is read as a formula too. No backslash and no TeX control word is left.
    """
    text = _MATH.sub(lambda m: _math_text(next(g for g in m.groups() if g is not None)), tex_text)
    if "\\" in text or re.search(r"[_^]\{", text):
        text = _math_text(text)
    return re.sub(r"\s+", " ", text.replace("\\", " ")).strip()


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\u201c\"'])|(?<=[\u3002\uff01\uff1f])")


def whole_sentences(text: str, limit: int = ALT_MAX) -> str:
    """The first sentences of ``text`` that fit in ``limit`` characters, never a sentence
    cut in the middle (the first sentence is kept whole even when it is longer)."""
    if limit < 10:
        raise ValueError(f"limit: expected at least 10 characters, got {limit}")
    text = text.strip()
    if len(text) <= limit:
        return text
    parts = [p for p in _SENTENCE_END.split(text) if p.strip()]
    kept = parts[0].strip()
    for part in parts[1:]:
        joiner = "" if re.search(r"[\u3002\uff01\uff1f]$", kept) else " "
        if len(kept) + len(joiner) + len(part.strip()) > limit:
            break
        kept += joiner + part.strip()
    return kept


def shorten(text: str, limit: int = ALT_MAX) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters (an ellipsis marks a cut)."""
    if limit < 10:
        raise ValueError(f"limit: expected at least 10 characters, got {limit}")
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "\u2026"


def caption_text(caption) -> str:
    """The text of a caption node with its formulas (math nodes, or ``$...$`` left in the
    text) read as plain text (:func:`plain_text`)."""
    from docutils import nodes

    parts = []
    for node in caption.findall(lambda n: isinstance(n, (nodes.Text, nodes.math))):
        if isinstance(node, nodes.math):
            parts.append(_math_text(node.astext()))   # the text around it carries the spaces
        elif not any(isinstance(p, nodes.math) for p in _ancestors(node, caption)):
            parts.append(plain_text(str(node)) if ("$" in str(node) or "\\" in str(node)) else str(node))
    text = "".join(parts)
    text = re.sub(r"\s+([,.;:!?)])", r"\1", re.sub(r"([(])\s+", r"\1", text))
    return re.sub(r"\s+", " ", text).strip()


def _ancestors(node, stop):
    parent = node.parent
    while parent is not None and parent is not stop:
        yield parent
        parent = parent.parent


def _figure_alt(figure) -> str:
    from docutils import nodes

    for child in figure.children:
        if isinstance(child, nodes.caption):
            return whole_sentences(caption_text(child))
    return ""


def _section_title(node) -> str:
    from docutils import nodes

    parent = node.parent
    while parent is not None:
        if isinstance(parent, nodes.section):
            for child in parent.children:
                if isinstance(child, nodes.title):
                    return plain_text(child.astext())
        parent = parent.parent
    return ""


def set_alt_texts(document, page_title: str = "") -> int:
    """Give every image of ``document`` a non-path alt text; return how many were set.

    Inside a figure: the figure's caption with its formulas in words or plain symbols, its
    first whole sentences up to ``ALT_MAX`` characters (never cut mid-sentence).
    Elsewhere (a plot a code cell shows): "A plot computed on this page, in the section
    '<section title>'." An alt text that is not a path is left alone.
    """
    from docutils import nodes

    count = 0
    for image in list(document.findall(nodes.image)):
        if not alt_is_missing(image.get("alt"), image.get("uri")):
            continue
        alt = ""
        figure = image.parent
        while figure is not None and not isinstance(figure, nodes.figure):
            figure = figure.parent
        if figure is not None:
            alt = _figure_alt(figure)
        if not alt:
            where = _section_title(image) or page_title
            alt = (f"A plot computed on this page, in the section \u2018{where}\u2019."
                   if where else "A plot computed on this page by the code cell above it.")
        image["alt"] = alt
        count += 1
    return count


# ----------------------------------------------------------------------- check folds
def fold_check_cells(document) -> int:
    """Collapse the source of every code cell tagged ``klbook-check``; return how many.

    Runs before myst-nb's ``HideInputCells`` (priority 199), which wraps the source in a
    ``<details>`` with the prompts set here. A cell also tagged ``hide-output`` keeps its
    output hidden too.
    """
    from docutils import nodes

    count = 0
    for node in document.findall(nodes.container):
        if node.get("nb_element") != "cell_code":
            continue
        classes = node.get("classes", [])
        if f"tag_{CHECK_TAG}" not in classes:
            continue
        mode = node.get("hide_mode")
        if mode in ("all", "input", "input+output"):
            pass
        elif mode == "output":
            node["hide_mode"] = "input+output"
        else:
            node["hide_mode"] = "input"
        node["prompt_show"] = CHECK_SHOW
        node["prompt_hide"] = CHECK_HIDE
        if "klbook-check" not in classes:
            classes.append("klbook-check")
        count += 1
    return count


def _make_post_transforms():
    from sphinx.transforms.post_transforms import SphinxPostTransform

    class FoldChecks(SphinxPostTransform):
        default_priority = 190  # before myst-nb's HideInputCells (199)
        formats = ("html",)

        def run(self, **kwargs):
            fold_check_cells(self.document)

    class FigureAltText(SphinxPostTransform):
        default_priority = 900  # after every paste of a glued figure

        def run(self, **kwargs):
            title = ""
            env = getattr(self, "env", None)
            docname = self.document.get("docname") or (env.docname if env else "")
            if env is not None and docname in getattr(env, "titles", {}):
                title = plain_text(env.titles[docname].astext())
            set_alt_texts(self.document, title)

    return FoldChecks, FigureAltText


# ----------------------------------------------------------------------- sharp figures
HIDPI_CLASS = "klbook-hidpi"


def png_scale_and_width(path) -> tuple[float, int] | None:
    """``(scale, pixel width)`` of a PNG that ``kb.display.glue_figure`` drew at ``scale``
    times its figure's dpi (its ``klbook`` tEXt record), or ``None`` for any other file."""
    import json
    import struct

    try:
        with open(path, "rb") as handle:
            head = handle.read(65536)
    except OSError:
        return None
    if not head.startswith(b"\x89PNG\r\n\x1a\n") or head[12:16] != b"IHDR":
        return None
    width = struct.unpack(">I", head[16:20])[0]
    pos = 8
    while pos + 8 <= len(head):
        length, kind = struct.unpack(">I4s", head[pos:pos + 8])
        body = head[pos + 8:pos + 8 + length]
        if kind == b"IDAT":
            break
        if kind == b"tEXt" and body.startswith(b"klbook\0"):
            try:
                scale = float(json.loads(body.split(b"\0", 1)[1].decode("latin-1")).get("scale", 1))
            except (ValueError, AttributeError):
                return None
            return scale, width
        pos += 12 + length
    return None


def _image_file(app, image):
    uri = image.get("candidates", {}).get("*") or image.get("uri") or ""
    if not uri or "://" in uri or uri.startswith("data:"):
        return None
    path = Path(uri)
    return path if path.is_absolute() else Path(app.srcdir) / uri


def set_hidpi_widths(app, document) -> int:
    """Give every image drawn at 2x (``png_scale_and_width``) a CSS width of its pixel
    width / scale, so that it shows at its figure's size with twice the pixels; return how many."""
    count = 0
    for image in document.findall(_nodes.image):
        if image.get("width") or PHONE_CLASS in image.get("classes", []):
            continue
        path = _image_file(app, image)
        found = png_scale_and_width(path) if path is not None else None
        if not found or found[0] <= 1:
            continue
        scale, width = found
        image["width"] = f"{round(width / scale)}px"
        image["classes"] = list(image.get("classes", [])) + [HIDPI_CLASS, "no-scaled-link"]  # no <a> around it
        count += 1
    return count


def _make_hidpi_transform():
    from sphinx.transforms.post_transforms import SphinxPostTransform

    class HighDensityImages(SphinxPostTransform):
        """HTML only: a 2x PNG shows at its figure's CSS size (``set_hidpi_widths``)."""

        default_priority = 905
        formats = ("html",)

        def run(self, **kwargs):
            set_hidpi_widths(self.app, self.document)

    return HighDensityImages


# ----------------------------------------------------------------------- phone figures
PHONE_SUFFIX = "--phone"          # klbook_lib.display.PHONE_SUFFIX
PHONE_MEDIA = "(max-width: 640px)"
PHONE_CLASS = "klbook-phone-rendering"

from docutils import nodes as _nodes  # noqa: E402  (the node class must live at module level)


class klbook_picture(_nodes.General, _nodes.Element):  # noqa: N801 (docutils names nodes in lower case)
    """A figure's image with its phone rendering: children ``[wide image, phone image]``.

    HTML: ``<picture class="klbook-picture"><source media=PHONE_MEDIA srcset=phone><img
    wide></picture>``. Both images are ordinary ``image`` nodes, so Sphinx copies both
    PNGs to ``_images``.
    """


def _images_of(node) -> tuple:
    wide = phone = None
    for child in node.children:
        if isinstance(child, _nodes.image):
            if PHONE_CLASS in child.get("classes", []):
                phone = phone or child
            else:
                wide = wide or child
    return wide, phone


def _html_image_uri(translator, image) -> str:
    """The URI Sphinx's HTML writer gives ``image`` (``sphinx.writers.html5.visit_image``)."""
    import posixpath
    import urllib.parse

    uri = image["uri"]
    if uri in translator.builder.images:
        uri = posixpath.join(translator.builder.imgpath, urllib.parse.quote(translator.builder.images[uri]))
    return uri


def _visit_picture_html(self, node) -> None:
    from html import escape

    wide, phone = _images_of(node)
    if wide is None:
        raise _nodes.SkipNode
    if phone is None:
        wide.walkabout(self)
        raise _nodes.SkipNode
    self.body.append('<picture class="klbook-picture">')
    self.body.append(f'<source media="{escape(PHONE_MEDIA)}" srcset="{escape(_html_image_uri(self, phone))}" '
                     f'type="image/png" />')
    wide.walkabout(self)
    self.body.append("</picture>\n")
    raise _nodes.SkipNode


def _depart_picture(self, node) -> None:  # pragma: no cover - visits always skip
    pass


def add_phone_rendering(figure, phone_nodes) -> bool:
    """Put the first image of ``phone_nodes`` beside the first image of ``figure``.

    The figure's image is replaced by a :class:`klbook_picture` holding it and the phone
    image (marked with ``PHONE_CLASS``). Returns whether it did.
    """
    wide = next(iter(figure.findall(_nodes.image)), None)
    phone = next((n for root in phone_nodes for n in root.findall(_nodes.image)), None)
    if wide is None or phone is None or isinstance(wide.parent, klbook_picture):
        return False
    phone["classes"] = [c for c in phone.get("classes", []) if c != PHONE_CLASS] + [PHONE_CLASS]
    for key in ("alt",):
        if wide.get(key) and not phone.get(key):
            phone[key] = wide[key]
    picture = klbook_picture()
    wide.replace_self(picture)
    picture += wide
    picture += phone
    return True


def _make_glue_figure_directive():
    from myst_nb.core.variables import RetrievalError, render_variable_outputs
    from myst_nb.ext.glue.directives import PasteFigureDirective
    from myst_nb.ext.glue.utils import retrieve_glue_data

    class PasteFigureWithPhone(PasteFigureDirective):
        """myst-nb's ``glue:figure``, which also shows ``KEY--phone`` below 640 px."""

        def run(self):
            result = super().run()
            figure = next((n for n in result if isinstance(n, _nodes.figure)), None)
            if figure is None:
                return result
            try:
                data = retrieve_glue_data(self.document, self.arguments[0] + PHONE_SUFFIX)
            except RetrievalError:
                return result  # a figure glued with glue(): one rendering
            phone_nodes = render_variable_outputs([data], self.document, self.line, self.source)
            add_phone_rendering(figure, phone_nodes)
            return result

    return PasteFigureWithPhone


def _make_unwrap_pictures():
    from sphinx.transforms.post_transforms import SphinxPostTransform

    class UnwrapPictures(SphinxPostTransform):
        """Builders other than HTML (LaTeX, text) keep only the wide image."""

        default_priority = 910

        def run(self, **kwargs):
            if getattr(self.app.builder, "format", "html") == "html":
                return
            for picture in list(self.document.findall(klbook_picture)):
                wide, _ = _images_of(picture)
                if wide is None:
                    picture.parent.remove(picture)
                else:
                    picture.replace_self(wide.deepcopy())

    return UnwrapPictures


def _register_glue_figure(app, config=None) -> None:
    if getattr(app, "_klbook_glue_figure", False):
        return
    if "glue" not in app.registry.domains:
        return
    app.add_directive_to_domain("glue", "figure", _make_glue_figure_directive(), override=True)
    app._klbook_glue_figure = True


# ----------------------------------------------------------------------- repository link
def _repo_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    from docutils import nodes

    url = (os.environ.get("KLBOOK_REPO_URL") or "").strip()
    if url:
        from klbook_publish import normalise_repo_url

        try:
            url = normalise_repo_url(url)
        except ValueError as exc:
            msg = inliner.reporter.error(str(exc), line=lineno)
            return [inliner.problematic(rawtext, rawtext, msg)], [msg]
        return [nodes.reference(rawtext, text, refuri=url, classes=["klbook-repo-link"])], []
    node = nodes.inline(rawtext, "", classes=["klbook-repo-text"])
    node += nodes.Text(text)
    node += nodes.Text(" (this copy of the site was built without naming it: ask whoever published "
                       "the site for its address; the notebooks and the library can be downloaded "
                       "from this site, see \u2018Running the notebooks yourself\u2019)")
    return [node], []


# ---------------------------------------------------------------------------- set-up
def _config_inited(app, config) -> None:
    if not config.html_search_scorer:
        config.html_search_scorer = str(HERE.parent / "_static" / "klbook-scorer.js")


def setup(app):
    fold, alt = _make_post_transforms()
    app.add_post_transform(fold)
    app.add_post_transform(alt)
    app.add_role("klbook-repo", _repo_role)
    app.connect("config-inited", _config_inited)
    app.add_node(klbook_picture, html=(_visit_picture_html, _depart_picture))
    app.add_post_transform(_make_unwrap_pictures())
    app.add_post_transform(_make_hidpi_transform())
    _register_glue_figure(app)  # myst-nb (loaded before the local extensions) has its glue domain
    app.connect("config-inited", _register_glue_figure)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
