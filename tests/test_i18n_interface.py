"""The Chinese edition's interface (issue 39, _ext/klbook_i18n.py): the strings come from
locales/zh_CN/interface.po and are put in place only where they stand whole (a short string
between two tags, a long phrase wherever it is, a table header as a <th>'s whole text)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "_ext"))
import klbook_i18n  # noqa: E402

STRINGS = klbook_i18n.interface_catalogue()


def test_the_catalogue_translates_the_interface_the_extensions_write():
    sys.path.insert(0, str(REPO / "_ext"))
    import klbook_reader

    for english in (klbook_reader.CHECK_SHOW, klbook_reader.CHECK_HIDE, "Show code cell source", "Run it yourself",
                    ".ipynb (needs klbook_lib)"):
        assert STRINGS.get(english) and not any(c.isascii() and c.isalpha() for c in STRINGS[english].replace(
            "ipynb", "").replace("klbook_lib", "")), english


def test_translate_html_replaces_whole_texts_only():
    html = ('<summary><p>Show the check</p></summary><p>Show the checkpoint</p>'
            '<p>Download <a href="w">w</a> (the book\u2019s library) and <a>r</a></p>'
            '<table><tr><th>Show the check</th><th>p90 KL</th></tr></table>')
    out = klbook_i18n.translate_html(html, STRINGS)
    assert "<p>显示检验代码</p>" in out and "<p>Show the checkpoint</p>" in out      # a longer text stays
    assert "下载 <a" in out and "（本书的库）和 " in out
    assert "<th>显示检验代码</th>" in out and "<th>p90 KL</th>" in out           # unknown header stays


def test_the_tab_title_is_the_landing_pages_heading():
    from babel.messages.pofile import read_po

    with (REPO / "locales/zh_CN/LC_MESSAGES/intro.po").open("rb") as f:
        intro = {m.id: m.string for m in read_po(f) if m.id}
    assert klbook_i18n.ZH_TITLE in intro.values()
