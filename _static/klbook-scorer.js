/* KL in RL: the search ranking and its snippets (Sphinx's html_search_scorer, set by
 * _ext/klbook_reader.py; Sphinx inlines this file into language_data.js of the search page).
 *
 * Ranking: Sphinx's default weights, plus two rules.
 *  1. A page whose title holds every word of the query ranks above every page whose title
 *     does not ("k3" finds "Estimating KL from samples: k1, k2, k3" first, "DPO" finds
 *     "The optimal policy, the ELBO and DPO" before a chapter that mentions DPO more often).
 *  2. A page of the text ranks above an exercise notebook that matches as well.
 * Snippets: the text of the page's article only (no header buttons or download menu), with
 * every formula shown as plain text ("pi_old", not "\(\pi_{\mathrm{old}}\)").
 */
var KLBOOK_SEARCH = (function () {
  "use strict";
  const TITLE_MATCH = 1000;

  function queryWords() {
    const q = new URLSearchParams(window.location.search).get("q") || "";
    return q.toLowerCase().split(/\s+/).filter((w) => w && !w.startsWith("-"));
  }

  function titleWords(title) {
    return new Set((title || "").toLowerCase().split(/[^0-9a-z\u00c0-\uffff]+/).filter(Boolean));
  }

  function titleHolds(title, words) {
    if (!words.length || !title) return false;
    const set = titleWords(title);
    const lower = title.toLowerCase();
    // a word in a script without spaces (Chinese) matches inside the title
    return words.every((w) => set.has(w) || (/[\u3000-\u9fff]/.test(w) && lower.includes(w)));
  }

  function pageTitle(docname, fallback) {
    try {
      const index = Search._index;
      const i = index.docnames.indexOf(docname);
      if (i >= 0) return index.titles[i];
    } catch (e) { /* no index yet */ }
    return (fallback || "").split(" > ")[0];
  }

  // ---- formulas as plain text (for reading only: no formula of the book is computed here)
  const GREEK = new Set(("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi pi rho sigma " +
    "tau upsilon phi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Phi Psi Omega").split(" "));
  const SYMBOLS = {to: "\u2192", rightarrow: "\u2192", le: "\u2264", leq: "\u2264", ge: "\u2265", geq: "\u2265",
    ne: "\u2260", neq: "\u2260", approx: "\u2248", propto: "\u221d", pm: "\u00b1", times: "\u00d7",
    cdot: "\u00b7", ldots: "...", cdots: "...", dots: "...", infty: "\u221e", star: "*", in: "\u2208",
    mid: "|", sim: "~", varepsilon: "epsilon", vartheta: "theta", varphi: "phi", nabla: "\u2207",
    sum: "\u2211", quad: " ", qquad: " ", left: "", right: "", big: "", Big: "", bigl: "", bigr: "",
    displaystyle: "", textstyle: "", mathbb: "", E: "E"};
  const UNWRAP = /\\(?:mathrm|text|textrm|mathbf|mathit|mathsf|operatorname|mathcal|mathbb|boldsymbol|bm|hat|bar|tilde|widehat|widetilde|overline)\s*\{([^{}]*)\}/g;

  function texToText(tex) {
    let t = tex.replace(/^\s*(\\\(|\\\[|\$\$?)/, "").replace(/(\\\)|\\\]|\$\$?)\s*$/, "");
    for (let k = 0; k < 5; k++) {
      const before = t;
      t = t.replace(UNWRAP, "$1")
        .replace(/\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}/g, "($1)/($2)")
        .replace(/\\[dt]?frac\s*(\w)(\w)/g, "$1/$2")
        .replace(/\\sqrt\s*\{([^{}]*)\}/g, "sqrt($1)")
        .replace(/([_^])\{([^{}]*)\}/g, "$1$2");
      if (t === before) break;
    }
    t = t.replace(/\\\|/g, "||").replace(/\\[,;:! ]/g, " ").replace(/\\%/g, "%").replace(/\\\\/g, " ")
      .replace(/\\([A-Za-z]+)\s*/g, (m, name) => {
        const word = name in SYMBOLS ? SYMBOLS[name] : name;
        return GREEK.has(name) ? word + (m.endsWith(" ") ? " " : "") : " " + word + " ";
      })
      .replace(/[{}&]/g, " ").replace(/\(\s+/g, "(").replace(/\s+\)/g, ")");
    return t.replace(/\s+/g, " ").trim();
  }

  const NOT_TEXT = [".headerlink", "script", "style", ".bd-header-article", ".header-article-items",
    ".article-header-buttons", ".dropdown", ".bd-sidebar-secondary", ".prev-next-area", ".bd-footer-article",
    "footer", "nav", "button", ".toggle", ".klbook-interactive-controls"];

  function htmlToText(htmlString, anchor) {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    for (const q of NOT_TEXT) doc.querySelectorAll(q).forEach((el) => el.remove());
    doc.querySelectorAll(".math").forEach((el) => { el.textContent = " " + texToText(el.textContent) + " "; });
    const main = doc.querySelector('[role="main"] article') || doc.querySelector('[role="main"]');
    if (!main) return "";
    if (anchor) {
      let found = null;
      try { found = main.querySelector(anchor); } catch (e) { found = null; }
      if (found) return found.textContent.replace(/\s+/g, " ");
    }
    return main.textContent.replace(/\s+/g, " ");
  }

  function install() {
    if (typeof Search !== "undefined" && !Search._klbookPatched) {
      Search.htmlToText = htmlToText;
      Search._klbookPatched = true;
    }
  }
  install();
  document.addEventListener("DOMContentLoaded", install);

  return {queryWords, titleHolds, pageTitle, texToText, htmlToText, TITLE_MATCH};
})();

var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename] = result;
    let s = score;
    if (KLBOOK_SEARCH.titleHolds(KLBOOK_SEARCH.pageTitle(docname, title), KLBOOK_SEARCH.queryWords())) {
      s += KLBOOK_SEARCH.TITLE_MATCH;
    }
    if (docname.startsWith("chapters/")) return s + 30;
    if (docname === "notation" || docname === "glossary") return s + 20;
    if (docname.startsWith("exercises/")) return s;
    return s + 10;
  },
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
