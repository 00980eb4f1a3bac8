"""The built book, as its readers see it (headless Chromium, Debian's package).

Run after the book build (`make test-browser`). Every test here reads the built site:

- every page: no console errors, math typeset by the locally served MathJax (no raw TeX
  left), every image loaded, every internal link (and its #anchor) resolves, and no
  resource is loaded from another host;
- figures: no page and no cached execution shows a figure as the text "<Figure size";
  every chapter has numbered figures and each shows a loaded image;
- navigation at 390 px (a phone) and 1366 px (a laptop): the visible menu button opens
  and closes the table of contents, the in-page contents opens, one header band only;
- layout: at 1366 px no display equation or table is wider than the text column; on a
  phone a wide one scrolls inside its own box and shows that it does (a fade), and an
  equation's number stays in view;
- figures on a phone: tick text of every figure glued with kb.display.glue_figure at least
  MIN_TICK_CSS_PX CSS px at 390 px, and every legend, title and label at least MIN_TEXT_CSS_PX
  (from the dpi and text sizes the PNG records, its natural
  width and its CSS width); a phone rendering is only a <picture>'s <source>;
- text: the KL keeps its double bar in every table, no "exercise Exercise 4.3", the proof
  index lists titles, the execution page has plain check marks, plotting code sits
  behind a working "show code" toggle.

The site checked is `_build/html`, or the folder named by the environment variable
KLBOOK_HTML (e.g. a private build of tools/preview.py: /tmp/prev-NAME/book/_build/html).
Screenshots go to `screenshots/` next to it.
"""
from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest
from bs4 import BeautifulSoup

from booktools import doubled_reference_words, single_bar_divergences

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("KLBOOK_HTML") or ROOT / "_build" / "html").resolve()
# the sources the site was built from (tools/preview.py builds a copy of the repository)
BOOK = HTML.parents[1] if (HTML.parents[1] / "_toc.yml").exists() else ROOT
CACHE = BOOK / "_build" / ".jupyter_cache"
SHOTS = HTML.parent / "screenshots"
SKIP_DIRS = ("_static", "_sources", "_images", "_downloads", "genindex")
PHONE, LAPTOP = (390, 844), (1366, 900)


def _pages() -> list[Path]:
    if not HTML.exists():
        return []
    return sorted(p for p in HTML.rglob("*.html")
                  if not any(part in SKIP_DIRS for part in p.relative_to(HTML).parts)
                  and p.relative_to(HTML).as_posix().removeprefix("zh/")
                  not in ("search.html", "genindex.html", "index.html"))


def _rel(p: Path) -> str:
    return p.relative_to(HTML).as_posix()


@functools.lru_cache(maxsize=None)
def _soup(rel: str) -> BeautifulSoup:
    return BeautifulSoup((HTML / rel).read_text(errors="replace"), "html.parser")


def _article(rel: str):
    soup = _soup(rel)
    return soup.find("article") or soup.body


def _pages_with(*markers: str) -> list[str]:
    """Pages whose HTML contains one of ``markers`` (a cheap test at collection time)."""
    out = []
    for p in _pages():
        text = p.read_text(errors="replace")
        if any(m in text for m in markers):
            out.append(_rel(p))
    return out


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("Debian's chromium is required for the browser check (tools/ensure_chromium.sh)")
    return path


@pytest.fixture(scope="module")
def server():
    if not HTML.exists():
        pytest.fail(f"{HTML} does not exist: build the book first (make test-book)")
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


def _open(browser, url, viewport=LAPTOP):
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(url, wait_until="load")
    page.wait_for_function("() => !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise)",
                           timeout=15000)
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    page.wait_for_timeout(150)
    return page, errors


_LAPTOP_VIEWS: dict[str, dict] = {}


def _laptop_view(browser, server, rel: str) -> dict:
    """One visit of a page at 1366 px, shared by the tests that only read it."""
    if rel not in _LAPTOP_VIEWS:
        page, errors = _open(browser, urljoin(server, rel), LAPTOP)
        try:
            _LAPTOP_VIEWS[rel] = {"errors": errors, "check": page.evaluate(CHECK_PAGE_JS),
                                  "layout": page.evaluate(LAYOUT_JS), "figures": page.evaluate(NUMBERED_FIGURES_JS)}
        finally:
            page.close()
    return _LAPTOP_VIEWS[rel]


@pytest.mark.parametrize("rel", [str(p.relative_to(HTML)) for p in _pages()])
def test_page_in_browser(browser, server, rel):
    view = _laptop_view(browser, server, rel)
    errors, info = view["errors"], view["check"]
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
    """What a reader sees first, on a laptop and on a phone (for people to look at)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    chapters = sorted((HTML / "chapters").glob("01_*.html")) or sorted((HTML / "chapters").glob("*.html"))
    targets = {"intro": "intro.html"}
    if chapters:
        targets["chapter"] = str(chapters[0].relative_to(HTML))
    for name, rel in targets.items():
        for suffix, viewport in (("", LAPTOP), ("-390", PHONE)):
            shot = SHOTS / f"{name}{suffix}.png"
            page, errors = _open(browser, urljoin(server, rel), viewport)
            try:
                page.screenshot(path=str(shot), full_page=False)
            finally:
                page.close()
            assert shot.stat().st_size > 10_000, f"{shot.name} looks empty"


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


# ----------------------------------------------------------------------------- figures

def _site_module():
    spec = importlib.util.spec_from_file_location("klbook_site_for_tests", ROOT / "_ext" / "klbook_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_page_shows_a_figure_as_text():
    """A figure executed without an image output renders as "<Figure size 800x400 with 1 Axes>"."""
    bad = [_rel(p) for p in _pages() if "<Figure size" in _soup(_rel(p)).get_text()]
    assert not bad, f"pages that show a figure as text instead of an image: {bad}"


def test_cached_executions_hold_images():
    """The jupyter-cache entry the build used for every notebook of the book has an
    image for each figure (a stale text-only entry would be served again and again)."""
    import nbformat
    from jupyter_cache import get_cache

    from booktools import toc_files

    if not CACHE.exists():
        pytest.fail(f"no jupyter-cache at {CACHE}: build the book first")
    cache = get_cache(str(CACHE))
    text_only_figures = _site_module().text_only_figures
    missing, bad = [], []
    for doc in toc_files():
        path = BOOK / f"{doc}.ipynb"
        if not path.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        if not any(c.cell_type == "code" for c in nb.cells):
            continue
        try:
            record = cache.match_cache_notebook(nb)
        except KeyError:
            missing.append(doc)
            continue
        found = text_only_figures(cache.get_cache_bundle(record.pk).nb)
        if found:
            bad.append(f"{doc}: {found[:3]}")
    assert not bad, "cached executions with text-only figures:\n" + "\n".join(bad)
    assert not missing, (f"notebooks changed since the book was built (no cached execution matches): "
                         f"{missing}; build the book again")


def test_the_text_only_figure_check_reads_glued_outputs():
    check = _site_module().text_only_figures
    figure_text = {"text/plain": "<Figure size 800x400 with 1 Axes>"}
    png = {"image/png": "iVBORw0KGgo="}
    glued = {f"application/papermill.record/{k}": v for k, v in figure_text.items()}

    def nb(data):
        return {"cells": [{"cell_type": "code", "outputs": [{"output_type": "display_data", "data": data}]}]}

    assert check(nb(figure_text)) and check(nb(glued))
    assert check(nb({**figure_text, **png})) == []
    assert check(nb({**glued, **{f"application/papermill.record/{k}": v for k, v in png.items()}})) == []
    assert check(nb({**glued, **png})), "a glued text-only figure next to an unrelated plain image"


NUMBERED_FIGURES_JS = """
() => [...document.querySelectorAll('article figure')]
  .filter(f => f.querySelector('.caption-number'))
  .map(f => {
    const img = f.querySelector('img');
    return {id: f.id || f.querySelector('.caption-number').textContent,
            ok: !!img && img.complete && img.naturalWidth > 0,
            text: f.textContent.includes('<Figure size')};
  })
