"""The Chinese edition's search (issue 39, _ext/klbook_i18n_search.py), without a browser:
the user dictionary comes from the term table, single characters are indexed, and the query is
cut the way the browser's splitQuery cuts it. The browser test (tests/test_i18n_browser.py)
runs the real search page on the built site."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "_ext"))
import klbook_i18n_search as search  # noqa: E402

QUERIES = ["熵", "KL散度", "奖励模型", "策略梯度", "重要性采样", "模式寻求", "变分推断", "三角不等式", "信任域", "优势函数"]


def test_the_user_dictionary_holds_the_term_table():
    words = search.user_words()
    for word in ["奖励模型", "策略梯度", "重要性采样", "模式寻求", "变分推断", "三角不等式", "信任域", "优势函数",
                 "KL散度", "散度", "裁剪", "截断"]:
        assert word in words, word
    assert all(len(w) > 1 for w in words)


def test_the_index_keeps_whole_terms_and_single_characters():
    pytest.importorskip("jieba")
    lang = search._make_language()(options={})
    words = lang.split("重要性采样的偏差与熵坍缩，以及信任域。")
    kept = [w for w in words if lang.word_filter(w)]
    for word in ["重要性采样", "熵", "信任域", "域"]:
        assert word in kept, (word, kept)
    # Sphinx's own Chinese search drops one-character words: this one keeps Chinese ones only
    assert not lang.word_filter("a") and lang.word_filter("熵")


@pytest.mark.parametrize("query, index, expected", [
    ("奖励模型", {"奖励", "模型", "奖励模型"}, ["奖励模型"]),
    ("KL散度", {"kl", "散度"}, ["KL", "散度"]),
    ("优势函数", {"优势", "函数"}, ["优势", "函数"]),            # not indexed whole: its longest parts
    ("熵", {"熵"}, ["熵"]),
    ("信任域 方法", {"信任域", "方法"}, ["信任域", "方法"]),
    ("模式寻求", set(), ["模", "式", "寻", "求"]),                 # nothing known: one character each
])
def test_the_query_is_cut_at_the_longest_indexed_word(query, index, expected):
    assert search.segment_like_the_browser(query, index) == expected


def test_the_browser_splitter_is_the_same_algorithm():
    js = search.JS_SPLITTER
    assert "function splitQuery" in js and f"i + {search.MAX_WORD}" in js and "Search._index" in js


def test_term_counts_rank_by_use():
    counts = search.term_counts({"a": "信任域……信任域", "b": "信任域", "c": "无"}, ["信任域", "熵"])
    assert counts == {"信任域": {"a": 2, "b": 1}}


def test_the_defining_pages_are_the_browser_tests_answers():
    import importlib.util
    spec = importlib.util.spec_from_file_location("klbook_i18n_browser_test", REPO / "tests" / "test_i18n_browser.py")
    browser_test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(browser_test)
    defined = search.defining_pages()
    for query, page in browser_test.SEARCHES.items():
        assert (REPO / f"{page}.ipynb").exists()
        key = query.lower()
        if key in defined:
            assert defined[key] == page, query
