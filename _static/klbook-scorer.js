/* KL in RL: the search ranking (Sphinx's html_search_scorer, set by _ext/klbook_reader.py).
 * Sphinx's default weights, plus one rule: a page of the text ranks above an exercise
 * notebook that matches as well ("k3" finds chapter 4 before the ex11 notebook). */
var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename] = result;
    if (docname.startsWith("chapters/")) return score + 30;
    if (docname === "notation" || docname === "glossary") return score + 20;
    if (docname.startsWith("exercises/")) return score;
    return score + 10;
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
