"""The two editions of the book (issue 27): English at ``_build/html``, Chinese at ``_build/html/zh``.

Both are built from the same notebooks and the same jupyter-cache; the Chinese one reads the
gettext catalogues in ``locales/zh_CN/LC_MESSAGES/<page>.po`` (``tools/i18n.py`` extracts and
updates them; Sphinx compiles them at build time). This extension

- puts a language switch at the top of every page (of the English edition only when
  ``KLBOOK_ZH`` is set, i.e. when the Chinese edition is built beside it), linking the page to its counterpart in the
  other edition (``<a hreflang>``, plus a ``<link rel="alternate" hreflang>`` in the head), and
- on a Chinese page whose catalogue is not complete yet, says so above the text (the paragraphs
  without a translation are shown in English, as Sphinx does), so that a reader is never left
  guessing; ``translation_status(page)`` gives the counts the note and the tests use;
- on the Chinese edition, puts the interface in Chinese (issue 39): the sidebar's part captions
  (sphinx-external-toc inserts the toctrees after Sphinx translated the page, so they are
  translated here from the root page's catalogue), the folds' toggles, the download menu, the
  author line, the sentences that extensions write, and the column headers of the tables that
  ``klbook_lib.display.table`` generates. The strings come from the catalogue
  ``locales/zh_CN/interface.po`` (``interface_catalogue()``), so a missing translation stays
  English rather than guessed.
"""
from __future__ import annotations

import html
import os
import re
from pathlib import Path

ZH_DIR = "zh"                 # the Chinese edition, relative to the English one's root
ZH_LANGUAGE = "zh_CN"
ZH_TITLE = "强化学习中的 KL：一本可执行的教科书"       # the landing page's heading, word for word
ZH_AUTHOR = "《强化学习中的 KL》编写组"
INTERFACE_PO = Path(__file__).resolve().parents[1] / "locales" / ZH_LANGUAGE / "interface.po"


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
        config.author = ZH_AUTHOR
        if "togglebutton_hint" in config:        # sphinx-togglebutton's hover hints
            config.togglebutton_hint, config.togglebutton_hint_hide = "点击显示", "点击隐藏"
        config.html_search_language = "zh"


# ---------------------------------------------------------------- the interface in Chinese
_INTERFACE: dict[str, str] | None = None


def interface_catalogue(path: str | Path = INTERFACE_PO) -> dict[str, str]:
    """English -> Chinese for the interface and the generated tables' column headers (the
    translated, non-fuzzy messages of ``interface.po``)."""
    from babel.messages.pofile import read_po

    path = Path(path)
    if not path.is_file():
        return {}
    with path.open("rb") as f:
        catalog = read_po(f)
    return {m.id: m.string for m in catalog if m.id and m.string and not m.fuzzy}


def _interface() -> dict[str, str]:
    global _INTERFACE
    if _INTERFACE is None:
        _INTERFACE = interface_catalogue()
    return _INTERFACE


def _page_catalogue(srcdir, page: str) -> dict[str, str]:
    from babel.messages.pofile import read_po

    path = catalogue_path(srcdir, page)
    if not path.is_file():
        return {}
    with path.open("rb") as f:
        return {m.id: m.string for m in read_po(f) if m.id and m.string and not m.fuzzy}


def _translate_captions(app, doctree) -> None:
    """The toctree captions of a Chinese page (the sidebar's parts), from the page's catalogue."""
    if not is_zh(app.config.language):
        return
    from sphinx import addnodes

    toctrees = [n for n in doctree.findall(addnodes.toctree) if n.get("caption")]
    if not toctrees:
        return
    strings = _page_catalogue(app.srcdir, app.env.docname)
    for node in toctrees:
        node["caption"] = strings.get(node["caption"], node["caption"])


_TH = re.compile(r"(<th\b[^>]*>)([^<]*)(</th>)")


def translate_html(body: str, strings: dict[str, str]) -> str:
    """``body`` with the interface's English put in Chinese: a fold's toggle text, a sentence an
    extension writes (each known string where it stands as a whole text between tags), and a
    table's column header (a ``<th>`` whose whole text is a known header)."""
    import html as _html

    def text(m):
        inner = _html.unescape(m.group(2))
        key = inner.strip()
        if key in strings:
            return m.group(1) + _html.escape(inner.replace(key, strings[key]), quote=False) + m.group(3)
        return m.group(0)

    body = _TH.sub(text, body)
    for english, chinese in sorted(strings.items(), key=lambda kv: -len(kv[0])):
        if len(english) < 4:
            continue
        for form in {english, _html.escape(english, quote=False), english.replace("'", "’"),
                     _html.escape(english.replace("'", "’"), quote=False)}:
            if form not in body:
                continue
            if len(english) >= 30:          # a long phrase is itself unique: wherever it stands
                body = body.replace(form, chinese)
            else:                           # a short one only as the whole text between two tags
                body = re.sub(rf"(>[ \t\n]*){re.escape(form)}(?=[ \t\n]*<)", lambda m: m.group(1) + chinese, body)
    return body


def _translate_written_pages(app, exception) -> None:
    """Text that an extension writes into a finished page (the landing page's note on the PDF,
    klbook_publish's build-finished step) is translated after it."""
    if exception or not is_zh(app.config.language) or app.builder.format != "html":
        return
    strings = _interface()
    page = Path(app.outdir) / f"{app.config.root_doc}.html"
    if strings and page.is_file():
        text = page.read_text(encoding="utf-8")
        new = translate_html(text, strings)
        if new != text:
            page.write_text(new, encoding="utf-8")


def _translate_buttons(context: dict, strings: dict[str, str]) -> None:
    def walk(items):
        for item in items or []:
            if not isinstance(item, dict):
                continue
            for key in ("text", "tooltip"):
                value = item.get(key)
                if isinstance(value, str) and value in strings:
                    item[key] = strings[value]
            walk(item.get("buttons"))
    walk(context.get("header_buttons"))


def _interface_context(app, pagename, templatename, context, doctree) -> None:
    if not is_zh(app.config.language) or app.builder.format != "html":
        return
    strings = _interface()
    if not strings:
        return
    _translate_buttons(context, strings)
    if context.get("body"):
        context["body"] = translate_html(context["body"], strings)


def setup(app):
    app.setup_extension("klbook_i18n_search")     # the Chinese search (_ext/klbook_i18n_search.py)
    app.connect("config-inited", _config_inited)
    app.connect("doctree-read", _translate_captions, priority=400)   # before the toc collector (500)
    app.connect("html-page-context", _page_context, priority=400)
    app.connect("html-page-context", _interface_context, priority=900)
    app.connect("build-finished", _translate_written_pages, priority=900)     # after klbook_publish's
    return {"parallel_read_safe": True, "parallel_write_safe": True}