"""


@pytest.mark.parametrize("rel", _chapter_pages() if HTML.exists() else [])
def test_numbered_figures_show_images(browser, server, rel):
    figures = _laptop_view(browser, server, rel)["figures"]
    assert figures, f"{rel}: no numbered figure (a glue:figure with a caption)"
    broken = [f["id"] for f in figures if not f["ok"] or f["text"]]
    assert not broken, f"{rel}: numbered figures without a loaded image: {broken} (of {len(figures)})"


# -------------------------------------------------------------------------- navigation

NAV_STATE_JS = """
() => {
  const onTop = (el) => {
    if (!el) return false;
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) return false;
    const x = r.left + Math.min(r.width / 2, 20), y = r.top + r.height / 2;
    if (x < 0 || y < 0 || x > innerWidth || y > innerHeight) return false;
    const hit = document.elementFromPoint(x, y);
    return !!hit && (hit === el || el.contains(hit));
  };
  const firstVisible = (sel) => [...document.querySelectorAll(sel)].find(onTop) || null;
  const shown = (sel) => [...document.querySelectorAll(sel)].filter(e => e.checkVisibility({visibilityProperty: true}));
  const header = document.getElementById('pst-header');
  return {
    tocLink: !!firstVisible('nav.bd-docs-nav a.reference'),
    pageTocLink: !!firstVisible('nav.page-toc a, .bd-toc-nav a'),
    primaryButtons: shown('.primary-toggle').map(e => e.className),
    secondaryButtons: shown('.secondary-toggle').map(e => e.className),
    headerBand: header ? Math.round(header.getBoundingClientRect().height) : 0,
    searchBoxes: shown('.search-button__button, .bd-search').filter(onTop).length,
    articleHeaderTop: Math.round(document.querySelector('.bd-header-article').getBoundingClientRect().top),
  };
}
"""


def _nav(page):
    return page.evaluate(NAV_STATE_JS)


@pytest.mark.parametrize("viewport", [PHONE, LAPTOP], ids=["390px", "1366px"])
def test_menu_buttons_open_and_close_the_contents(browser, server, viewport):
    chapters = _chapter_pages()
    rel = chapters[0] if chapters else "notation.html"
    page, errors = _open(browser, urljoin(server, rel), viewport)
    try:
        state = _nav(page)
        assert state["headerBand"] == 0, f"an extra header band of {state['headerBand']} px above the page"
        assert state["articleHeaderTop"] == 0, "the article header (with the menu buttons) is not at the top"
        assert len(state["primaryButtons"]) == 1, f"visible menu buttons: {state['primaryButtons']}"
        assert state["searchBoxes"] <= 1, f"{state['searchBoxes']} search boxes on screen"
        toggle = page.locator(".primary-toggle").filter(visible=True).first
        if viewport == PHONE:
            assert not state["tocLink"], "the table of contents is open before the menu button is tapped"
            toggle.click()
            page.wait_for_timeout(400)
            assert _nav(page)["tocLink"], "tapping the menu button did not show the table of contents"
            page.mouse.click(viewport[0] - 10, viewport[1] // 2)  # beside the drawer
            page.wait_for_timeout(400)
            assert not _nav(page)["tocLink"], "tapping beside the drawer did not close it"
            toggle.click()
            page.wait_for_timeout(400)
            assert _nav(page)["tocLink"], "the menu button does not open the drawer a second time"
            page.keyboard.press("Escape")
            page.wait_for_timeout(400)
            assert not _nav(page)["tocLink"], "Escape did not close the drawer"
            # the in-page contents
            assert len(state["secondaryButtons"]) == 1, f"visible contents buttons: {state['secondaryButtons']}"
            assert not state["pageTocLink"]
            page.locator(".secondary-toggle").filter(visible=True).first.click()
            page.wait_for_timeout(400)
            assert _nav(page)["pageTocLink"], "tapping the contents button did not show the in-page contents"
            page.keyboard.press("Escape")
            page.wait_for_timeout(400)
            assert not _nav(page)["pageTocLink"], "Escape did not close the in-page contents"
        else:
            assert state["tocLink"], "the table of contents is not shown on a wide screen"
            assert state["pageTocLink"], "the in-page contents are not shown on a wide screen"
            toggle.click()
            page.wait_for_timeout(600)
            assert not _nav(page)["tocLink"], "the menu button did not hide the table of contents"
            toggle.click()
            page.wait_for_timeout(600)
            assert _nav(page)["tocLink"], "the menu button did not bring the table of contents back"
    finally:
        page.close()
    assert not errors, errors


# ------------------------------------------------------------------------------ layout

LAYOUT_JS = """
() => {
  const col = document.querySelector('article.bd-article');
  const colRight = col.getBoundingClientRect().right;
  const tex = (c) => {
    try { const items = MathJax.startup.document.getMathItemsWithin(c); if (items.length) return items[0].math.trim(); }
    catch (e) {}
    return c.textContent;
  };
  const label = (c) => {
    const d = c.closest('div.math');
    return ((d && d.id) ? d.id + ': ' : '') + tex(c).replace(/\\s+/g, ' ').slice(0, 70);
  };
  const scrollBox = (el) => {
    for (let n = el; n && n !== col; n = n.parentElement) {
      const ox = getComputedStyle(n).overflowX;
      if (ox === 'auto' || ox === 'scroll') return n;
    }
    return null;
  };
  const cue = (box) => {
    const cs = getComputedStyle(box);
    return box.classList.contains('klbook-more-right') && /gradient/.test(cs.maskImage || cs.webkitMaskImage || '');
  };
  const eqs = [], tables = [];
  for (const c of col.querySelectorAll('mjx-container[display="true"]')) {
    const r = c.getBoundingClientRect();
    const d = c.closest('div.math');
    const n = d && d.querySelector(':scope > .eqno');
    const nr = n && n.getBoundingClientRect();
    eqs.push({label: label(c), hidden: c.scrollWidth - c.clientWidth, overRight: r.right - colRight,
              right: r.right, overflowX: getComputedStyle(c).overflowX, cue: cue(c),
              eqno: nr ? {left: nr.left, right: nr.right, top: nr.top, visible: n.checkVisibility()} : null});
  }
  for (const t of col.querySelectorAll('table')) {
    if (t.closest('mjx-container, pre')) continue;
    const box = scrollBox(t);
    const r = t.getBoundingClientRect();
    tables.push({label: (t.className ? t.className + ': ' : '') + t.innerText.replace(/\\s+/g, ' ').slice(0, 60),
                 overRight: r.right - colRight, box: !!box,
                 hidden: box ? box.scrollWidth - box.clientWidth : r.width - col.clientWidth,
                 boxRight: box ? box.getBoundingClientRect().right : r.right, cue: box ? cue(box) : false});
  }
  return {eqs, tables, colRight, pageOverflow: document.documentElement.scrollWidth - innerWidth};
}
"""

LAYOUT_PAGES = _pages_with('<div class="math', "<table") if HTML.exists() else []


@pytest.mark.parametrize("rel", LAYOUT_PAGES)
def test_equations_and_tables_fit_the_column_at_1366px(browser, server, rel):
    """On a laptop nothing is clipped: split long equations with aligned/split, keep tables
    to about 6-7 short columns (AUTHORING.md)."""
    info = _laptop_view(browser, server, rel)["layout"]
    wide = [f"equation {e['label']}: {round(max(e['hidden'], e['overRight']))} px too wide"
            for e in info["eqs"] if e["hidden"] > 1 or e["overRight"] > 1]
    wide += [f"table {t['label']}: {round(max(t['hidden'], t['overRight']))} px too wide"
             for t in info["tables"] if t["hidden"] > 1 or t["overRight"] > 1]
    if wide:
        pytest.fail(f"{rel} at 1366 px, wider than the text column:\n" + "\n".join(wide), pytrace=False)


@pytest.mark.parametrize("rel", LAYOUT_PAGES)
def test_wide_equations_and_tables_scroll_visibly_on_a_phone(browser, server, rel):
    """At 390 px a wide equation or table scrolls inside its own box, the box fades out at
    the edge where content is hidden, the page itself does not scroll sideways, and an
    equation's number stays on screen."""
    page, errors = _open(browser, urljoin(server, rel), PHONE)
    try:
        info = page.evaluate(LAYOUT_JS)
    finally:
        page.close()
    width = PHONE[0]
    problems = []
    if info["pageOverflow"] > 1:
        problems.append(f"the page scrolls sideways by {info['pageOverflow']} px")
    for e in info["eqs"]:
        if e["right"] > width + 1:
            problems.append(f"equation {e['label']} runs off the screen")
        if e["hidden"] > 1 and (e["overflowX"] not in ("auto", "scroll") or not e["cue"]):
            problems.append(f"equation {e['label']} is {e['hidden']} px wider than its box "
                            f"but does not scroll with a visible cue (overflow-x {e['overflowX']})")
        n = e["eqno"]
        if n and (not n["visible"] or n["left"] < 0 or n["right"] > width + 1):
            problems.append(f"the number of equation {e['label']} is cut off")
    for t in info["tables"]:
        if not t["box"] and t["hidden"] > 1:
            problems.append(f"table {t['label']} is wider than the column and does not scroll")
        elif t["boxRight"] > width + 1:
            problems.append(f"table {t['label']}: its box runs off the screen")
        elif t["hidden"] > 1 and not t["cue"]:
            problems.append(f"table {t['label']} scrolls without a visible cue")
    if problems:
        pytest.fail(f"{rel} at 390 px:\n" + "\n".join(problems), pytrace=False)
    assert not errors, errors


