"""The whole book as one PDF, offline: ``make pdf`` writes ``_build/pdf/book.pdf``.

1. Sphinx's single-page builder (``jupyter-book build --builder singlehtml``) writes the
   whole book as one HTML page into ``_build/singlehtml``. It reuses the jupyter-cache
   and the parsed documents of the HTML build, so no notebook runs again.
2. The Chromium that the browser check uses (Debian's ``chromium``, driven by
   playwright) opens that page from a local server, waits until MathJax has typeset
   every equation and every image has loaded, and prepares it for paper: a title page
   and a table of contents (from ``_toc.yml``), each chapter on a new page, display
   equations and tables wider than the page scaled down to fit, code lines wrapped
   (the print stylesheet ``_ext/static/klbook-print.css``).
3. It prints twice: the first PDF tells on which page each chapter starts (Chromium
   writes a named destination for every link target), the second prints those page
   numbers in the table of contents. The PDF also carries bookmarks (the outline) for
   every heading and a page number in every footer.

The PDF is copied to ``_build/html/book.pdf`` when the HTML book exists, where the
landing page links it. Summary numbers (pages, images, equations) are printed and
written next to the PDF as ``book.json``.

``--lang zh`` prints the Chinese edition instead (issue 27): a single-page build with
``language=zh_CN`` into ``_build/singlehtml-zh``, printed to ``_build/pdf/book-zh.pdf`` and
copied to ``_build/html/book-zh.pdf``; its Chinese text needs a CJK font
(``tools/ensure_chromium.sh`` installs one).

Usage: ``.venv/bin/python tools/build_pdf.py [--root DIR] [--no-build] [--out FILE] [--lang zh]``
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from pdfinfo import PDF, decode_text, encode_text, update_objects  # noqa: E402

PAGE = dict(format="A4", scale=0.8, margin=dict(top="14mm", bottom="16mm", left="14mm", right="14mm"))
LAYOUT_WIDTH = 860   # CSS px across the printable width at that scale: (210 - 28) mm / 0.8
FOOTER = ('<div style="width:100%;font-size:8px;color:#666;text-align:center;'
          'font-family:DejaVu Sans,sans-serif"><span class="pageNumber"></span></div>')


def toc_structure(root: Path) -> dict:
    """The book's parts and documents from ``_toc.yml``: [{caption, docs: [{doc, level}]}]."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    parts = []

    def walk(entries, level, out):
        for e in entries or []:
            if "file" in e:
                out.append({"doc": str(Path(e["file"]).with_suffix("")), "level": level})
            walk(e.get("sections"), level + 1, out)
            walk(e.get("chapters"), level, out)

    for part in toc.get("parts", []):
        docs: list = []
        walk(part.get("chapters"), 1, docs)
        parts.append({"caption": part.get("caption", ""), "docs": docs})
    if toc.get("chapters"):
        docs = []
        walk(toc["chapters"], 1, docs)
        parts.append({"caption": "", "docs": docs})
    config = yaml.safe_load((root / "_config.yml").read_text())
    return {"root": str(Path(toc["root"]).with_suffix("")), "parts": parts,
            "title": config.get("title", ""), "author": config.get("author", "")}


