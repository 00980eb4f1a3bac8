"""The whole-book PDF (``make pdf``) and the page's own print button.

Run after ``make pdf`` (marked ``browser``, like the other checks of the built book).
The PDF is read with ``tools/pdfinfo.py`` (no PDF library in the book's environment):
it has many pages, the book's figures, a bookmark for every chapter, and its table of
contents names the page on which each chapter really starts. The landing page links a
copy inside the HTML site. Printing one chapter from the browser gives every page of it,
with no code line wider than the paper.
"""
from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import sys
import threading
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SINGLE = ROOT / "_build" / "singlehtml"
PDF_PATH = ROOT / "_build" / "pdf" / "book.pdf"
sys.path.insert(0, str(ROOT / "tools"))

from booktools import toc_files  # noqa: E402
from pdfinfo import PDF  # noqa: E402


@pytest.fixture(scope="module")
def pdf() -> PDF:
    if not PDF_PATH.exists():
        pytest.fail(f"{PDF_PATH} does not exist: run `make pdf` (after `make book`)")
    return PDF(PDF_PATH)


@pytest.fixture(scope="module")
def stats() -> dict:
    return json.loads((PDF_PATH.parent / "book.json").read_text())


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _toc_docs() -> list[str]:
    """The documents of _toc.yml after its root (the landing page, which is the cover)."""
    return [str(Path(f).with_suffix("")) for f in toc_files()[1:]]


def test_pdf_has_pages_figures_and_bookmarks(pdf):
    pages = pdf.pages()
    assert len(pages) >= 100, f"only {len(pages)} pages"
    soup = BeautifulSoup((SINGLE / "intro.html").read_text(errors="replace"), "html.parser")
    shown = {img["src"] for img in soup.select("article img[src]")
             if img.find_parent("details") is None and re.search(r"\.(png|jpe?g)$", img["src"], re.I)}
    assert len(shown) >= 20, f"the single page shows only {len(shown)} raster figures"
    assert pdf.image_count() >= len(shown), (
        f"the PDF holds {pdf.image_count()} pictures, the page it was printed from shows {len(shown)}")
    outline = [_squash(title) for _, title, _ in pdf.outline()]
    missing = []
    for doc in _toc_docs():   # (the landing page, _toc.yml's root, is the cover)
        page = HTML / f"{doc}.html"
        h1 = BeautifulSoup(page.read_text(errors="replace"), "html.parser").select_one("article h1")
        title = _squash(h1.get_text("", strip=True).rstrip("#"))
        if not any(title in t for t in outline):
            missing.append(h1.get_text(" ", strip=True))
    assert not missing, f"chapters without a bookmark in the PDF: {missing}"


def test_contents_name_the_pages_where_chapters_start(pdf, stats):
    toc = stats["toc"]
    assert len(toc) == len(_toc_docs()), "one contents line per document after the landing page"
    dests = pdf.destinations()
    wrong = {k: (v, dests.get(k)) for k, v in toc.items() if dests.get(k) != v}
    assert not wrong, f"contents page numbers (printed, actual): {wrong}"
    starts = list(toc.values())
    assert starts == sorted(starts) and starts[0] >= 3, "chapters in order, after the cover and contents"


def test_print_checks_passed(stats):
    for key in ("broken_images", "math_errors", "raw_tex", "wide_code"):
        assert stats[key] == 0, f"{key}: {stats[key]}"
    assert stats["equations"] >= 20 and stats["images"] >= 20


def test_landing_page_links_the_pdf():
    soup = BeautifulSoup((HTML / "intro.html").read_text(), "html.parser")
    links = [a["href"] for a in soup.select("a[href]") if a["href"].endswith(".pdf")]
    assert links == ["book.pdf"], links
    copy = HTML / "book.pdf"
    assert copy.exists() and copy.read_bytes() == PDF_PATH.read_bytes(), "_build/html/book.pdf is stale"


# -------------------------------------------------------- the page's own print button
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def page_url():
    handler = functools.partial(_Quiet, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


def test_printing_a_chapter_gives_every_page_with_code_wrapped(page_url):
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.fail("Debian's chromium is required (tools/ensure_chromium.sh)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        page.goto(page_url + "chapters/03_trpo_ppo.html", wait_until="load")
        page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
        screen_height = page.evaluate("() => document.documentElement.scrollHeight")
        page.emulate_media(media="print")
        wide = page.evaluate("""() => [...document.querySelectorAll('article pre')]
            .filter(p => p.offsetParent !== null && p.scrollWidth > p.clientWidth + 1).length""")
        hidden_nav = page.evaluate("""() => ['.bd-sidebar-primary', '.bd-header-article']
            .every(s => !document.querySelector(s) || getComputedStyle(document.querySelector(s)).display === 'none')""")
        data = page.pdf(format="A4")
        browser.close()
    assert wide == 0, f"{wide} code blocks are wider than the printed page"
    assert hidden_nav, "navigation is printed"
    pages = len(PDF(data).pages())
    assert pages >= max(5, screen_height // 2000), f"the chapter printed on {pages} pages"


ZH_PDF = ROOT / "_build" / "pdf" / "book-zh.pdf"


def test_the_chinese_pdf_holds_what_the_english_one_holds(pdf, stats):
    # `make pdf` prints the Chinese edition too (issue 27): same figures, every display equation
    # typeset (a translated equation would have become "::"), the same chapters bookmarked
    if not ZH_PDF.exists():
        pytest.fail(f"{ZH_PDF} does not exist: `make pdf` writes it (tools/build_pdf.py --lang zh)")
    zh, zstats = PDF(ZH_PDF), json.loads((ZH_PDF.parent / "book-zh.json").read_text())
    for key in ("broken_images", "math_errors", "raw_tex", "wide_code"):
        assert zstats[key] == 0, f"{key}: {zstats[key]}"
    assert zstats["equations"] == stats["equations"], (zstats["equations"], stats["equations"])
    assert zh.image_count() == pdf.image_count()
    assert len(zstats["toc"]) == len(stats["toc"])
    assert len(zh.outline()) >= 0.9 * len(pdf.outline())
    assert 0.6 * len(pdf.pages()) <= len(zh.pages()) <= 1.2 * len(pdf.pages())