# ------------------------------------------------------------------------- text checks

def test_kl_keeps_its_double_bar_in_every_table():
    """`\\|` in a Markdown table cell renders as a single bar: D_KL(target | model).
    Checks the TeX MathJax reads, and the plain text, of every table cell of the site."""
    bad = []
    for p in _pages():
        for cell in _article(_rel(p)).select("table td, table th"):
            for hit in single_bar_divergences(cell.get_text(" ")):
                bad.append(f"{_rel(p)}: {hit}")
    assert not bad, "KL written with a single bar in a table (write \\Vert in table cells):\n" + "\n".join(bad)


def test_no_reference_word_is_doubled():
    """{numref} writes "Exercise 4.3" itself; "exercise {numref}`ex-04-3`" reads
    "exercise Exercise 4.3"."""
    bad = []
    for p in _pages():
        article = _article(_rel(p))
        for code in article.select("pre, code, .highlight"):
            code.decompose()
        bad += [f"{_rel(p)}: {hit!r}" for hit in doubled_reference_words(article.get_text(" "))]
    assert not bad, "doubled words before a reference:\n" + "\n".join(bad)


PROOF_TYPES = ("Definition|Theorem|Lemma|Proposition|Corollary|Example|Remark|Axiom|Conjecture"
               "|Criterion|Algorithm|Observation|Property|Assumption|Notation")


def test_proof_index_lists_numbers_and_titles():
    index = HTML / "prf-prf.html"
    assert index.exists(), "no proof index page (prf-prf.html)"
    article = _article("prf-prf.html")
    links = article.select("a[href]")
    texts = [a.get_text(" ", strip=True) for a in links]
    raw = [t for t in texts if re.fullmatch(r"[a-z]+-\d+[\w-]*", t)]
    assert not raw, f"the proof index lists raw labels: {raw}"
    malformed = [t for t in texts if not re.fullmatch(rf"({PROOF_TYPES}) \d+(\.\d+)*( \(.+\))?", t)]
    assert not malformed, f"proof index entries that are not 'Theorem 1.2 (title)': {malformed}"
    # one entry per labelled definition/theorem of the book, each linking to its block
    blocks = set()
    for p in _pages():
        if _rel(p).startswith("zh/"):        # the Chinese edition has its own index
            continue
        for div in _article(_rel(p)).select("div.proof[id]"):
            kinds = set(div.get("class", [])) - {"proof", "admonition"}
            if kinds and not re.fullmatch(r"[a-z]+-\d+", div["id"]):
                blocks.add(f"{_rel(p)}#{div['id']}")
    linked = {a["href"] for a in links}
    assert linked == blocks, f"index but no block: {sorted(linked - blocks)}; block but no entry: {sorted(blocks - linked)}"
    assert texts and all("(" in t for t in texts if t.startswith(("Theorem", "Definition"))), texts


def test_execution_status_uses_plain_check_marks():
    """The status column reads "✓ passed"/"✗ failed" in text any font has (no emoji)."""
    assert (HTML / "execution.html").exists()
    article = _article("execution.html")
    rows = article.select("table tbody tr")
    assert len(rows) >= 10, f"the execution table lists {len(rows)} notebooks"
    status = [r.select("td")[-1].get_text(strip=True) for r in rows]
    assert set(status) <= {"\u2713 passed", "\u2717 failed"}, set(status)
    emoji = [ch for p in _pages() for ch in set(_article(_rel(p)).get_text()) if ch in "\u2705\u274c\u274e\u2714\u2716"]
    assert not emoji, f"emoji check marks in the site: {sorted(set(emoji))}"


def test_instructor_pages_are_a_part_of_their_own():
    nav = _soup("intro.html").select_one("nav.bd-docs-nav")
    captions = [c.get_text(strip=True) for c in nav.select("p.caption")]
    assert captions and captions[-1] == "For instructors", captions
    last = nav.select("ul.bd-sidenav")[-1]
    assert {a["href"] for a in last.select("a")} == {"grading.html", "execution.html"}


# ----------------------------------------------------------------- "show code" toggles

HIDE_INPUT_PAGES = _chapter_pages() if HTML.exists() else []


@pytest.mark.parametrize("rel", HIDE_INPUT_PAGES)
def test_plotting_code_opens_with_a_show_code_toggle(browser, server, rel):
    """Cells tagged hide-input show their figure with the code one click away."""
    tagged = _article(rel).select_one(".cell.tag_hide-input") is not None
    assert tagged, f"{rel}: no cell hides its plotting code (tag plot-only cells 'hide-input')"
    page, errors = _open(browser, urljoin(server, rel))
    try:
        cell = page.locator(".cell.tag_hide-input").first
        code = cell.locator(".cell_input")
        assert not code.is_visible(), f"{rel}: the hidden code is visible before the toggle is clicked"
        summary = cell.locator("summary").first
        assert summary.is_visible() and "show code" in summary.inner_text().lower()
        summary.click()
        page.wait_for_timeout(300)
        assert code.is_visible(), f"{rel}: clicking 'Show code cell source' did not show the code"
        summary.click()
        page.wait_for_timeout(300)
        assert not code.is_visible(), f"{rel}: clicking again did not hide the code"
    finally:
        page.close()
    assert not errors, errors


# ------------------------------------------------------------ reading on a phone (issue 24)