def build_singlehtml(root: Path) -> Path:
    jb = Path(sys.executable).with_name("jupyter-book")
    env = dict(os.environ, MPLBACKEND=os.environ.get("MPLBACKEND", "Agg"),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    cmd = [str(jb), "build", str(root), "--builder", "singlehtml", "--keep-going"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log = done.stdout + done.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    if done.returncode:
        print(log[-6000:], file=sys.stderr)
        raise SystemExit(f"the single-page build failed (exit {done.returncode})")
    for line in warnings:
        print("  single-page build:", line)
    out = root / "_build" / "singlehtml"
    return out


def build_singlehtml_zh(root: Path) -> Path:
    """The Chinese edition as one page (``language=zh_CN``, the catalogues of ``locales/``),
    from the same jupyter-cache: ``_build/singlehtml-zh``."""
    import i18n      # tools/, on sys.path above (it builds the book it lies in)

    return i18n.build(warningiserror=False, builder="singlehtml", quiet=True)


# ------------------------------------------------------------------ in the browser
PREPARE_JS = r"""
(book) => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  // the theme's print header repeats one page's title and contents: the book has its own
  for (const el of document.querySelectorAll('#jb-print-docs-body')) el.remove();
  // each document of the book starts on a new page; collect the chapter titles
  // (the contents point at each document's first section: its id lands on the page where the
  // document starts, while the empty marker before it stays on the previous page)
  const titles = {}, targets = {};
  for (const span of document.querySelectorAll('span[id^="document-"]')) {
    const doc = span.id.slice('document-'.length);
    const section = span.nextElementSibling;
    if (section && section.id) {
      section.classList.add('klbook-doc-start');
      targets[doc] = section.id;
      const h = section.querySelector('h1, h2, h3');
      titles[doc] = h ? h.textContent.replace(/#\s*$/, '').trim() : doc;
    }
  }
  // title page and table of contents
  const front = document.createElement('div');
  front.id = 'klbook-front';
  const esc = (s) => s.replace(/[&<>]/g, (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;'}[c]));
  let html = `<div class="klbook-cover"><h1 class="klbook-cover-title">${esc(book.title)}</h1>` +
             `<div class="klbook-cover-author">${esc(book.author)}</div>` +
             `<div class="klbook-cover-note">Printed from the HTML edition. Every number in the text ` +
             `was computed, and checked, by the code on its page when the book was built.</div></div>` +
             `<nav id="klbook-toc"><div class="klbook-toc-title">Contents</div>`;
  const missing = [];
  for (const part of book.parts) {
    if (part.caption) html += `<div class="klbook-toc-part">${esc(part.caption)}</div>`;
    for (const d of part.docs) {
      const title = titles[d.doc];
      if (!title) { missing.push(d.doc); continue; }
      html += `<div class="klbook-toc-entry klbook-toc-l${d.level}"><a href="#${targets[d.doc]}">` +
              `<span class="klbook-toc-text">${esc(title)}</span><span class="klbook-toc-dots"></span>` +
              `<span class="klbook-toc-page" data-target="${targets[d.doc]}">000</span></a></div>`;
    }
  }
  html += `</nav>`;
  front.innerHTML = html;
  article.prepend(front);
  const style = document.createElement('style');
  style.textContent = `
    #klbook-front .klbook-cover { height: 240mm; display: flex; flex-direction: column; justify-content: center; }
    /* the theme hides the article's first h1 in print (its print header repeats it) */
    #klbook-front h1.klbook-cover-title { display: block !important; font-size: 34pt; font-weight: 600;
      line-height: 1.2; text-align: left; margin: 0; }
    .klbook-cover-author { font-size: 15pt; margin-top: 12pt; }
    .klbook-cover-note { font-size: 10.5pt; margin-top: 40pt; max-width: 120mm; color: #444; }
    #klbook-toc { break-before: page; break-after: page; }
    .klbook-toc-title { font-size: 22pt; font-weight: 600; margin-bottom: 10pt; }
    .klbook-toc-part { font-weight: 600; margin: 9pt 0 2pt; font-size: 11.5pt; }
    .klbook-toc-entry a { display: flex; color: inherit !important; text-decoration: none; font-size: 10.5pt; line-height: 1.6; }
    .klbook-toc-l2 a { padding-left: 16pt; font-size: 9.5pt; }
    .klbook-toc-dots { flex: 1; border-bottom: 1px dotted #999; margin: 0 4pt 4pt; }
    .klbook-toc-page { font-variant-numeric: tabular-nums; min-width: 2.2em; text-align: right; }
    .klbook-doc-start { break-before: page; }
    details.above-input, details.hide, .cell details { break-inside: avoid; }
  `;
  document.head.appendChild(style);
  return {missing, targets, documents: Object.keys(titles).length};
}
"""

# After print media is emulated: fit wide equations and tables, count what could go wrong.
FIT_JS = r"""
() => {
  const out = {equations: 0, scaled_equations: 0, scaled_tables: 0, min_scale: 1,
               wide_code: 0, images: 0, broken_images: 0, math_errors: 0, raw_tex: 0};
  const fit = (el, need, avail) => {
    if (need <= avail + 1) return false;
    const f = Math.max(0.45, (avail - 2) / need);
    el.style.fontSize = (f * 100).toFixed(1) + '%';
    out.min_scale = Math.min(out.min_scale, f);
    return true;
  };
  for (const c of document.querySelectorAll('mjx-container[display="true"]')) {
    out.equations++;
    const box = c.closest('div.math') || c.parentElement;
    const math = c.querySelector('mjx-math') || c;
    const labels = c.querySelector('mjx-labels');
    const need = math.getBoundingClientRect().width + (labels ? labels.getBoundingClientRect().width + 16 : 0);
    if (fit(c, need, box.clientWidth)) out.scaled_equations++;
  }
  for (const t of document.querySelectorAll('article table')) {
    const box = t.parentElement;
    if (fit(t, t.scrollWidth, box.clientWidth)) out.scaled_tables++;
  }
  for (const p of document.querySelectorAll('article pre')) {
    if (p.scrollWidth > p.clientWidth + 1) out.wide_code++;
  }
  for (const img of document.querySelectorAll('article img')) {
    out.images++;
    if (!img.complete || img.naturalWidth === 0) out.broken_images++;
  }
  out.math_errors = document.querySelectorAll('mjx-merror').length;
  // TeX that MathJax did not typeset would still show its delimiters
  for (const m of document.querySelectorAll('div.math, span.math')) {
    if (!m.querySelector('mjx-container')) out.raw_tex++;
  }
  return out;
}
"""

# The headings as a reader sees them, in order (for the bookmarks, see fix_outline).
HEADINGS_JS = r"""
() => [...document.querySelectorAll('article h1, article h2, article h3, article h4, article h5, article h6')]
  .filter((h) => h.getClientRects().length > 0)
  .map((h) => {
    // the text with each formula as MathJax's plain-text reading of it, and without formulas
    const tidy = (s) => s.replace(/\s+/g, ' ').trim();
    const c = h.cloneNode(true);
    c.querySelectorAll('.headerlink').forEach((e) => e.remove());
    const bare = c.cloneNode(true);
    bare.querySelectorAll('mjx-container').forEach((e) => e.remove());
    c.querySelectorAll('mjx-container').forEach((m) => {
      const mml = m.querySelector('mjx-assistive-mml');
      m.replaceWith(document.createTextNode(mml ? mml.textContent : ''));
    });
    return {text: tidy(c.textContent), bare: tidy(bare.textContent)};
  })
"""

FILL_PAGES_JS = r"""
(pages) => {
  let filled = 0;
  for (const s of document.querySelectorAll('.klbook-toc-page')) {
    const p = pages[s.dataset.target];
    if (p) { s.textContent = String(p); filled++; }
  }
  return filled;
}
"""


def _squash(text: str) -> str:
    return "".join(text.split())


def _subsequence(short: str, long: str) -> bool:
    it = iter(long)
    return all(ch in it for ch in short)


def _same_heading(wanted: str, title: str) -> bool:
    """Does Chromium's (garbled) bookmark ``title`` stand for the heading ``wanted``?"""
    w, t = _squash(wanted), _squash(title)
    if not w:
        return False
    return w in t or (t[:2] == w[:2] and len(t) <= 2 * len(w) + 8 and _subsequence(w, t))


def fix_outline(data: bytes, headings: list[dict]) -> tuple[bytes, int, int]:
    """Bookmark titles exactly as the headings read.

    Chromium builds the bookmarks from the headings but garbles some titles: a heading
    moved to the next page comes out twice ("SymbolsSymbols"), and a heading that wraps
    loses the space at the line break. The bookmarks and the headings are in the same
    order; each bookmark is matched with the next heading whose letters it carries in
    order (formulas left out: Chromium drops them) and given that heading's text, with
    formulas as plain text (a PDF incremental update: nothing else in the file
    changes). Returns the new PDF, and how many bookmarks matched of how many there are.
    """
    pdf = PDF(data)
    items = pdf.outline_items()
    changed, j, matched = {}, 0, 0
    for _, num, item in items:
        title = decode_text(item.get("Title", b""))
        for k in range(j, min(j + 8, len(headings))):
            wanted = headings[k]["text"]
            if _same_heading(headings[k]["bare"], title):
                if wanted != title:
                    changed[num] = dict(item, Title=encode_text(wanted))
                j, matched = k + 1, matched + 1
                break
    return update_objects(data, changed), matched, len(items)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise SystemExit("Debian's chromium is needed to print the PDF (bash tools/ensure_chromium.sh)")
    return path


def print_pdf(site: Path, book: dict, out: Path) -> dict:
    from playwright.sync_api import sync_playwright

    handler = functools.partial(_Quiet, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/{book['root']}.html"
    stats: dict = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=_chromium(), headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
            page = browser.new_page(viewport={"width": LAYOUT_WIDTH, "height": 1200})
            page.set_default_timeout(600_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            t0 = time.time()
            page.goto(url, wait_until="load")
            page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
            page.evaluate("() => document.fonts.ready.then(() => true)")
            stats["load_and_typeset_s"] = round(time.time() - t0, 1)
            prepared = page.evaluate(PREPARE_JS, book)
            if prepared["missing"]:
                raise SystemExit(f"documents of _toc.yml missing from the single page: {prepared['missing']}")
            page.emulate_media(media="print")
            stats.update(page.evaluate(FIT_JS))
            stats["page_errors"] = errors
            options = dict(PAGE, print_background=False, outline=True, tagged=True,
                           display_header_footer=True, header_template="<span></span>",
                           footer_template=FOOTER)
            targets = list(prepared["targets"].values())
            pages: dict = {}
            for attempt in range(3):
                t1 = time.time()
                data = page.pdf(**options)
                stats[f"print_{attempt + 1}_s"] = round(time.time() - t1, 1)
                dests = PDF(data).destinations()
                found = {t: dests[t] for t in targets if t in dests}
                if found == pages:
                    break  # the numbers printed in the contents are the pages they name
                pages = found
                page.evaluate(FILL_PAGES_JS, pages)
            headings = page.evaluate(HEADINGS_JS)
            data, matched, total = fix_outline(data, headings)
            stats["bookmarks_matched"] = f"{matched}/{total}"
            stats["toc_pages_found"] = len(pages)
            stats["toc_entries"] = len(targets)
            browser.close()
    finally:
        httpd.shutdown()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    pdf = PDF(data)
    stats.update(pdf_pages=len(pdf.pages()), pdf_images=pdf.image_count(),
                 pdf_bookmarks=len(pdf.outline()), toc=pages)
    return stats


def _publish_module(root: Path):
    """``_ext/klbook_publish.py`` (the landing page's PDF link lives there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("klbook_publish_for_pdf", root / "_ext" / "klbook_publish.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(ROOT), help="the book's folder (default: this repository)")
    ap.add_argument("--out", default=None, help="the PDF to write (default ROOT/_build/pdf/book.pdf)")
    ap.add_argument("--no-build", action="store_true", help="print the existing _build/singlehtml")
    ap.add_argument("--lang", choices=("en", "zh"), default="en",
                    help="zh: the Chinese edition -> _build/pdf/book-zh.pdf (html/book-zh.pdf)")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    zh = args.lang == "zh"
    name = "book-zh.pdf" if zh else "book.pdf"
    out = Path(args.out) if args.out else root / "_build" / "pdf" / name
    t0 = time.time()
    site = root / "_build" / ("singlehtml-zh" if zh else "singlehtml")
    if not args.no_build:
        site = build_singlehtml_zh(root) if zh else build_singlehtml(root)
    t_build = time.time() - t0
    book = toc_structure(root)
    stats = print_pdf(site, book, out)
    stats["singlehtml_build_s"] = round(t_build, 1)
    stats["total_s"] = round(time.time() - t0, 1)
    problems = []
    if stats["broken_images"]:
        problems.append(f"{stats['broken_images']} images did not load")
    if stats["math_errors"] or stats["raw_tex"]:
        problems.append(f"MathJax: {stats['math_errors']} errors, {stats['raw_tex']} equations not typeset")
    if stats["wide_code"]:
        problems.append(f"{stats['wide_code']} code blocks wider than the page")
    if stats["toc_pages_found"] != stats["toc_entries"]:
        problems.append(f"contents: page numbers for {stats['toc_pages_found']} of {stats['toc_entries']} entries")
    if stats["page_errors"]:
        problems.append(f"JavaScript errors: {stats['page_errors'][:3]}")
    (out.parent / name.replace(".pdf", ".json")).write_text(json.dumps(stats, indent=1))
    html = root / "_build" / "html"
    if html.is_dir():
        shutil.copy2(out, html / name)
        if not zh:
            _publish_module(root).sync_pdf_link(html)  # the landing page links it again
    print(f"{out}: {stats['pdf_pages']} pages, {stats['pdf_images']} images, "
          f"{stats['equations']} display equations ({stats['scaled_equations']} scaled to fit, "
          f"smallest {stats['min_scale']:.2f}), {stats['pdf_bookmarks']} bookmarks; "
          f"single-page build {stats['singlehtml_build_s']} s, total {stats['total_s']} s")
    if html.is_dir():
        print(f"copied to {html / name}" + ("" if zh else " (linked from the landing page)"))
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
