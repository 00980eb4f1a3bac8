"""The built book, opened by a real browser (headless Chromium, Debian's package).

Run after the book build (`make test-browser`). For every HTML page: no console
errors, math typeset by the locally served MathJax (no raw TeX left), every image
loaded, every internal link (and its #anchor) resolves, and no resource is loaded from
another host. Screenshots of the intro and of one chapter go to _build/screenshots/.
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest
from bs4 import BeautifulSoup

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
SKIP_DIRS = ("_static", "_sources", "_images", "_downloads", "genindex")


def _pages() -> list[Path]:
    if not HTML.exists():
        return []
    return sorted(p for p in HTML.rglob("*.html")
                  if not any(part in SKIP_DIRS for part in p.relative_to(HTML).parts)
                  and p.relative_to(HTML).as_posix() not in ("search.html", "genindex.html", "index.html"))


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Debian's chromium is required for the browser check (tools/ensure_chromium.sh)")
    return path


@pytest.fixture(scope="module")
def server():
    if not HTML.exists():
        pytest.fail("_build/html does not exist: build the book first (make test-book)")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output readable
        pass


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=_chromium(), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def test_there_are_pages():
    pages = _pages()
    assert len(pages) >= 5, f"expected the built book in {HTML}, found {len(pages)} pages"


def test_index_redirects_to_the_intro():
    """index.html is only a redirect (Jupyter Book writes it); intro.html is checked as a page."""
    text = (HTML / "index.html").read_text()
    assert 'http-equiv="Refresh"' in text or "http-equiv=\"refresh\"" in text.lower()
    assert "intro.html" in text


def test_no_resource_from_another_host():
    """No script, stylesheet or image is loaded from a CDN: the book works offline."""
    offenders = []
    for page in HTML.rglob("*.html"):
        soup = BeautifulSoup(page.read_text(errors="replace"), "html.parser")
        for tag, attr in (("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src")):
            for el in soup.find_all(tag):
                url = el.get(attr) or ""
                if tag == "link" and not set(el.get("rel") or []) & {"stylesheet", "preload", "icon", "modulepreload"}:
                    continue
                if urlparse(url).scheme in ("http", "https") or url.startswith("//"):
                    offenders.append(f"{page.relative_to(HTML)}: <{tag} {attr}={url}>")
    assert not offenders, "resources loaded from other hosts:\n" + "\n".join(sorted(set(offenders))[:40])


def _anchor_exists(target: Path, fragment: str, cache: dict) -> bool:
    if target not in cache:
        soup = BeautifulSoup(target.read_text(errors="replace"), "html.parser")
        cache[target] = {el.get("id") for el in soup.find_all(id=True)} | \
                        {el.get("name") for el in soup.find_all("a", attrs={"name": True})}
    return fragment in cache[target]


def test_internal_links_resolve():
    broken, anchors = [], {}
    for page in _pages():
        soup = BeautifulSoup(page.read_text(errors="replace"), "html.parser")
        for a in soup.find_all("a", href=True):
            href = a["href"]
            parsed = urlparse(href)
            if parsed.scheme or href.startswith(("mailto:", "javascript:", "//")):
                continue
            target = page if not parsed.path else (page.parent / unquote(parsed.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(HTML)} -> {href}")
            elif parsed.fragment and target.suffix == ".html" and \
                    not _anchor_exists(target, unquote(parsed.fragment), anchors):
                broken.append(f"{page.relative_to(HTML)} -> {href} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:50])


CHECK_PAGE_JS = """
() => {
  const outside = (el) => !el.closest('pre, code, .highlight, script, style, textarea');
  const mathEls = [...document.querySelectorAll('.math, span.math, div.math')];
  const untypeset = mathEls.filter(el => !el.querySelector('mjx-container')).map(el => el.textContent.slice(0, 80));
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const raw = [];
  while (walker.nextNode()) {
    const n = walker.currentNode;
    if (!n.parentElement || !outside(n.parentElement)) continue;
    if (n.parentElement.closest('mjx-container, mjx-assistive-mml')) continue;
    const t = n.textContent;
    if (t.includes('$$') || t.includes('\\\\(') || t.includes('\\\\[')) raw.push(t.trim().slice(0, 80));
  }
  const imgs = [...document.images].filter(i => i.offsetParent !== null || i.closest('figure'));
  const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));
  return {nMath: mathEls.length, nTypeset: document.querySelectorAll('mjx-container').length,
          untypeset, raw, broken, nImg: document.images.length,
          proofs: document.querySelectorAll('.proof, div[class*="prf"]').length,
          toggles: document.querySelectorAll('details, .toggle, .dropdown').length};
}
"""


def _open(browser, url):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(url, wait_until="load")
    page.wait_for_function("() => !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise)",
                           timeout=15000)
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    page.wait_for_timeout(100)
    return page, errors


@pytest.mark.parametrize("rel", [str(p.relative_to(HTML)) for p in _pages()])
def test_page_in_browser(browser, server, rel):
    page, errors = _open(browser, urljoin(server, rel))
    try:
        info = page.evaluate(CHECK_PAGE_JS)
    finally:
        page.close()
    assert not errors, f"{rel}: " + "; ".join(errors[:10])
    assert not info["untypeset"], f"{rel}: math not typeset: {info['untypeset'][:5]}"
    assert not info["raw"], f"{rel}: raw TeX left in the page: {info['raw'][:5]}"
    assert not info["broken"], f"{rel}: images that did not load: {info['broken']}"
    if info["nMath"]:
        assert info["nTypeset"] >= 1


def test_math_typesets_on_the_notation_page(browser, server):
    page, errors = _open(browser, urljoin(server, "notation.html"))
    try:
        info = page.evaluate(CHECK_PAGE_JS)
    finally:
        page.close()
    assert info["nMath"] >= 5 and info["nTypeset"] >= info["nMath"], info


def test_screenshots(browser, server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    chapters = sorted((HTML / "chapters").glob("01_*.html")) or sorted((HTML / "chapters").glob("*.html"))
    targets = {"intro.png": "intro.html"}
    if chapters:
        targets["chapter.png"] = str(chapters[0].relative_to(HTML))
    for name, rel in targets.items():
        page, errors = _open(browser, urljoin(server, rel))
        try:
            page.screenshot(path=str(SHOTS / name), full_page=False)
        finally:
            page.close()
        assert (SHOTS / name).stat().st_size > 10_000, f"{name} looks empty"


def _chapter_pages() -> list[str]:
    return [str(p.relative_to(HTML)) for p in sorted((HTML / "chapters").glob("[0-9][0-9]_*.html"))] \
        if HTML.exists() else []


@pytest.mark.parametrize("rel", _chapter_pages())
def test_chapter_apparatus_renders(browser, server, rel):
    """Citations link to the bibliography, proof/definition blocks render, and the hidden
    solutions of the in-text exercises open when their toggle is clicked."""
    page, errors = _open(browser, urljoin(server, rel))
    try:
        cites = page.eval_on_selector_all("a[href*='bibliography.html#id'], a[href*='bibliography.html#']",
                                          "els => els.length")
        blocks = page.eval_on_selector_all("div.proof, div.exercise", "els => els.length")
        downloads = page.eval_on_selector_all("a[href$='.ipynb']", "els => els.map(e => e.href)")
        sol = page.query_selector("div.solution.dropdown")
        assert sol is not None, f"{rel}: no hidden solution"
        body = sol.query_selector("section, p:not(.admonition-title)")
        assert body is not None and not body.is_visible(), f"{rel}: the solution is not hidden"
        sol.query_selector("button.toggle-button, .admonition-title").click()
        page.wait_for_timeout(400)
        assert body.is_visible(), f"{rel}: clicking the toggle did not reveal the solution"
    finally:
        page.close()
    assert any("_sources/" in d for d in downloads), f"{rel}: no download-notebook button"
    assert cites >= 1, f"{rel}: no citation links to the bibliography"
    assert blocks >= 1, f"{rel}: no theorem, definition or exercise block rendered"
    assert not errors, errors
