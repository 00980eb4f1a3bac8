"""One citation style: author-year labels in the text and in the bibliography, every entry linked.

The file tests (every references.bib entry has a DOI or a URL; the label and sorting
rules on a small hand-made bibliography) run with the unit tests. The tests of the built
site (marked ``browser``: they need ``_build/html``) read bibliography.html and every
page that cites: each bibliography entry links to its DOI, arXiv or official page, and
each in-text citation prints exactly the label of the entry it links to.
"""
from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from bs4 import BeautifulSoup
from pybtex.database import parse_file, parse_string

ROOT = Path(__file__).resolve().parents[1]
BIB = ROOT / "references.bib"
HTML = ROOT / "_build" / "html"
sys.path.insert(0, str(ROOT / "_ext"))

import klbook_bib  # noqa: E402

DOI = re.compile(r"^10\.\d{4,9}/\S+$")
ARXIV = re.compile(r"^https://arxiv\.org/abs/\d{4}\.\d{4,5}$")
LABEL = re.compile(r"^(?P<authors>\S.*), (?P<year>\d{4}[a-z]?|n\.d\.)$")


def _entries():
    return parse_file(str(BIB)).entries


# ------------------------------------------------------------------ references.bib
def test_every_entry_has_a_doi_or_url():
    """New entries too: each needs `doi` (bare, 10.xxxx/...) or `url` (https://...)."""
    bad = []
    for key, entry in _entries().items():
        doi, url = entry.fields.get("doi", "").strip(), entry.fields.get("url", "").strip()
        if not doi and not url:
            bad.append(f"{key}: no doi and no url field")
        if doi and not DOI.match(doi):
            bad.append(f"{key}: doi {doi!r} is not a bare DOI such as 10.1214/aoms/1177729694")
        if url and not re.match(r"^https?://[^\s{}]+$", url):
            bad.append(f"{key}: url {url!r} is not an http(s) address")
        if "arxiv.org" in url and not ARXIV.match(url):
            bad.append(f"{key}: link the arXiv abstract page, https://arxiv.org/abs/NNNN.NNNNN, not {url!r}")
    assert not bad, "references.bib:\n" + "\n".join(bad)


def test_no_duplicate_keys():
    keys = re.findall(r"^@\w+\s*\{\s*([^,\s]+)\s*,", BIB.read_text(), flags=re.M)
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    assert not dupes, f"keys defined twice in references.bib: {dupes}"


# ------------------------------------------------------------------ the style itself
SAMPLE = r"""
@article{zeta, author = {Zeta, Anna}, title = {Alone}, journal = {J}, year = {2001}, url = {https://example.org/z}}
@article{two, author = {M{\"u}ller, Jan and Ab, Bo}, title = {Pair}, journal = {J}, year = {1999}, doi = {10.1000/x}}
@article{threeA, author = {Huang, Shengyi and Dossa, R. and Raffin, A.}, title = {Beta paper}, journal = {J}, year = {2022}, url = {https://arxiv.org/abs/2201.00001}}
@article{threeB, author = {Huang, Shengyi and Dossa, R. and Ye, C.}, title = {Alpha paper}, journal = {J}, year = {2022}, url = {https://example.org/b}}
@misc{others, author = {Touvron, Hugo and others}, title = {Many}, year = {2023}, url = {https://arxiv.org/abs/2307.09288}}
@book{edited, editor = {Csisz{\'a}r, Imre}, title = {Edited}, publisher = {P}, year = {1967}, url = {https://example.org/e}}
@misc{single, author = {Huang, Shengyi}, title = {Solo}, year = {2022}, url = {https://example.org/s}}
"""


def _formatted():
    klbook_bib.register()
    from pybtex.plugin import find_plugin

    style = find_plugin("pybtex.style.formatting", "klbook")()
    entries = style.sort(parse_string(SAMPLE, "bibtex").entries.values())
    labels = list(style.format_labels(entries))
    return [(e.key, label, style.format_entry(label, e)) for e, label in zip(entries, labels)]