def test_no_image_alt_is_a_path():
    """Every <img> of the site says what it shows: no empty alt, no file path as alt
    (_ext/klbook_reader.py sets a figure's alt from its caption)."""
    spec = importlib.util.spec_from_file_location("klbook_reader_for_browser", ROOT / "_ext" / "klbook_reader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    alt_is_missing = module.alt_is_missing
    bad = []
    for p in _pages():
        for img in _article(_rel(p)).find_all("img"):
            if alt_is_missing(img.get("alt"), img.get("src")):
                bad.append(f"{_rel(p)}: <img src={img.get('src')!r} alt={img.get('alt')!r}>")
    assert not bad, f"{len(bad)} images without real alt text:\n" + "\n".join(bad[:30])


# what an alt text must never hold (issue 38): a backslash, a TeX word that lost its
# backslash ("qto 0", "-infty", "tfrac12", "sqrtB", "varepsilon"), a dollar, TeX braces
ALT_TEX = re.compile(r"\\|\$|[_^]\{|\b(?:mathrm|mathcal|mathbb|mathbf|operatorname|tfrac\w*|dfrac|frac|infty|"
                     r"varepsilon|cdot|ldots|sqrt[A-Za-z0-9]\w*|qto|text\{|qquad|quad)\b")
ALT_CUT = re.compile(r"(\u2026|\.\.\.)\s*$")


def test_alt_texts_are_plain_text_and_never_cut():
    """Every figure's alt text on every page (both editions) is its caption with the
    formulas in words or plain symbols: no backslash, no TeX control word, no trailing
    ellipsis (_ext/klbook_reader.py: plain_text, whole_sentences)."""
    bad, seen = [], 0
    for p in _pages():
        for img in _article(_rel(p)).find_all("img"):
            alt = img.get("alt") or ""
            seen += 1
            if ALT_TEX.search(alt) or ALT_CUT.search(alt):
                bad.append(f"{_rel(p)}: {alt!r}")
    assert seen >= 50, f"only {seen} images found"
    assert not bad, f"{len(bad)} of {seen} alt texts hold TeX or end in a cut:\n" + "\n".join(bad[:30])


INLINE_MATH_JS = """
() => {
  const col = document.querySelector('article.bd-article');
  const colRight = Math.min(col.getBoundingClientRect().right, document.documentElement.clientWidth);
  const out = {n: 0, clipped: [], scrolling: 0, eqnos: []};
  for (const c of col.querySelectorAll('mjx-container[jax="CHTML"]:not([display="true"])')) {
    if (!c.checkVisibility()) continue;
    out.n += 1;
    let inBox = false;  // inside a table (or other box) that scrolls with its own cue
    for (let n = c.parentElement; n && n !== col; n = n.parentElement) {
      const o = getComputedStyle(n).overflowX;
      if ((o === 'auto' || o === 'scroll') && n.classList.contains('klbook-scrollbox')) { inBox = true; break; }
    }
    if (inBox) continue;
    const r = c.getBoundingClientRect();
    const ox = getComputedStyle(c).overflowX;
    const scrolls = (ox === 'auto' || ox === 'scroll') && c.scrollWidth > c.clientWidth + 1;
    if (scrolls) out.scrolling += 1;
    const cueOk = !scrolls || c.classList.contains('klbook-more-right') || c.classList.contains('klbook-more-left');
    if (r.right > colRight + 1 || !cueOk)
      out.clipped.push(c.textContent.slice(0, 50) + ` (${Math.round(r.right - colRight)} px past the column)`);
  }
  for (const d of col.querySelectorAll('div.math:has(> span.eqno)')) {
    const c = d.querySelector(':scope > mjx-container'); const n = d.querySelector(':scope > span.eqno');
    if (!c || !n.checkVisibility()) continue;
    out.eqnos.push({id: d.id, below: n.getBoundingClientRect().top >= c.getBoundingClientRect().bottom - 3,
                    width: Math.round(c.getBoundingClientRect().width), col: Math.round(d.getBoundingClientRect().width)});
  }
  return out;
}
"""

INLINE_PAGES = _pages_with('<span class="math') if HTML.exists() else []


@pytest.mark.parametrize("rel", INLINE_PAGES)
def test_inline_formulas_fit_or_scroll_visibly_on_a_phone(browser, server, rel):
    """At 390 px no inline formula runs past the column: one wider than the line scrolls
    in its own box with a fade (MathJax 3 does not break inline math), and a numbered
    equation has its number below it, so the equation gets the whole column."""
    page, errors = _open(browser, urljoin(server, rel), PHONE)
    try:
        page.wait_for_timeout(200)
        info = page.evaluate(INLINE_MATH_JS)
    finally:
        page.close()
    problems = [f"inline formula clipped: {c}" for c in info["clipped"]]
    problems += [f"equation {e['id']}: its number is beside it, not below" for e in info["eqnos"] if not e["below"]]
    problems += [f"equation {e['id']}: {e['width']} px of a {e['col']} px column" for e in info["eqnos"]
                 if e["width"] < e["col"] - 2]
    if problems:
        pytest.fail(f"{rel} at 390 px ({info['n']} inline formulas, {info['scrolling']} scroll):\n"
                    + "\n".join(problems[:20]), pytrace=False)
    assert not errors, errors


CODE_FRACTION_JS = """
() => {
  const art = document.querySelector('article.bd-article');
  let code = 0;
  for (const el of art.querySelectorAll('.cell .cell_input'))
    if (el.checkVisibility()) code += el.getBoundingClientRect().height;
  const h = art.getBoundingClientRect().height;
  return {code: Math.round(code), height: Math.round(h), fraction: h ? code / h : 0};
}
"""
CODE_FRACTION_TARGET = 0.25
CODE_FRACTIONS: dict[str, float] = {}


@pytest.mark.parametrize("rel", _chapter_pages())
def test_visible_code_fraction_at_1366px(browser, server, rel, record_property):
    """Visible code (code cell sources not behind a toggle) is at most 25 % of the chapter's
    height at 1366 px (issue 24), printed for every chapter. A chapter over it: move its
    asserts and glue calls into folded check cells (tools/fold_checks.py --split, or split
    the cell by hand and tag the check part ``klbook-check``), or refold it with a lower
    ``--budget`` (see its docstring)."""
    page, errors = _open(browser, urljoin(server, rel), LAPTOP)
    try:
        info = page.evaluate(CODE_FRACTION_JS)
    finally:
        page.close()
    CODE_FRACTIONS[rel] = info["fraction"]
    record_property("visible_code_fraction", round(info["fraction"], 3))
    print(f"\n{rel}: visible code {info['code']} of {info['height']} px = {100 * info['fraction']:.1f} %")
    assert info["height"] > 0
    assert info["fraction"] <= CODE_FRACTION_TARGET, \
        f"{rel}: visible code is {100 * info['fraction']:.1f} % of the page (target {100 * CODE_FRACTION_TARGET:.0f} %)"


def _first_chapter_with(selector: str) -> str | None:
    for rel in _chapter_pages():
        if _article(rel).select_one(selector) is not None:
            return rel
    return None


@pytest.mark.parametrize("viewport", [PHONE, LAPTOP], ids=["390px", "1366px"])
def test_a_figure_enlarges_on_tap_and_closes(browser, server, viewport):
    rel = _first_chapter_with("figure img")
    if rel is None:
        pytest.skip("no chapter figure in this build (built without executing the notebooks)")
    page, errors = _open(browser, urljoin(server, rel), viewport)
    try:
        img = page.locator("figure img.klbook-zoomable").first
        img.scroll_into_view_if_needed()
        shown = img.bounding_box()["width"]
        img.click()
        page.wait_for_timeout(300)
        box = page.locator(".klbook-lightbox")
        assert box.is_visible(), "tapping a figure did not open the enlarged view"
        big = box.locator("img").bounding_box()["width"]
        if viewport == PHONE:
            assert big >= 1.5 * shown, f"the enlarged figure is {big:.0f} px wide, the page's {shown:.0f} px"
        assert page.locator(".klbook-lightbox-close").is_visible()
        page.keyboard.press("Escape")
        page.wait_for_timeout(200)
        assert page.locator(".klbook-lightbox").count() == 0, "Escape did not close the enlarged view"
        img.click()
        page.wait_for_timeout(200)
        page.locator(".klbook-lightbox-close").click()
        page.wait_for_timeout(200)
        assert page.locator(".klbook-lightbox").count() == 0, "the close button did not close it"
    finally:
        page.close()
    assert not errors, errors


def test_search_ranks_a_chapter_above_the_exercises(browser, server):
    """Searching "k3" finds chapter 4's text before an exercise notebook (_static/klbook-scorer.js)."""
    page, errors = _open(browser, urljoin(server, "search.html?q=k3"), LAPTOP)
    try:
        page.wait_for_selector("#search-results ul.search li a", timeout=15000)
        page.wait_for_timeout(500)
        hrefs = page.eval_on_selector_all("#search-results ul.search li > a", "els => els.map(e => e.getAttribute('href'))")
    finally:
        page.close()
    assert hrefs, "no search results for k3"
    assert hrefs[0].startswith("chapters/"), f"first results: {hrefs[:5]}"
    chapters = [i for i, h in enumerate(hrefs) if h.startswith("chapters/")]
    exercises = [i for i, h in enumerate(hrefs) if h.startswith("exercises/")]
    if chapters and exercises:
        assert max(chapters) < min(exercises), f"an exercise ranks above a chapter: {hrefs[:12]}"


SEARCH_FIRST = [("k3", "chapters/04_estimating_kl"), ("DPO", "chapters/08_vi_elbo_dpo"),
                ("GRPO", "chapters/11_sequence_kl_grpo"), ("TRPO", "chapters/03_trpo_ppo"),
                ("ELBO", "chapters/08_vi_elbo_dpo"), ("distillation", "chapters/12_overoptimisation_distillation")]


def _search(browser, server, query: str, prefix: str = "") -> tuple[list[str], list[str]]:
    page, errors = _open(browser, urljoin(server, f"{prefix}search.html?q={query}"), LAPTOP)
    try:
        page.wait_for_selector("#search-results ul.search li a", timeout=20000)
        # the summaries arrive one page fetch at a time; wait until the list stops growing
        page.wait_for_function("() => { const s = document.getElementById('search-progress');"
                               " return s && s.textContent.trim() !== '' && !/Preparing|Searching/i.test(s.textContent)"
                               " || document.querySelector('#search-results > p') }", timeout=30000)
        page.wait_for_timeout(1500)
        hrefs = page.eval_on_selector_all("#search-results ul.search li > a",
                                          "els => els.map(e => e.getAttribute('href'))")
        snippets = page.eval_on_selector_all("#search-results ul.search li p.context",
                                             "els => els.map(e => e.textContent)")
    finally:
        page.close()
    assert not errors, errors
    return hrefs, snippets


@pytest.mark.parametrize("query,first", SEARCH_FIRST)
def test_search_ranks_the_chapter_titled_by_the_query_first(browser, server, query, first):
    """A query that is a word of a chapter's title finds that chapter first
    (_static/klbook-scorer.js: a title holding every word of the query ranks above the rest)."""
    hrefs, _ = _search(browser, server, query)
    assert hrefs, f"no search results for {query}"
    assert hrefs[0].split("#")[0] == first + ".html", f"{query}: first results {hrefs[:5]}"


SNIPPET_JUNK = re.compile(r"\\[A-Za-z(\[]|\\\(|\bmathrm\b|Download this page|\.ipynb\s*\.pdf|Contents\s+Contents")


@pytest.mark.parametrize("query", ["k3", "pi_old", "clipped"])
def test_search_snippets_show_text_not_tex_or_menus(browser, server, query):
    """The summary under each result is the article's text: formulas as plain text, no
    download menu or header buttons."""
    hrefs, snippets = _search(browser, server, query)
    assert hrefs and snippets, f"no results or no summaries for {query}"
    bad = [s for s in snippets if SNIPPET_JUNK.search(s)]
    assert not bad, f"{len(bad)} of {len(snippets)} snippets show TeX or menu labels:\n" + "\n".join(b[:200] for b in bad[:8])


def test_the_exercise_link_in_a_solution_title_opens_the_solution(browser, server):
    rel = _first_chapter_with("div.solution.dropdown > .admonition-title a[href]")
    if rel is None:
        pytest.skip("no solution with an exercise link in its title")
    page, errors = _open(browser, urljoin(server, rel), PHONE)
    try:
        sol = page.locator("div.solution.dropdown").filter(has=page.locator(".admonition-title a[href]")).first
        sol.scroll_into_view_if_needed()
        body = sol.locator("section, p:not(.admonition-title)").first
        assert not body.is_visible()
        url = page.url
        sol.locator(".admonition-title a[href]").first.click()
        page.wait_for_timeout(400)
        assert page.url == url, f"the link jumped away to {page.url}"
        assert body.is_visible(), "tapping 'Exercise N.M' in the title did not open the solution"
    finally:
        page.close()
    assert not errors, errors


def test_the_phone_in_page_contents_closes_after_a_tap(browser, server):
    chapters = _chapter_pages()
    if not chapters:
        pytest.skip("no chapter pages")
    page, errors = _open(browser, urljoin(server, chapters[0]), PHONE)
    try:
        page.locator(".secondary-toggle").filter(visible=True).first.click()
        page.wait_for_timeout(400)
        assert _nav(page)["pageTocLink"]
        links = page.locator("#pst-secondary-sidebar-modal nav a[href^='#']")
        target = links.nth(min(2, links.count() - 1))
        href = target.get_attribute("href")
        target.click()
        page.wait_for_timeout(600)
        assert not _nav(page)["pageTocLink"], "the in-page contents stayed open after a tap on an entry"
        assert page.url.endswith(href), f"{page.url} is not at {href}"
        top = page.evaluate(f"() => document.getElementById(decodeURIComponent({href[1:]!r})).getBoundingClientRect().top")
        assert -5 <= top <= PHONE[1] / 2, f"the section tapped is at {top} px, not on screen"
    finally:
        page.close()
    assert not errors, errors


GLUE_AND_TABLE_JS = """
() => {
  const art = document.querySelector('article.bd-article');
  const pasted = [...art.querySelectorAll('span.pasted-text')].map(s => getComputedStyle(s).fontWeight);
  // an output table as kb.display.table writes it, inside a notebook output
  const holder = document.createElement('div');
  holder.className = 'cell_output docutils container';
  holder.innerHTML = '<div class="output text_html"><table class="klbook-table"><thead><tr><th>a</th><th>b</th></tr></thead>'
    + '<tbody><tr><td>one</td><td>1.0</td></tr><tr><td>two</td><td>2.0</td></tr></tbody></table></div>';
  art.appendChild(holder);
  const lum = (rgb) => {
    const v = rgb.match(/[\\d.]+/g).slice(0, 3).map(Number).map(x => x / 255)
      .map(x => x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4));
    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2];
  };
  const bg = (el) => {
    for (let n = el; n; n = n.parentElement) {
      const c = getComputedStyle(n).backgroundColor;
      if (c && !/rgba\\(.*, 0\\)$/.test(c) && c !== 'transparent') return c;
    }
    return 'rgb(255, 255, 255)';
  };
  const contrast = [...holder.querySelectorAll('tbody td')].map(td => {
    const a = lum(getComputedStyle(td).color), b = lum(bg(td));
    return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  });
  holder.remove();
  return {pasted, contrast};
}
"""


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_glued_numbers_are_plain_and_tables_readable(browser, server, mode):
    """Glued numbers are ordinary weight (myst-nb makes them bold); an output table's rows
    keep a contrast of at least 4.5 in light and dark mode."""
    chapters = _chapter_pages()
    rel = chapters[0] if chapters else "notation.html"
    page, errors = _open(browser, urljoin(server, rel), LAPTOP)
    try:
        page.evaluate(f"() => {{ document.documentElement.dataset.theme = '{mode}'; "
                      f"document.documentElement.dataset.mode = '{mode}'; }}")
        page.wait_for_timeout(100)
        info = page.evaluate(GLUE_AND_TABLE_JS)
    finally:
        page.close()
    bold = [w for w in info["pasted"] if int(w) >= 600]
    assert not bold, f"{len(bold)} of {len(info['pasted'])} glued values are bold"
    assert min(info["contrast"]) >= 4.5, f"{mode} mode: table row contrast {info['contrast']}"


def test_glued_numbers_are_marked_only_on_hover_and_captions_read_as_body_text(browser, server):
    """A computed number carries no underline at rest and a visible mark when pointed at;
    figure captions have the body's font weight and colour (the theme's are 300 and grey)."""
    rel = "chapters/04_estimating_kl.html"
    page, errors = _open(browser, urljoin(server, rel), LAPTOP)
    try:
        rest = page.evaluate("""() => {
          const s = document.querySelector('article.bd-article p span.pasted-text');
          const cs = getComputedStyle(s);
          const p = getComputedStyle(document.querySelector('article.bd-article section p'));
          const caps = [...document.querySelectorAll('article.bd-article figure figcaption p')].map(c => {
            const st = getComputedStyle(c); return [st.fontWeight, st.color]; });
          return {deco: cs.textDecorationLine, bg: cs.backgroundColor, body: [p.fontWeight, p.color], caps};
        }""")
        page.hover("article.bd-article p span.pasted-text")
        page.wait_for_timeout(300)
        hover = page.evaluate("""() => { const cs = getComputedStyle(document.querySelector(
            'article.bd-article p span.pasted-text')); return {deco: cs.textDecorationLine, bg: cs.backgroundColor}; }""")
    finally:
        page.close()
    assert not errors, errors
    assert rest["deco"] == "none", f"a glued number is underlined at rest: {rest}"
    assert hover["deco"] != "none" and hover["bg"] != rest["bg"], f"no mark on hover: {hover}"
    assert rest["caps"], "no figure caption found"
    assert all(c == rest["body"] for c in rest["caps"]), f"captions {set(map(tuple, rest['caps']))} vs body {rest['body']}"


def test_wide_prose_tables_become_cards_on_a_phone(browser, server):
    page, errors = _open(browser, urljoin(server, "notation.html"), PHONE)
    try:
        info = page.evaluate("""() => [...document.querySelectorAll('article table.klbook-stack')].map(t => ({
            right: t.getBoundingClientRect().right, width: innerWidth,
            labels: [...t.querySelectorAll('td[data-label]')].length}))""")
    finally:
        page.close()
    assert info, "the notation page's four-column table is not stacked on a phone"
    for t in info:
        assert t["right"] <= t["width"] + 1 and t["labels"] > 0, t
    assert not errors, errors


# ------------------------------------------------- figures legible on a phone (issue 24)
# kb.display.glue_figure writes into each PNG it glues how it was drawn (dpi, smallest
# tick label in pt: klbook_lib.display.png_info) and, for panels side by side, a second
# rendering with the panels stacked that a <picture> shows below 640 px
# (_ext/klbook_reader.py). On screen a tick label is
#     tick_pt / 72 * dpi  PNG pixels  *  (CSS width of the <img> / natural width of the PNG)
# CSS pixels high (its em size). At 390 px it must be at least MIN_TICK_CSS_PX.
MIN_TICK_CSS_PX = 7.0
MIN_TEXT_CSS_PX = 7.0   # the smallest legend, title, label or annotation text (klbook_lib.display.text_fontsize_pt)

FIGURE_IMAGES_JS = """
() => [...document.querySelectorAll('article figure img')].map(img => ({
  figure: (img.closest('figure') || {}).id || '',
  current: img.currentSrc || img.src, src: img.src, natural: img.naturalWidth,
  shown: img.getBoundingClientRect().width, picture: !!img.closest('picture.klbook-picture'),
  complete: img.complete}))
"""


def _png_of_url(url: str) -> bytes:
    if url.startswith("data:image/png;base64,"):  # a frame of an interactive figure (klbook_lib.interactive)
        import base64

        return base64.b64decode(url.split(",", 1)[1])
    path = (HTML / unquote(urlparse(url).path).lstrip("/")).resolve()
    assert path.is_file() and HTML in path.parents, f"{url} is not a file of the site"
    return path.read_bytes()


def _png_width(png: bytes) -> int:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", "not a PNG"
    return int.from_bytes(png[16:20], "big")


def _figure_images(browser, server, rel: str, viewport) -> list[dict]:
    from klbook_lib.display import png_info

    page, errors = _open(browser, urljoin(server, rel), viewport)
    try:
        images = page.evaluate(FIGURE_IMAGES_JS)
    finally:
        page.close()
    assert not errors, errors
    for img in images:
        png = _png_of_url(img["current"])
        img["info"] = png_info(png)
        img["png_width"] = _png_width(png)
    return images


FIGURE_PAGES = _pages_with("<figure") if HTML.exists() else []


@pytest.mark.parametrize("rel", FIGURE_PAGES)
def test_figure_tick_text_is_legible_at_390px(browser, server, rel, record_property):
    """Every figure glued with kb.display.glue_figure shows its tick labels at least
    MIN_TICK_CSS_PX and every other text (legend, titles, labels) at least MIN_TEXT_CSS_PX
    CSS px high at 390 px, computed from the figure's DPI and tick size (read
    from the PNG the browser chose), the PNG's natural width and the <img>'s CSS width.
    Figures glued with plain glue() carry no such record and are not measured (a page
    without any passes)."""
    images = _figure_images(browser, server, rel, PHONE)
    measured, small = [], []
    for img in images:
        info = img["info"]
        if not info or info.get("tick_pt") is None:
            continue
        assert img["complete"] and img["natural"] == img["png_width"], img
        if img["picture"]:
            assert info["rendering"] == "phone", f"{rel} {img['figure']}: at 390 px the <picture> shows {info}"
        scale = 1 / 72 * info["dpi"] * img["shown"] / img["natural"]
        css = info["tick_pt"] * scale
        text_pt = info.get("text_pt")
        measured.append((img["figure"], round(css, 2), round(text_pt * scale, 2) if text_pt is not None else None))
        if css < MIN_TICK_CSS_PX:
            small.append(f"{img['figure']}: tick labels {css:.1f} CSS px ({info['tick_pt']:g} pt at {info['dpi']:g} dpi, "
                         f"PNG {img['natural']} px shown {img['shown']:.0f} px, {info['rendering']} rendering)")
        # every other text too (legends, titles, axis labels, annotations), when the PNG records it
        text = info.get("text_pt")
        if text is not None and text * scale < MIN_TEXT_CSS_PX:
            small.append(f"{img['figure']}: its smallest text (legend, title, label or annotation) is "
                         f"{text * scale:.1f} CSS px ({text:g} pt, {info['rendering']} rendering)")
    record_property("tick_css_px", measured)
    print(f"\n{rel}: (figure, tick text, smallest text) at 390 px (CSS px): {measured}")
    assert not small, (f"{rel}: tick text smaller than {MIN_TICK_CSS_PX} CSS px at 390 px (panels side by side get "
                       "a stacked rendering; a colorbar or twin-axes figure must be drawn legible at 342 px):\n"
                       + "\n".join(small))


def test_some_figure_is_measured():
    """The legibility check above is not empty: some figure of the site was glued with
    kb.display.glue_figure, and some has a phone rendering."""
    from klbook_lib.display import png_info

    infos = [png_info(p.read_bytes()) for p in (HTML / "_images").glob("*.png")]
    assert any(i.get("rendering") == "wide" for i in infos), "no figure of the site was glued with glue_figure"
    assert any(i.get("rendering") == "phone" for i in infos), "no figure of the site has a phone rendering"


@pytest.mark.parametrize("rel", _pages_with("klbook-picture") if HTML.exists() else [])
def test_phone_renderings_are_only_picture_sources(browser, server, rel):
    """A phone rendering appears only as the <source> of its figure's <picture>: never as an
    <img> or output of its own; the picture's <img> is the wide rendering, with real alt
    text. At 1366 px the browser shows the wide rendering, at 390 px the stacked one; the
    lightbox opens the wide one."""
    from klbook_lib.display import png_info

    here = (HTML / rel).parent
    phone_files = set()
    for picture in _article(rel).select("picture.klbook-picture"):
        srcs = picture.select("source")
        assert len(srcs) == 1 and srcs[0].get("media") == "(max-width: 640px)", picture
        img = picture.find("img")
        assert img is not None and img.get("alt"), picture
        wide_file, phone_file = (here / img["src"]).resolve(), (here / srcs[0]["srcset"]).resolve()
        assert png_info(wide_file.read_bytes())["rendering"] == "wide", img
        assert png_info(phone_file.read_bytes())["rendering"] == "phone", srcs[0]
        phone_files.add(phone_file)
    assert phone_files, f"{rel}: no picture"
    shown = [f"{_rel(p)}: <img src={img.get('src')}>" for p in _pages() for img in _article(_rel(p)).find_all("img")
             if (p.parent / (img.get("src") or "")).resolve() in phone_files]
    assert not shown, "a phone rendering shown as an image of its own:\n" + "\n".join(shown)
    wide = [i for i in _figure_images(browser, server, rel, LAPTOP) if i["picture"]]
    assert wide and all(i["info"]["rendering"] == "wide" for i in wide), wide
    narrow = [i for i in _figure_images(browser, server, rel, PHONE) if i["picture"]]
    assert narrow and all(i["info"]["rendering"] == "phone" for i in narrow), narrow
    page, errors = _open(browser, urljoin(server, rel), PHONE)
    try:
        img = page.locator("picture.klbook-picture img").first
        img.scroll_into_view_if_needed()
        img.click()
        page.wait_for_timeout(400)
        big = page.locator(".klbook-lightbox img")
        assert big.is_visible(), "tapping a figure with a phone rendering did not enlarge it"
        src = big.evaluate("(b) => b.currentSrc || b.src")
        assert png_info(_png_of_url(src))["rendering"] == "wide", src
        page.keyboard.press("Escape")
    finally:
        page.close()
    assert not errors, errors


# ---------------------------------------------------------------- the Chinese edition (issue 27)
ZH = HTML / "zh"

# Chinese characters against Latin letters in the prose of the article (code, math and the
# figures' alt text left out): what the reader of the Chinese edition reads
ZH_TEXT_JS = r"""
() => {
  const art = document.querySelector('article') || document.body;
  const clone = art.cloneNode(true);
  clone.querySelectorAll('pre, code, mjx-container, .MathJax, script, style, .cell_output, '
                         + '.klbook-lang-switch, .klbook-translation-note').forEach(e => e.remove());
  const text = clone.textContent || '';
  const cjk = (text.match(/[\u4e00-\u9fff]/g) || []).length;
  const latin = (text.match(/[A-Za-z]/g) || []).length;
  const display = art.querySelectorAll('mjx-container[display="true"]').length;
  return {cjk, latin, display, width: document.documentElement.scrollWidth, view: window.innerWidth};
}
"""


def _zh_pages() -> list[str]:
    return sorted(_rel(p) for p in (ZH / "chapters").glob("[0-9][0-9]_*.html")) if ZH.exists() else []


def _decimals(rel: str) -> list[str]:
    """The decimal numbers in a page's prose (glued values: the book types none by hand)."""
    art = _article(rel)
    for tag in art.select("pre, code, .math, script, .cell_output, div.highlight"):
        tag.decompose()
    return sorted(re.findall(r"(?<![\w.])-?\d+\.\d+(?![\w.])", art.get_text(" ")))


def test_the_chinese_edition_is_built_beside_the_english_one():
    assert ZH.exists(), f"{ZH}: no Chinese edition (make book builds it: tools/i18n.py build)"
    en = {p.relative_to(HTML).as_posix() for p in (HTML / "chapters").glob("*.html")}
    zh = {p.relative_to(ZH).as_posix() for p in (ZH / "chapters").glob("*.html")}
    assert en and en == zh, sorted(en ^ zh)
    # every English page links its Chinese counterpart and back
    for rel in _chapter_pages()[:3]:
        assert _soup(rel).select_one(f'.klbook-lang-switch a[href$="{Path(rel).name}"]'), rel
        assert _soup(f"zh/{rel}").select_one(f'.klbook-lang-switch a[href$="{Path(rel).name}"]'), rel


@pytest.mark.parametrize("rel", _zh_pages())
def test_a_chinese_chapter_shows_the_same_numbers_as_the_english_one(rel):
    assert _decimals(rel) == _decimals(rel.removeprefix("zh/")), rel


_EN_DISPLAY: dict[str, int] = {}


# The Chinese pages share the English pages' theme, stylesheet and layout code, which the
# English checks prove at both widths; what the translation can break (a lost equation, an
# untranslated page, Chinese lines that do not wrap) shows at the phone width, the narrower
# one, so each Chinese chapter is opened there only (issue 34: 16 page loads fewer).
@pytest.mark.parametrize("viewport", [PHONE], ids=["390px"])
@pytest.mark.parametrize("rel", _zh_pages())
def test_a_chinese_chapter_in_the_browser(browser, server, rel, viewport):
    page, errors = _open(browser, urljoin(server, rel), viewport)
    try:
        info, text = page.evaluate(CHECK_PAGE_JS), page.evaluate(ZH_TEXT_JS)
        lost = page.evaluate(r"""() => [...document.querySelectorAll('article p')]
            .filter(p => p.textContent.trim() === '::').length""")
    finally:
        page.close()
    en = rel.removeprefix("zh/")
    if en not in _EN_DISPLAY:
        page, _ = _open(browser, urljoin(server, en), LAPTOP)
        try:
            _EN_DISPLAY[en] = page.evaluate(ZH_TEXT_JS)["display"]
        finally:
            page.close()
    # every display equation of the English page is typeset here too (a translated equation
    # would have become a "::" paragraph)
    assert text["display"] == _EN_DISPLAY[en] and not lost, (rel, text["display"], _EN_DISPLAY[en], lost)
    assert not errors, f"{rel}: " + "; ".join(errors[:10])
    assert not info["untypeset"] and not info["raw"], f"{rel}: math not typeset"
    assert not info["broken"], f"{rel}: images that did not load: {info['broken']}"
    # Chinese dominates the prose: more Chinese characters than Latin letters (names, code-like
    # terms and the few phrases glued by code stay Latin; measured 2.5-3.2 times as many on
    # 2026-12-02, where an untranslated page has none), and a page's worth of them
    assert text["cjk"] > text["latin"] and text["cjk"] > 500, (rel, text)
    assert text["width"] <= text["view"] + 1, f"{rel}: the page is wider than the screen"


def test_the_chinese_search_finds_chinese_words(browser, server):
    # Sphinx's Chinese search (jieba splits the text into words): a query in Chinese finds pages
    page, errors = _open(browser, urljoin(server, "zh/search.html?q=%E6%95%A3%E5%BA%A6"), LAPTOP)   # 散度
    try:
        page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0",
                               timeout=30000)
        hits = page.evaluate("() => [...document.querySelectorAll('#search-results li a')]"
                             ".map(a => a.getAttribute('href'))")
    finally:
        page.close()
    assert not errors, errors
    assert len(hits) >= 5 and any("chapters/01_kl_definition" in h for h in hits), hits


