"""Build the book in a private copy and take full-page screenshots of some pages.

For authors who want to see a page as a reader does without touching the shared
``_build`` (several people may be building at once). The repository is copied to a
scratch folder together with the jupyter-cache of ``_build``, so only notebooks that
changed since they were last executed run again; then the book is built there and
each requested page is screenshotted, full page, at 1366 px and at 390 px.

Usage:
    .venv/bin/python tools/preview.py chapters/03_trpo_ppo [more pages ...] [--out DIR]

Pages are given as in ``_toc.yml`` (no suffix). Screenshots land in
``DIR/<page>-1366.png`` and ``DIR/<page>-390.png`` (default DIR: /tmp/klbook-preview/shots),
and cut into pieces two screens tall (``...-1366-part01.png``, ...) that an image viewer
shows legibly. Display equations and tables wider than the text column are listed.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".git", "_build", "__pycache__", ".hypothesis", ".pytest_cache"}


def _copy_tree(dest: Path) -> None:
    if dest.exists():
        for child in dest.iterdir():
            if child.name != "_build":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    for child in ROOT.iterdir():
        if child.name in SKIP:
            continue
        target = dest / child.name
        if child.is_dir():
            shutil.copytree(child, target, ignore=shutil.ignore_patterns(*SKIP))
        else:
            shutil.copy2(child, target)
    cache = ROOT / "_build" / ".jupyter_cache"
    if cache.exists():
        shutil.copytree(cache, dest / "_build" / ".jupyter_cache", dirs_exist_ok=True)


# Display equations and tables wider than the text column (clipped or scrolling).
OVERFLOW_JS = """
() => {
  const col = document.querySelector('article.bd-article') || document.body;
  const right = col.getBoundingClientRect().right + 1;
  const out = [];
  for (const c of document.querySelectorAll('mjx-container[display="true"]')) {
    const r = (c.querySelector('mjx-math') || c).getBoundingClientRect();
    if (r.right > right || c.scrollWidth > c.clientWidth + 1) {
      const tex = (c.closest('.math') || c).getAttribute('id') || c.textContent.slice(0, 60);
      out.push(`wide equation (${Math.round(Math.max(r.right - right, c.scrollWidth - c.clientWidth))} px too wide): ${tex}`);
    }
  }
  for (const t of document.querySelectorAll('table')) {
    const box = t.parentElement.getBoundingClientRect();
    if (t.getBoundingClientRect().right > Math.min(right, box.right + 1) || t.scrollWidth > t.parentElement.clientWidth + 1)
      out.push(`wide table (${t.rows.length} rows): ${t.innerText.slice(0, 60).replace(/\\s+/g, ' ')}`);
  }
  return out;
}
"""


def _tiles(path: Path, tile_height: int) -> list[Path]:
    """Cut a tall full-page screenshot into pieces an image viewer shows legibly."""
    from PIL import Image

    image = Image.open(path)
    pieces = []
    for i, top in enumerate(range(0, image.height, tile_height)):
        piece = path.with_name(f"{path.stem}-part{i + 1:02d}.png")
        image.crop((0, top, image.width, min(top + tile_height, image.height))).save(piece)
        pieces.append(piece)
    return pieces


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _screenshots(html: Path, pages: list[str], out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    handler = functools.partial(_Quiet, directory=str(html))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        for page_name in pages:
            for width, height in ((1366, 900), (390, 844)):
                page = browser.new_page(viewport={"width": width, "height": height})
                page.goto(base + page_name + ".html", wait_until="load")
                page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
                page.wait_for_timeout(300)
                for line in page.evaluate(OVERFLOW_JS):
                    line = line.encode("utf-8", "replace").decode("utf-8")  # lone surrogates
                    print(f"  {page_name} at {width} px: {line}")
                path = out / f"{page_name.replace('/', '__')}-{width}.png"
                page.screenshot(path=str(path), full_page=True)
                written.append(path)
                written.extend(_tiles(path, tile_height=2 * height))
                page.close()
        browser.close()
    httpd.shutdown()
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pages", nargs="*", help="pages as in _toc.yml, e.g. chapters/03_trpo_ppo")
    ap.add_argument("--work", default=os.environ.get("KLBOOK_PREVIEW", "/tmp/klbook-preview"),
                    help="scratch folder for the copy and its build")
    ap.add_argument("--out", default=None, help="where screenshots go (default WORK/shots)")
    ap.add_argument("--no-build", action="store_true", help="only take screenshots of the last build")
    args = ap.parse_args(argv)
    work = Path(args.work)
    src = work / "book"
    if not args.no_build:
        _copy_tree(src)
        jb = Path(sys.executable).with_name("jupyter-book")
        env = dict(os.environ, MPLBACKEND="Agg", OMP_NUM_THREADS="1",
                   KLBOOK_CACHE=os.environ.get("KLBOOK_CACHE", str(ROOT / "_build" / "klbook_cache")))
        rc = subprocess.call([str(jb), "build", str(src), "--keep-going"], env=env)
        if rc:
            print(f"the build failed (exit {rc}); see the log above", file=sys.stderr)
            return rc
    html = src / "_build" / "html"
    print(f"built site: {html}/index.html")
    if args.pages:
        for path in _screenshots(html, args.pages, Path(args.out) if args.out else work / "shots"):
            print("screenshot:", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