def test_labels_and_order_on_a_hand_made_bibliography():
    # expected by hand: "A", "A and B", "A et al." (3+ authors or "and others"), accents
    # resolved, editors when there is no author; entries sharing a label get a, b in
    # bibliography order; order by last names (accents folded), then year, then title
    expected = [
        ("edited", "Csiszár, 1967"),
        ("single", "Huang, 2022"),
        ("threeA", "Huang et al., 2022a"),   # Huang, Dossa, Raffin sorts before Huang, Dossa, Ye
        ("threeB", "Huang et al., 2022b"),
        ("two", "Müller and Ab, 1999"),
        ("others", "Touvron et al., 2023"),
        ("zeta", "Zeta, 2001"),
    ]
    assert [(k, label) for k, label, _ in _formatted()] == expected


def test_entries_end_with_their_links():
    html = {k: fe.text.render_as("html") for k, _, fe in _formatted()}
    assert '<a href="https://doi.org/10.1000/x">doi:10.1000/x</a>' in html["two"]
    assert '<a href="https://arxiv.org/abs/2201.00001">arXiv:2201.00001</a>' in html["threeA"]
    assert '<a href="https://example.org/z">https://example.org/z</a>' in html["zeta"]


def test_split_label():
    assert klbook_bib.split_label("Huang et al., 2022a") == ("Huang et al.", "2022a")
    assert klbook_bib.split_label("Cover and Thomas, 2006") == ("Cover and Thomas", "2006")


# ------------------------------------------------------------------ the built site
def _site():
    if not (HTML / "bibliography.html").exists():
        pytest.fail("_build/html/bibliography.html does not exist: build the book first (make test-book)")
    return BeautifulSoup((HTML / "bibliography.html").read_text(), "html.parser")


def _bib_labels(soup) -> dict[str, str]:
    out = {}
    for cit in soup.select("div.citation"):
        label = cit.select_one("span.label")
        text = label.get_text("", strip=True).strip("[]") if label else ""
        out[cit["id"]] = text
    return out


def _fold(s: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", s) if not unicodedata.combining(c)).lower()


@pytest.mark.browser
def test_bibliography_is_author_year_sorted_and_linked():
    soup = _site()
    citations = soup.select("div.citation")
    entries = _entries()
    assert len(citations) == len(entries), "the bibliography page lists every entry (:all:)"
    urls = {e.fields.get("url", "").strip() for e in entries.values()} - {""}
    labels, problems = [], []
    for cit in citations:
        label = cit.select_one("span.label").get_text("", strip=True).strip("[]")
        labels.append(label)
        if not LABEL.match(label):
            problems.append(f"label {label!r} is not 'Author(s), Year'")
        hrefs = [a["href"] for a in cit.select("p a.reference.external[href]")]
        good = [h for h in hrefs if h.startswith("https://doi.org/10.") or ARXIV.match(h) or h in urls]
        if not good:
            problems.append(f"[{label}] has no link to a DOI, arXiv or official page: {hrefs}")
    assert not problems, "\n".join(problems)
    assert len(set(labels)) == len(labels), "two bibliography entries share a label"
    first_authors = [_fold(re.split(r",| and | et al\.", label)[0]) for label in labels]
    assert first_authors == sorted(first_authors), "the bibliography is sorted by first author"


@pytest.mark.browser
def test_in_text_citations_print_the_bibliography_label():
    labels = _bib_labels(_site())
    checked, problems = 0, []
    for page in sorted(HTML.rglob("*.html")):
        rel = page.relative_to(HTML)
        if rel.parts[0] in ("_static", "_sources", "_images", "_downloads"):
            continue
        soup = BeautifulSoup(page.read_text(errors="replace"), "html.parser")
        for a in soup.select("a.reference.internal[href]"):
            target = urlparse(a["href"])
            dest = (page.parent / unquote(target.path)).resolve() if target.path else page
            if dest != (HTML / "bibliography.html").resolve() or target.fragment not in labels:
                continue
            label, text = labels[target.fragment], a.get_text("", strip=True)
            checked += 1
            authors, year = klbook_bib.split_label(label)
            if text == label:
                continue
            if text == year and a.parent.get_text(" ", strip=True).count(authors):  # {cite:t}
                continue
            problems.append(f"{rel}: citation '{text}' links to the entry labelled '{label}'")
    assert checked >= 20, f"only {checked} in-text citations found: is the book built?"
    assert not problems, "\n".join(problems[:30])