# ------------------------------------------------------- figures a reader can move (issue 38)
# (page, figure id, the library's function of the slider's value -> {row: [mean, bias, sd]})
def _k_moments(value: float) -> dict:
    from klbook_lib.interactive import kl_estimator_moments

    m = kl_estimator_moments(value)
    return {k: [m[k]["mean"], m[k]["bias"], m[k]["sd"]] for k in ("k1", "k2", "k3")}


def _gaussian_fits(value: float) -> dict:
    from klbook_lib.interactive import gaussian_fits_at_separation

    f = gaussian_fits_at_separation(value)
    return {f"{key} fit": [f[key][k] for k in ("mu", "sigma", "kl_pq", "kl_qp")] for key in ("forward", "reverse")}


INTERACTIVE = [("chapters/04_estimating_kl.html", "fig-04-spread", _k_moments),
               ("chapters/02_forward_reverse.html", "fig-02-moving", _gaussian_fits)]

INTERACTIVE_STATE_JS = """
(id) => {
  const box = document.querySelector('#' + id + ' .klbook-interactive');
  if (!box) return null;
  const slider = box.querySelector('input.klbook-interactive-slider');
  const img = box.querySelector('img.klbook-interactive-frame');
  const r = slider.getBoundingClientRect();
  const rows = [...box.querySelectorAll('table.klbook-interactive-readout tbody tr')].map(tr =>
    [tr.querySelector('th').textContent.trim(), [...tr.querySelectorAll('td')].map(td => td.textContent.trim())]);
  const data = JSON.parse(box.querySelector('script.klbook-interactive-data').textContent);
  return {index: Number(box.dataset.index), value: Number(slider.value), max: Number(slider.max),
          shown: box.querySelector('output').textContent.trim(), values: data.values, labels: data.labels,
          controls: !box.querySelector('.klbook-interactive-controls').hidden,
          slider: {x: r.left, y: r.top, w: r.width, h: r.height}, src: img.currentSrc || img.src, alt: img.alt,
          img: {w: img.getBoundingClientRect().width, natural: img.naturalWidth, complete: img.complete},
          pageWidth: document.documentElement.scrollWidth, viewWidth: document.documentElement.clientWidth, rows};
}
"""


