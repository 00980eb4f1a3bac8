"""One citation style for the whole book: author-year in the text and in the bibliography.

sphinxcontrib-bibtex formats the bibliography with a pybtex style and the in-text
citations with a "referencing" style; out of the box the two disagree (author-year in
the text, numbers [1]-[29] in the bibliography). This extension registers

- ``klbook`` (pybtex formatting style): entries sorted by author, year and title,
  each labelled "Author, Year", "Author and Other, Year" or "Author et al., Year",
  with a letter after the year where two entries would otherwise share a label
  (2022a, 2022b); every entry ends with its DOI and/or URL as a link (an arXiv URL is
  shown as ``arXiv:ID``);
- ``klbook_author_year`` (referencing style): ``{cite}``/``{cite:p}`` print exactly the
  bibliography's label, ``{cite:t}`` prints "Author et al. [Year]" with the same year
  (letter included), so a reader finds the text's label in the bibliography verbatim.

Selected in ``_config.yml`` with ``bibtex_default_style: klbook`` and
``bibtex_reference_style: klbook_author_year``.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from pathlib import Path
from dataclasses import dataclass, field
from typing import Iterable, List

from pybtex.plugin import register_plugin as register_pybtex_plugin
from pybtex.richtext import HRef, Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting import BaseSortingStyle
from pybtex.style.template import node, sentence

ARXIV_ABS = re.compile(r"^https?://arxiv\.org/abs/([0-9]{4}\.[0-9]{4,5}|[a-z-]+(?:\.[A-Z]{2})?/[0-9]{7})(v[0-9]+)?$")


# ---------------------------------------------------------------- names and labels

def _plain(latex: str) -> str:
    """A LaTeX fragment from a .bib file as plain Unicode text ({\\'a} -> á, braces dropped)."""
    return Text.from_latex(latex).render_as("text")


def _last_name(person) -> str:
    return _plain(" ".join(person.prelast_names + person.last_names))


def _persons(entry):
    return entry.persons.get("author") or entry.persons.get("editor") or []


def label_authors(entry) -> str:
    """The author part of an entry's label: 'A', 'A and B' or 'A et al.'."""
    persons = list(_persons(entry))
    if not persons:
        title = _plain(entry.fields.get("title", entry.key))
        return " ".join(title.split()[:3])
    others = any(_last_name(p).lower() == "others" for p in persons)
    persons = [p for p in persons if _last_name(p).lower() != "others"]
    names = [_last_name(p) for p in persons]
    if len(names) >= 3 or (others and names):
        return f"{names[0]} et al."
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    return names[0]


def label_year(entry) -> str:
    return _plain(entry.fields.get("year", "")).strip() or "n.d."


def split_label(label: str) -> tuple[str, str]:
    """'Huang et al., 2022a' -> ('Huang et al.', '2022a')."""
    authors, _, year = label.rpartition(", ")
    return authors, year


def _ascii_fold(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", s) if not unicodedata.combining(c)).lower()


class AuthorYearSortingStyle(BaseSortingStyle):
    """By the authors' last names (accents folded), then year, then title."""

    def sorting_key(self, entry):
        names = tuple(_ascii_fold(_last_name(p)) for p in _persons(entry))
        return (names or (_ascii_fold(_plain(entry.fields.get("title", ""))),),
                label_year(entry), _ascii_fold(_plain(entry.fields.get("title", ""))))


class AuthorYearLabelStyle(BaseLabelStyle):
    """'Author, Year' labels; a, b, ... after the year where labels would collide."""

    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        bases = [(label_authors(e), label_year(e)) for e in entries]
        count = Counter(bases)
        seen: Counter = Counter()
        for base in bases:
            authors, year = base
            if count[base] > 1:
                year = year + chr(ord("a") + seen[base])
                seen[base] += 1
            yield f"{authors}, {year}"


# ---------------------------------------------------------------- the bibliography entries

@node
def web_links(children, data):
    """The entry's DOI and URL as links: 'doi:10.1/x', 'arXiv:1707.06347' or the URL itself."""
    entry = data["entry"]
    links = []
    doi = entry.fields.get("doi", "").strip()
    url = entry.fields.get("url", "").strip()
    if doi:
        links.append(HRef(f"https://doi.org/{doi}", f"doi:{doi}"))
    if url:
        m = ARXIV_ABS.match(url)
        links.append(HRef(url, f"arXiv:{m.group(1)}" if m else url))
    return Text(", ").join(links) if links else Text()


class KlbookStyle(UnsrtStyle):
    """pybtex's unsrt entry layout, author-year labels and order, DOI/URL links at the end."""

    default_label_style = "klbook_author_year"
    default_sorting_style = "klbook_author_year"

    def format_web_refs(self, e):
        return sentence[web_links]


# ---------------------------------------------------------------- in-text citations

def _make_reference_style():
    """Built lazily: sphinxcontrib-bibtex's modules import Sphinx."""
    from sphinxcontrib.bibtex.style.referencing import (
        BaseReferenceStyle,
        BracketStyle,
        GroupReferenceStyle,
    )
    from sphinxcontrib.bibtex.style.referencing.extra_empty import ExtraEmptyReferenceStyle
    from sphinxcontrib.bibtex.style.referencing.extra_label import ExtraLabelReferenceStyle
    from sphinxcontrib.bibtex.style.template import entry_label, join, join2, post_text, pre_text, reference

    @node
    def label_author_part(children, data):
        return Text(split_label(data["formatted_entry"].label)[0])

    @node
    def label_year_part(children, data):
        return Text(split_label(data["formatted_entry"].label)[1])

    @dataclass
    class Parenthetical(BaseReferenceStyle):
        """{cite}, {cite:p}: '[Kullback and Leibler, 1951]', the bibliography's own label.

        Several keys: '[Ziegler et al., 2019; Ouyang et al., 2022]'.
        """

        bracket: BracketStyle = field(default_factory=lambda: BracketStyle(sep="; "))

        def role_names(self) -> Iterable[str]:
            return [f"{alt}p{full}" for alt in ("", "al") for full in ("", "s")]

        def outer(self, role_name: str, children: List) -> object:
            return self.bracket.outer(children, brackets="al" not in role_name, capfirst=False)

        def inner(self, role_name: str) -> object:
            return join2(sep1=" ", sep2=", ")[pre_text, reference[entry_label], post_text]

    @dataclass
    class Textual(BaseReferenceStyle):
        """{cite:t}: 'Kullback and Leibler [1951]' (the year as in the label, letter included)."""

        bracket: BracketStyle = field(default_factory=BracketStyle)

        def role_names(self) -> Iterable[str]:
            return [f"{cap}t{full}" for cap in ("", "c") for full in ("", "s")]

        def outer(self, role_name: str, children: List) -> object:
            return self.bracket.outer(children, brackets=False, capfirst="c" in role_name)

        def inner(self, role_name: str) -> object:
            return join(sep=" ")[
                label_author_part,
                join[self.bracket.left,
                     join2(sep1=" ", sep2=", ")[pre_text, reference[label_year_part], post_text],
                     self.bracket.right],
            ]

    @dataclass
    class Author(BaseReferenceStyle):
        bracket: BracketStyle = field(default_factory=BracketStyle)

        def role_names(self) -> Iterable[str]:
            return ["author", "authors", "cauthor", "cauthors", "authorpar", "authorpars"]

        def outer(self, role_name: str, children: List) -> object:
            return self.bracket.outer(children, brackets="par" in role_name, capfirst=role_name.startswith("c"))

        def inner(self, role_name: str) -> object:
            return reference[label_author_part]

    @dataclass
    class Year(BaseReferenceStyle):
        bracket: BracketStyle = field(default_factory=BracketStyle)

        def role_names(self) -> Iterable[str]:
            return ["year", "yearpar"]

        def outer(self, role_name: str, children: List) -> object:
            return self.bracket.outer(children, brackets="par" in role_name, capfirst=False)

        def inner(self, role_name: str) -> object:
            return reference[label_year_part]

    @dataclass
    class KlbookAuthorYearReferenceStyle(GroupReferenceStyle):
        def __post_init__(self):
            self.styles.extend([Parenthetical(), Textual(), Author(), Year(),
                                ExtraLabelReferenceStyle(), ExtraEmptyReferenceStyle()])
            super().__post_init__()

    return KlbookAuthorYearReferenceStyle


def register() -> None:
    """Make the styles known to pybtex (and to sphinxcontrib-bibtex, when it is installed)."""
    register_pybtex_plugin("pybtex.style.formatting", "klbook", KlbookStyle, force=True)
    register_pybtex_plugin("pybtex.style.labels", "klbook_author_year", AuthorYearLabelStyle, force=True)
    register_pybtex_plugin("pybtex.style.sorting", "klbook_author_year", AuthorYearSortingStyle, force=True)
    try:
        from sphinxcontrib.bibtex.plugin import register_plugin
    except ImportError:  # pragma: no cover - the book's requirements provide it
        return
    register_plugin("sphinxcontrib.bibtex.style.referencing", "klbook_author_year",
                    _make_reference_style(), force=True)


def _static_path(app, config) -> None:
    static = str(Path(__file__).resolve().parent / "static")
    if static not in config.html_static_path:
        config.html_static_path = list(config.html_static_path) + [static]


def setup(app):
    register()
    app.connect("config-inited", _static_path)
    app.add_css_file("klbook-bib.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
