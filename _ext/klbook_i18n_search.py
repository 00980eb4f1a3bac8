"""Search that finds Chinese words on the Chinese edition (issue 39).

Sphinx's Chinese search (``sphinx/search/zh.py``) segments the text with jieba but drops every
one-character word (熵, 域 are never indexed), and the browser splits a query only at spaces and
punctuation, so an unspaced query (奖励模型, KL散度) is looked up as one word that the index
does not have. This extension replaces the ``zh`` search language with one that

- gives jieba a user dictionary built from the term table (``locales/zh_CN/terms.tsv``) and the
  glossary's Chinese names, so that 重要性采样, 奖励模型, 策略梯度 are words of the index (jieba's
  search mode also indexes their parts: 重要性, 采样);
- indexes every Chinese character as a word too, so that a one-character term (熵) is found;
- segments the query in the browser the way the index was built: each run of Chinese characters
  is cut, from the left, at the longest word that the index contains (up to eight characters),
  and falls back to one character; Latin runs are split as Sphinx splits them (``KL散度`` ->
  ``kl``, ``散度``).

- ranks a page also by how often it uses the query's words (``_ext/klbook_i18n_scorer.js``, with
  the counts of each term-table word per page written to ``_static/klbook-zh-tf.js`` at the end
  of the build): Sphinx's index records only whether a page has a word, so without this every
  chapter that mentions 信任域 once ties with the chapter about trust regions; and the page that
  the term table names as defining a term (its ``defined`` column, as the glossary's "See ..."
  links do) gets 20 more when the whole query is that term.

``segment_like_the_browser(query, words)`` is the same algorithm in Python, for the tests.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TERMS_TSV = ROOT / "locales" / "zh_CN" / "terms.tsv"
CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_CHAR = re.compile(f"[{CJK}]")
_CJK_RUN = re.compile(f"[{CJK}]+|[^{CJK}]+")
MAX_WORD = 8

JS_SPLITTER = r"""
function splitQuery(query) {
  // klbook_i18n_search: a run of Chinese characters is cut at the longest word the index has
  var idx = (typeof Search !== "undefined" && Search._index) ? Search._index : null;
  var has = function (w) {
    w = w.toLowerCase();
    return !!idx && ((idx.terms && Object.prototype.hasOwnProperty.call(idx.terms, w)) ||
                     (idx.titleterms && Object.prototype.hasOwnProperty.call(idx.titleterms, w)));
  };
  var cjk = /[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]/;
  var out = [];
  var runs = query.match(/[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+|[^\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+/g) || [];
  runs.forEach(function (run) {
    if (cjk.test(run[0])) {
      var i = 0;
      while (i < run.length) {
        var j = Math.min(run.length, i + %(max)d);
        for (; j > i + 1; j--) if (has(run.slice(i, j))) break;
        out.push(run.slice(i, j));
        i = j;
      }
    } else {
      run.split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu).forEach(function (t) {
        if (t) out.push(t);
      });
    }
  });
  return out;
}
""".replace("%(max)d", str(MAX_WORD))


def user_words(terms_tsv: Path = TERMS_TSV, glossary_po: Path | None = None) -> list[str]:
    """The words jieba must keep whole: each Chinese term of the term table (a term written
    with a space, "KL 散度", gives its Chinese part and the term without the space), and the
    Chinese names of the glossary's entries."""
    words: list[str] = []
    for line in terms_tsv.read_text(encoding="utf-8").splitlines()[1:]:
        if line.startswith("#") or not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) > 1 and cols[0] != "english":
            words.append(cols[1])
    glossary_po = glossary_po or ROOT / "locales" / "zh_CN" / "LC_MESSAGES" / "glossary.po"
    if glossary_po.is_file():
        text = glossary_po.read_text(encoding="utf-8")
        # a glossary entry's translation starts with its Chinese name: "KL 散度（相对熵）. ..."
        words += re.findall(rf'msgstr "([{CJK}][{CJK}A-Za-z0-9 ]{{1,10}}?)(?:（|\.|。)', text)
    out = []
    for word in words:
        for form in (word, word.replace(" ", ""), *re.findall(f"[{CJK}]+", word)):
            if len(form) > 1 and _CJK_CHAR.search(form) and form not in out:
                out.append(form)
    return out