def _close_to(text: str, value: float) -> bool:
    """``text`` (3 significant digits, kb.display.format_number) shows ``value``."""
    shown = float(text.replace("\u2212", "-"))
    return abs(shown - value) <= max(6e-3 * abs(value), 1e-9) or (abs(value) < 1e-9 and abs(shown) < 1e-9)


def _check_frame(state: dict, compute) -> list[str]:
    value = state["values"][state["index"]]
    expected = compute(value)
    bad = []
    if state["shown"] != state["labels"][state["index"]] or state["value"] != state["index"]:
        bad.append(f"the slider shows {state['shown']!r} at index {state['value']}, the figure is at {state['index']}")
    if [name for name, _ in state["rows"]] != list(expected):
        bad.append(f"rows {[n for n, _ in state['rows']]} != {list(expected)}")
    for name, cells in state["rows"]:
        for text, want in zip(cells, expected.get(name, [])):
            if not _close_to(text, want):
                bad.append(f"value {value}: {name} shows {text}, the library computes {want:.6g}")
    if f"{value:.2f}" not in state["alt"]:
        bad.append(f"the alt text does not name the value {value}: {state['alt']!r}")
    return bad


@pytest.mark.parametrize("prefix", ["", "zh/"])
@pytest.mark.parametrize("viewport", [PHONE, LAPTOP], ids=["390px", "1366px"])
@pytest.mark.parametrize("rel,fig_id,compute", INTERACTIVE, ids=[i[1] for i in INTERACTIVE])
def test_an_interactive_figure_shows_what_the_library_computes(browser, server, rel, fig_id, compute, viewport, prefix):
    """Moving the slider (by keyboard, by a tap on the track on a phone, by a mouse drag on
    a laptop) swaps in the frame of the value picked, and the numbers under it are the
    library's for that value; the figure fits the screen; both editions."""
    from klbook_lib.display import png_info

    if not (HTML / prefix / rel).exists():
        pytest.fail(f"{prefix}{rel} not built")
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]}, has_touch=viewport == PHONE,
                            is_mobile=viewport == PHONE)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    bad, frames = [], set()
    try:
        page.goto(urljoin(server, prefix + rel), wait_until="load")
        page.wait_for_timeout(300)
        state = page.evaluate(INTERACTIVE_STATE_JS, fig_id)
        assert state is not None, f"{prefix}{rel}: no interactive figure in #{fig_id}"
        assert state["controls"], "the slider is hidden although JavaScript runs"
        assert state["img"]["complete"] and state["img"]["natural"] > 0, state["img"]
        assert state["pageWidth"] <= state["viewWidth"] + 1, f"the page scrolls sideways: {state['pageWidth']}"
        assert state["slider"]["w"] >= 150 and state["slider"]["h"] >= 24, f"slider too small to touch: {state['slider']}"
        bad += _check_frame(state, compute)
        frames.add(state["src"])
        start = state["index"]
        slider = page.locator(f"#{fig_id} input.klbook-interactive-slider")
        # the keyboard: one step right, then to the end
        slider.focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(100)
        state = page.evaluate(INTERACTIVE_STATE_JS, fig_id)
        assert state["index"] == min(start + 1, state["max"]), state["index"]
        bad += _check_frame(state, compute)
        frames.add(state["src"])
        page.keyboard.press("End")
        page.wait_for_timeout(100)
        state = page.evaluate(INTERACTIVE_STATE_JS, fig_id)
        assert state["index"] == state["max"], state["index"]
        bad += _check_frame(state, compute)
        frames.add(state["src"])
        # a tap (phone) or a click (laptop) near the left end of the track picks the first value
        s = state["slider"]
        slider.scroll_into_view_if_needed()
        s = page.evaluate(INTERACTIVE_STATE_JS, fig_id)["slider"]
        x, y = s["x"] + 4, s["y"] + s["h"] / 2
        if viewport == PHONE:
            page.touchscreen.tap(x, y)
        else:
            page.mouse.click(x, y)
        page.wait_for_timeout(150)
        state = page.evaluate(INTERACTIVE_STATE_JS, fig_id)
        assert state["index"] == 0, f"a {'tap' if viewport == PHONE else 'click'} at the track's start left index {state['index']}"
        bad += _check_frame(state, compute)
        frames.add(state["src"])
        assert png_info(_png_of_url(state["src"])).get("scale") == 2, "a frame without the 2x record"
    finally:
        page.close()
    assert not errors, errors
    assert len(frames) == 4, f"the figure did not change with the slider ({len(frames)} different frames of 4)"
    assert not bad, f"{prefix}{rel} #{fig_id}:\n" + "\n".join(bad)


