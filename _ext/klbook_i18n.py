"""The two editions of the book (issue 27): English at ``_build/html``, Chinese at ``_build/html/zh``.

Both are built from the same notebooks and the same jupyter-cache; the Chinese one reads the
gettext catalogues in ``locales/zh_CN/LC_MESSAGES/<page>.po`` (``tools/i18n.py`` extracts and
updates them; Sphinx compiles them at build time). This extension

- puts a language switch at the top of every page (of the English edition only when
  ``KLBOOK_ZH`` is set, i.e. when the Chinese edition is built beside it), linking the page to its counterpart in the
  other edition (``<a hreflang>``, plus a ``<link rel="alternate" hreflang>`` in the head), and
- on a Chinese page whose catalogue is not complete yet, says so above the text (the paragraphs
  without a translation are shown in English, as Sphinx does), so that a reader is never left
  guessing; ``translation_status(page)`` gives the counts the note and the tests use.
"""
from __future__ import annotations

import html
import os
from pathlib import Path

ZH_DIR = "zh"                 # the Chinese edition, relative to the English one's root
ZH_LANGUAGE = "zh_CN"
ZH_TITLE = "KL 散度与强化学习：一本可执行的教科书"


def is_zh(language: str | None) -> bool:
    return bool(language) and str(language).lower().replace("-", "_").startswith("zh")


def catalogue_path(srcdir: str | Path, page: str, language: str = ZH_LANGUAGE) -> Path:
    return Path(srcdir) / "locales" / language / "LC_MESSAGES" / f"{page}.po"


def translation_status(po_path: str | Path) -> tuple[int, int]:
    """(translated, total) messages of one catalogue; a fuzzy entry counts as not translated.
    A missing catalogue is (0, 0)."""
    from babel.messages.pofile import read_po

    path = Path(po_path)
    if not path.is_file():
        return 0, 0
    with path.open("rb") as f:
        catalog = read_po(f)
    messages = [m for m in catalog if m.id]
    done = [m for m in messages if m.string and not m.fuzzy]
    return len(done), len(messages)


def counterpart(pagename: str, language: str | None) -> str:
    """The relative URL, from page ``pagename`` of the edition in ``language``, of the same
    page in the other edition."""
    depth = pagename.count("/")
    if is_zh(language):
        return "../" * (depth + 1) + pagename + ".html"
    return "../" * depth + f"{ZH_DIR}/" + pagename + ".html"


def _page_context(app, pagename, templatename, context, doctree) -> None:
    if doctree is None or app.builder.format != "html" or app.builder.name == "singlehtml":
        return
    zh = is_zh(app.config.language)
    if not zh and not os.environ.get("KLBOOK_ZH"):
        return          # the English edition links the Chinese one only when that one is built too
    href = counterpart(pagename, app.config.language)
    other_lang, other_label, other_name = (("en", "English", "Read this page in English") if zh
                                           else ("zh-CN", "中文", "阅读本页的中文版"))
    context["metatags"] = context.get("metatags", "") + (
        f'\n<link rel="alternate" hreflang="{other_lang}" href="{html.escape(href)}" />')
    note = ""
    if zh:
        done, total = translation_status(catalogue_path(app.srcdir, pagename))
        if total and done < total:
            note = (f'<span class="klbook-translation-note">本页的翻译尚未完成（{done}/{total} 段）：'
                    "未翻译的段落以英文显示。</span>")
    switch = (f'<div class="klbook-lang-switch" lang="{"zh-CN" if zh else "en"}">'
              f'<a class="klbook-lang-link" href="{html.escape(href)}" hreflang="{other_lang}" lang="{other_lang}" '
              f'title="{other_name}">{other_label}</a>{note}</div>\n')
    context["body"] = switch + context.get("body", "")


def _config_inited(app, config) -> None:
    if is_zh(config.language):
        config.html_title = ZH_TITLE
        config.html_search_language = "zh"


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("html-page-context", _page_context, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
