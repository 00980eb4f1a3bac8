"""A glued number survives translation: ``_ext/klbook_i18n_glue.py`` (issue 27's first step).

A two-page book is built with Sphinx and myst-nb: in English, and in Chinese from a ``zh_CN``
catalogue whose messages keep the glue roles. With the extension, both the inline
``{glue:text}`` and the ``{glue:}`` role print the page's number in the translated sentence;
without it (the control), the same build prints the sentence with no number and warns.
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
VALUE = 0.123456

PO = r'''msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"
"Language: zh_CN\n"

msgid "A page"
msgstr "一页"

msgid "The KL here is {glue:text}`klv:.3f` nats, as the code computed."
msgstr "这里的 KL 是 {glue:text}`klv:.3f` 奈特，与代码算出的一致。"

msgid "Again: {glue:}`klv`."
msgstr "再说一遍：{glue:}`klv`。"

msgid "Verdict: {glue:text}`verd`."
msgstr "结论：{glue:text}`verd`。"
'''


def executed_notebook() -> nbformat.NotebookNode:
    """The page, run once by a kernel (the builds below do not execute it again)."""
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A page\n\nThe KL here is {glue:text}`klv:.3f` nats, "
                                              "as the code computed."),
                nbformat.v4.new_code_cell(f"from myst_nb import glue\nglue('klv', {VALUE}, display=False)"),
                nbformat.v4.new_markdown_cell("Again: {glue:}`klv`."),
                nbformat.v4.new_code_cell("glue('verd', 'the arm is better', display=False)\n"
                                          "glue('verd__zh_CN', '该组更好', display=False)"),
                nbformat.v4.new_markdown_cell("Verdict: {glue:text}`verd`."),
                nbformat.v4.new_markdown_cell("{glue:text}`verd`")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return nb


def make_book(root: Path, nb: nbformat.NotebookNode, with_extension: bool) -> Path:
    (root / "locales" / "zh_CN" / "LC_MESSAGES").mkdir(parents=True)
    (root / "locales" / "zh_CN" / "LC_MESSAGES" / "page.po").write_text(PO, encoding="utf-8")
    nbformat.write(nb, root / "page.ipynb")
    (root / "index.md").write_text("# Index\n\n```{toctree}\npage\n```\n", encoding="utf-8")
    exts = ["myst_nb"] + (["klbook_i18n_glue"] if with_extension else [])
    (root / "conf.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / '_ext')!r})
        extensions = {exts!r}
        nb_execution_mode = "off"
        locale_dirs = ["locales"]
        gettext_compact = False
        exclude_patterns = ["_build"]
        """), encoding="utf-8")
    return root


def build(root: Path, language: str) -> tuple[str, str]:
    out = root / "_build" / language
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", "-D", f"language={language}",
                           str(root), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return (out / "page.html").read_text(encoding="utf-8"), proc.stderr


def visible(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


@pytest.fixture(scope="module")
def books(tmp_path_factory):
    nb = executed_notebook()
    got = {}
    for with_ext, languages in ((True, ("en", "zh_CN")), (False, ("zh_CN",))):
        root = make_book(tmp_path_factory.mktemp("ext" if with_ext else "plain"), nb, with_ext)
        got[with_ext] = {lang: build(root, lang) for lang in languages}
    return got


def test_the_translated_sentences_keep_their_glued_numbers(books):
    en, zh = books[True]["en"][0], books[True]["zh_CN"][0]
    assert "The KL here is 0.123 nats" in visible(en)
    text, warnings = visible(zh), books[True]["zh_CN"][1]
    assert "这里的 KL 是 0.123 奈特" in text, text
    assert f"再说一遍：{VALUE}" in text, text
    assert "No key" not in warnings, warnings


def test_a_verdict_glued_in_both_languages_is_said_in_each(books):
    """klbook_lib.claims glues KEY (English) and KEY__zh_CN: each edition shows its own."""
    en, zh = visible(books[True]["en"][0]), visible(books[True]["zh_CN"][0])
    assert "Verdict: the arm is better." in en, en         # (the code cell shows both strings)
    assert "结论：该组更好。" in zh and "结论：the arm" not in zh, zh
    # a paragraph that is only the role needs no translation (msgstr = msgid): still Chinese
    assert visible(books[True]["zh_CN"][0]).count("该组更好") == 3, zh     # code cell, 2 paragraphs
    assert visible(books[True]["en"][0]).count("the arm is better") == 3, en


def test_without_the_extension_the_number_is_lost(books):
    text, warnings = visible(books[False]["zh_CN"][0]), books[False]["zh_CN"][1]
    assert "这里的 KL 是 奈特" in text, text           # the control: the known failure
    assert "No key 'klv' found in glue data" in warnings
