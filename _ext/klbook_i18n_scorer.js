/* KL in RL, the Chinese edition: the search ranking (html_search_scorer, set by
 * _ext/klbook_i18n_search.py). The English edition's rules (_static/klbook-scorer.js: a page of
 * the text above an exercise notebook that matches as well), plus how often the page uses the
 * query's words: Sphinx's index only records *whether* a page has a word, so for a word of the
 * term table (KLBOOK_ZH_TF, written by the build into _static/klbook-zh-tf.js) each page also
 * gets 4 x log2(1 + uses), at most 16 per word: the chapter that defines and works with a term
 * ranks above one that mentions it once; and 20 for the page that the term table names as
 * defining the term when the query is that term (KLBOOK_ZH_DEFINED). */
var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename] = result;
    let bonus = 10;
    if (docname.startsWith("chapters/")) bonus = 30;
    else if (docname === "notation" || docname === "glossary") bonus = 20;
    else if (docname.startsWith("exercises/")) bonus = 0;
    return score + bonus + Scorer.termFrequency(docname) + Scorer.defines(docname);
  },
  defines: (docname) => {
    // the page the term table names as defining the query's term (terms.tsv, "defined")
    if (typeof KLBOOK_ZH_DEFINED === "undefined") return 0;
    const q = (new URLSearchParams(window.location.search).get("q") || "").replace(/\s+/g, "").toLowerCase();
    return KLBOOK_ZH_DEFINED[q] === docname ? 20 : 0;
  },
  termFrequency: (docname) => {
    if (typeof KLBOOK_ZH_TF === "undefined" || typeof splitQuery === "undefined") return 0;
    const q = new URLSearchParams(window.location.search).get("q") || "";
    let extra = 0;
    new Set(splitQuery(q.trim())).forEach((word) => {
      const counts = KLBOOK_ZH_TF[word.toLowerCase()];
      const n = counts ? counts[docname] || 0 : 0;
      if (n > 0) extra += Math.min(16, 4 * Math.log2(1 + n));
    });
    return extra;
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