@pytest.mark.parametrize("rel,fig_id,compute", INTERACTIVE, ids=[i[1] for i in INTERACTIVE])
def test_an_interactive_figure_has_a_static_image_without_javascript(browser, server, rel, fig_id, compute):
    """Without JavaScript the figure is its starting frame (an ordinary image) with that
    frame's numbers, and no slider that does nothing."""
    context = browser.new_context(java_script_enabled=False, viewport={"width": PHONE[0], "height": PHONE[1]})
    page = context.new_page()
    try:
        page.goto(urljoin(server, rel), wait_until="load")
        info = page.evaluate("""(id) => { const box = document.querySelector('#' + id + ' .klbook-interactive');
          const img = box.querySelector('img'); const c = box.querySelector('.klbook-interactive-controls');
          return {complete: img.complete, natural: img.naturalWidth, shown: img.getBoundingClientRect().width,
                  sliderVisible: c.getBoundingClientRect().height > 0}; }""", fig_id)
    finally:
        context.close()
    assert info["complete"] and info["natural"] > 0 and 100 < info["shown"] <= PHONE[0], info
    assert not info["sliderVisible"], "a slider shows without JavaScript"
    # a fresh parse: other checks strip <script> from the cached soup of the page
    box = BeautifulSoup((HTML / rel).read_text(errors="replace"), "html.parser").select_one(f"#{fig_id} .klbook-interactive")
    start = int(box["data-start"])
    data = __import__("json").loads(box.select_one("script.klbook-interactive-data").string)
    rows = [(tr.th.get_text(strip=True), [td.get_text(strip=True) for td in tr.find_all("td")])
            for tr in box.select("table.klbook-interactive-readout tbody tr")]
    state = {"index": start, "value": start, "values": data["values"], "labels": data["labels"],
             "shown": data["labels"][start], "rows": rows, "alt": box.img["alt"]}
    assert not _check_frame(state, compute)