def segment_like_the_browser(query: str, index_words) -> list[str]:
    """What the browser's ``splitQuery`` returns for ``query`` against an index with
    ``index_words`` (lower case)."""
    out = []
    for run in _CJK_RUN.findall(query):
        if _CJK_CHAR.match(run):
            i = 0
            while i < len(run):
                j = min(len(run), i + MAX_WORD)
                while j > i + 1 and run[i:j].lower() not in index_words:
                    j -= 1
                out.append(run[i:j])
                i = j
        else:
            out += [t for t in re.split(r"[^\w]+", run) if t]
    return out


def _make_language():
    from sphinx.search.zh import SearchChinese

    class SearchChineseWords(SearchChinese):
        """Sphinx's Chinese search with the term table's words and single characters."""

        js_splitter_code = JS_SPLITTER

        def init(self, options):
            super().init(options)
            try:
                import jieba
            except ImportError:        # Sphinx then splits at spaces only; the single characters still help
                return
            for word in user_words():
                jieba.add_word(word, freq=200000)

        def split(self, input: str) -> list[str]:
            words = super().split(input)
            return words + _CJK_CHAR.findall(input)

        def word_filter(self, stemmed_word: str) -> bool:
            return len(stemmed_word) > 1 or bool(_CJK_CHAR.fullmatch(stemmed_word))

    return SearchChineseWords


SCORER = Path(__file__).resolve().parent / "klbook_i18n_scorer.js"
TF_JS = "klbook-zh-tf.js"


def term_counts(texts: dict[str, str], words) -> dict[str, dict[str, int]]:
    """word (lower case) -> {page: how many times the page's text has it} (pages without it left out)."""
    out: dict[str, dict[str, int]] = {}
    for word in words:
        per_page = {page: text.count(word) for page, text in texts.items()}
        per_page = {page: n for page, n in per_page.items() if n}
        if per_page:
            out[word.lower()] = per_page
    return out


def _zh(app) -> bool:
    return str(app.config.language or "").lower().startswith("zh")


def _config_inited(app, config) -> None:
    if str(config.language or "").lower().startswith("zh"):
        config.html_search_scorer = str(SCORER)


def _builder_inited(app) -> None:
    if _zh(app) and app.builder.format == "html":
        app.add_js_file(TF_JS, priority=400)


def _write_counts(app, exception) -> None:
    if exception or not _zh(app) or app.builder.format != "html" or app.builder.name == "singlehtml":
        return
    import json

    texts = {}
    for docname in sorted(app.env.found_docs):
        try:
            texts[docname] = app.env.get_doctree(docname).astext()
        except Exception:      # a page that was not read in this build (no doctree): no counts
            continue
    words = user_words() + _single_terms()
    counts = term_counts(texts, words)
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    (static / TF_JS).write_text(
        "var KLBOOK_ZH_TF = " + json.dumps(counts, ensure_ascii=False, sort_keys=True) + ";\n"
        + "var KLBOOK_ZH_DEFINED = " + json.dumps(defining_pages(), ensure_ascii=False, sort_keys=True) + ";\n",
        encoding="utf-8")


def defining_pages(terms_tsv: Path = TERMS_TSV) -> dict[str, str]:
    """Chinese term (lower case, without spaces) -> the page that defines it (terms.tsv's
    ``defined`` column, like the glossary's "See ..." links)."""
    out = {}
    for line in terms_tsv.read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        if line.startswith("#") or len(cols) < 8 or cols[0] == "english" or not cols[7].strip():
            continue
        out[cols[1].replace(" ", "").lower()] = cols[7].strip()
    return out


def _single_terms(terms_tsv: Path = TERMS_TSV) -> list[str]:
    """The term table's one-character terms (熵): not words for jieba, but counted for ranking."""
    out = []
    for line in terms_tsv.read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        if len(cols) > 1 and len(cols[1]) == 1 and _CJK_CHAR.match(cols[1]):
            out.append(cols[1])
    return out


def setup(app):
    app.add_search_language(_make_language())
    app.connect("config-inited", _config_inited, priority=900)
    app.connect("builder-inited", _builder_inited)
    app.connect("build-finished", _write_counts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
