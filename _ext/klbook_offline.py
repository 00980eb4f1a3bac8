"""Keep the built book free of resources from other hosts.

Jupyter Book 1.x always loads sphinx-thebe, which writes a CDN address for thebe into
every page (and, here, twice, which is a JavaScript error). The book runs no live
kernels, so this extension drops thebe's scripts and stylesheet from each page.
It also loads ``klbook_site`` (``_ext/klbook_site.py``), the book's site-wide fixes, and
``klbook_reader`` (``_ext/klbook_reader.py``): alt text, folded checks, search ranking.
"""
from __future__ import annotations


def _is_thebe(asset) -> bool:
    name = str(getattr(asset, "filename", asset) or "")
    body = str(getattr(asset, "attributes", {}).get("body", "")) if hasattr(asset, "attributes") else ""
    return "thebe" in name or "THEBE_JS_URL" in body


def _strip_thebe(app, pagename, templatename, context, doctree):
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [a for a in context[key] if not _is_thebe(a)]


def setup(app):
    # the site-wide fixes of what readers see (one header, figures, proof index)
    app.setup_extension("klbook_site")
    # phone reading: figure alt text, folded checks, search ranking (issue 24)
    app.setup_extension("klbook_reader")
    app.connect("html-page-context", _strip_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