@pytest.mark.parametrize("src,dst", [("", "zh/"), ("zh/", "")], ids=["en-to-zh", "zh-to-en"])
def test_the_language_switch_keeps_the_section(browser, server, src, dst):
    """Switching the edition in the middle of a chapter opens the other edition at the same
    section, not at the top (_static/klbook.js): the section the URL names, else the one at
    the top of the window when the switch is used."""
    rel = "chapters/04_estimating_kl.html"
    if not (HTML / "zh" / rel).exists():
        pytest.fail("the Chinese edition is not built")
    ids = [s.get("id") for s in _article(rel).select("section[id]")]
    assert len(ids) >= 4, ids
    target = ids[3]
    assert _soup("zh/" + rel).select_one(f"section#{target}") is not None, f"zh has no section #{target}"
    # the reader arrives at a section by a link (the contents, search, a cross-reference),
    # reads on, and switches the edition
    page, errors = _open(browser, urljoin(server, src + rel + "#" + target), LAPTOP)
    try:
        page.evaluate("() => window.scrollBy(0, 40)")
        page.wait_for_timeout(200)
        page.click("a.klbook-lang-link")
        page.wait_for_load_state("load")
        page.wait_for_timeout(300)
        url = page.url
        top = page.evaluate(f"() => document.getElementById({target!r}).getBoundingClientRect().top")
    finally:
        page.close()
    assert not errors, errors
    assert url.endswith(f"{dst}{rel}#{target}"), url
    assert abs(top) < 200, f"the section is not in view after the switch (top {top})"


# ------------------------------------------------ equations that fit a phone (issue 38)
# The goal: at most 5 display equations of the book scroll sideways at 390 px and
# at most 10 inline formulas become scroll boxes. Until the long displays of every chapter
# are broken (aligned at their natural breaks), these allowances are a ratchet set to the
# counts measured when they were last lowered; lower them as chapters are fixed.
DISPLAY_OVERFLOW_ALLOWANCE = 43   # measured 2026-12-06 (issue 38: 57 before; goal 5)
INLINE_SCROLL_ALLOWANCE = 63     # measured 2026-12-06 (goal 10)
EQUATION_COUNT_JS = """
() => {
  const col = document.querySelector('article.bd-article');
  let displays = 0, over = [], inline = 0, scroll = [];
  for (const c of col.querySelectorAll('mjx-container[display="true"]')) {
    if (!c.checkVisibility()) continue;
    displays += 1;
    if (c.scrollWidth > c.clientWidth + 1) {
      const d = c.closest('div.math');
      over.push(((d && d.id) || '') + ' +' + (c.scrollWidth - c.clientWidth) + 'px');
    }
  }
  for (const c of col.querySelectorAll('mjx-container[jax="CHTML"]:not([display="true"])')) {
    if (!c.checkVisibility()) continue;
    inline += 1;
    const ox = getComputedStyle(c).overflowX;
    if ((ox === 'auto' || ox === 'scroll') && c.scrollWidth > c.clientWidth + 1) scroll.push(c.textContent.slice(0, 40));
  }
  return {displays, over, inline, scroll};
}
"""


def test_count_equations_that_scroll_at_390px(browser, server, record_property):
    """Counts, over every chapter, the display equations wider than the phone's column and
    the inline formulas that scroll in a box of their own; fails above the allowances."""
    totals = {"displays": 0, "over": [], "inline": 0, "scroll": []}
    for rel in _chapter_pages():
        page, errors = _open(browser, urljoin(server, rel), PHONE)
        try:
            page.wait_for_timeout(200)
            info = page.evaluate(EQUATION_COUNT_JS)
        finally:
            page.close()
        totals["displays"] += info["displays"]
        totals["inline"] += info["inline"]
        totals["over"] += [f"{rel}: {o}" for o in info["over"]]
        totals["scroll"] += [f"{rel}: {s}" for s in info["scroll"]]
    record_property("equations_390px", {k: len(v) if isinstance(v, list) else v for k, v in totals.items()})
    print(f"\nat 390 px: {len(totals['over'])} of {totals['displays']} display equations overflow, "
          f"{len(totals['scroll'])} of {totals['inline']} inline formulas scroll\n" + "\n".join(totals["over"])
          + "\ninline:\n" + "\n".join(totals["scroll"]))
    assert len(totals["over"]) <= DISPLAY_OVERFLOW_ALLOWANCE, "\n".join(totals["over"])
    assert len(totals["scroll"]) <= INLINE_SCROLL_ALLOWANCE, "\n".join(totals["scroll"])
