"""The Chinese edition as its readers see it (issue 39; headless Chromium, run after the book build
like tests/test_browser.py; the site is `_build/html` or KLBOOK_HTML):

- search: each of ten Chinese queries, typed without spaces, puts the chapter that defines the
  term among the first three results (the index has jieba's words from the term table and every
  single character; the browser cuts the query at the longest indexed word);
- the interface is Chinese: the sidebar's part captions, the folds' toggles, the download menu and
  the author line show no English of the interface catalogue;
- English words: on every Chinese chapter, the Latin-script words a reader sees outside code, math,
  citations, English glosses in parentheses （clipping）, capitalised words (names: Bishop, PyTorch;
  acronyms: KL, PPO) and the lower-case names and units the book keeps in Latin (KLBOOK_LATIN_OK)
  are counted, and a page fails above LATIN_ALLOWANCE. An English fragment ("no detectable
  difference", a table header "mean KL") is lower case and counts.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import quote, urljoin

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
HTML = Path(os.environ.get("KLBOOK_HTML") or ROOT / "_build" / "html").resolve()
ZH = HTML / "zh"
LAPTOP = (1366, 900)

# query -> the chapter that defines the term (its section or its experiments are about it)
SEARCHES = {
    "熵": "chapters/15_exploration_anchors_optimum",       # entropy collapse, the entropy bonus
    "KL散度": "chapters/01_kl_definition",
    "奖励模型": "chapters/06_rlhf_reverse_kl",
    "策略梯度": "chapters/03_trpo_ppo",                    # "Policy-gradient methods improve J(θ) ..."
    "重要性采样": "chapters/14_offpolicy_kl",
    "模式寻求": "chapters/02_forward_reverse",
    "变分推断": "chapters/08_vi_elbo_dpo",
    "三角不等式": "chapters/01_kl_definition",
    "信任域": "chapters/03_trpo_ppo",
    "优势函数": "chapters/03_trpo_ppo",
}

# Latin words a Chinese page keeps: acronyms are all capitals (KL, PPO) and not counted; these
# are lower-case words the Chinese text uses as they are (units, code-like names, tools)
KLBOOK_LATIN_OK = {
    "nat", "nats", "token", "tokens", "notebook", "notebooks", "logit", "logits", "softmax", "rollout",
    "rollouts", "batch", "bug", "bugs", "float", "exp", "log", "min", "max", "clip", "klbook", "lib",
    "klbook_lib", "ipynb", "pdf", "wheel", "pip", "python", "scipy", "torch", "numpy", "jupyter",
    "assert", "glue", "seed", "seeds", "critic", "actor", "vllm", "verl", "trl", "openrlhf", "gpt",
    "cartpole", "bandit", "prompt", "prompts", "et", "al", "pull", "request", "chi", "vs", "sb", "cpu",
    "done", "terminated", "truncated", "approx", "kl", "ref", "old", "inf", "nan", "k", "e", "i", "x", "y",
    # names of methods, libraries and operations the Chinese literature writes in Latin too
    "best-of", "best-of-", "best-of-n", "top-k", "top-p", "top-", "f-", "f-dpo", "chipo", "bfloat", "autograd", "trainer",
    "huggingface", "minibatch", "log-sum-exp", "log-softmax", "argmax", "sigmoid", "transformer", "dropout",
    "deep-sea", "tinker-cookbook", "issue", "detach", "nucleus", "sg",
}
# the toy language model's corpus is English (chapter 6's reviews): its sentences are data, quoted
CORPUS_WORDS = {"the", "food", "was", "perfect", "and", "coffee", "really", "lovely", "staff", "friendly",
                "scrumptious", "service", "great", "good", "bad", "terrible", "awful", "slow", "rude", "nice"}
LATIN_ALLOWANCE = 40        # per page; the measured counts are printed by test_latin_words_per_page
# A ratchet, not the goal: the pages below still show English table headers, figure texts drawn in
# code and English verdict phrases of the claims not yet converted (issues 35 and 39), measured on
# the executed book of 2026-12-06 (a fresh clone on this machine). Each allowance is that count plus
# 15 words, since a verdict phrase glued by code may change with the CPU; lower an entry when its
# page is translated further, and remove it at 40 or less.
LATIN_ALLOWANCE_NOT_YET = {
    "03_trpo_ppo": 163, "04_estimating_kl": 121, "05_kl_in_practice": 119, "06_rlhf_reverse_kl": 132,
    "07_token_level_kl": 230, "09_choosing_beta": 132, "10_other_divergences": 121,
    "11_sequence_kl_grpo": 212, "12_overoptimisation_distillation": 108, "13_kl_as_a_tool": 156,
    "14_offpolicy_kl": 129, "15_exploration_anchors_optimum": 73,
}

LATIN_JS = r"""
() => {
  const art = document.querySelector('article') || document.body;
  const clone = art.cloneNode(true);
  clone.querySelectorAll('pre, code, mjx-container, .MathJax, .math, script, style, '
    + '.klbook-lang-switch, .klbook-translation-note, a[href*="bibliography"], .citation, '
    + 'div.highlight, .cell_output .output.text_plain, .output.stream, .cell_input')
    .forEach(e => e.remove());
  let text = clone.textContent || '';
  text = text.replace(/（[^（）]*[A-Za-z][^（）]*）/g, ' ');        // an English gloss in parentheses
  const words = text.match(/[A-Za-z][A-Za-z'_-]*/g) || [];
  return words;
}
"""


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("Debian's chromium is required for the browser check (tools/ensure_chromium.sh)")
    return path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    if not (ZH / "index.html").exists() and not (ZH / "intro.html").exists():
        pytest.skip(f"{ZH}: the Chinese edition is not built (tools/i18n.py build)")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=_chromium(), headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        yield b
        b.close()


def _open(browser, url, viewport=LAPTOP):
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="load")
    return page, errors


def search_results(browser, server, query: str) -> list[str]:
    """The result pages (docnames, best first) of the Chinese search page for ``query``."""
    page, errors = _open(browser, urljoin(server, "zh/search.html?q=" + quote(query)))
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('#search-results li').length > 0 || "
            "(document.querySelector('#search-results p') || {}).textContent", timeout=30000)
        page.wait_for_timeout(300)
        hrefs = page.evaluate("() => [...document.querySelectorAll('#search-results li > a')]"
                              ".map(a => a.getAttribute('href'))")
    finally:
        page.close()
    assert not errors, errors
    return [re.sub(r"\.html.*$", "", h).removeprefix("./").removeprefix("../") for h in hrefs]


@pytest.mark.parametrize("query", list(SEARCHES))
def test_a_chinese_query_finds_the_chapter_that_defines_it(browser, server, query):
    results = search_results(browser, server, query)
    assert SEARCHES[query] in results[:3], (query, results[:8])


def test_the_interface_is_chinese(browser, server):
    from bs4 import BeautifulSoup

    soup = BeautifulSoup((ZH / "chapters" / "03_trpo_ppo.html").read_text(encoding="utf-8"), "html.parser")
    captions = [c.get_text(strip=True) for c in soup.select("nav p.caption")]
    assert captions and not [c for c in captions if re.search(r"[a-z]{3}", c)], captions
    text = soup.get_text(" ")
    for english in ("Show the check", "Hide the check", "Show code cell source", "Run it yourself",
                    "needs klbook_lib", "The KL-in-RL book team"):
        assert english not in text, english
    assert "显示检验代码" in text or "显示代码" in text


def latin_words(browser, server, rel: str) -> list[str]:
    page, _ = _open(browser, urljoin(server, rel))
    try:
        words = page.evaluate(LATIN_JS)
    finally:
        page.close()
    ok = KLBOOK_LATIN_OK | (CORPUS_WORDS if "06_rlhf" in rel else set())
    return [w for w in words if not (w.isupper() or w.lower() in ok or len(w) < 2 or w[0].isupper())]


def _zh_chapters() -> list[str]:
    return sorted(f"zh/chapters/{p.name}" for p in (ZH / "chapters").glob("[0-9][0-9]_*.html")) if ZH.exists() else []


@pytest.mark.parametrize("rel", _zh_chapters())
def test_latin_words_per_page(browser, server, rel):
    words = latin_words(browser, server, rel)
    print(f"{rel}: {len(words)} Latin words: {' '.join(sorted(set(words))[:40])}")
    stem = rel.rsplit("/", 1)[-1].removesuffix(".html")
    allowance = LATIN_ALLOWANCE_NOT_YET[stem] + 15 if stem in LATIN_ALLOWANCE_NOT_YET else LATIN_ALLOWANCE
    assert len(words) <= allowance, (rel, len(words), allowance, sorted(set(words))[:60])
