/* KL in RL: wide equations and tables (loaded on every page).
 *
 * Wide display equations, tables and code scroll sideways inside their own box, and the
 *    box shows that it does: while content is hidden to the right (or left) the box
 *    carries the class klbook-more-right (klbook-more-left), which klbook.css turns
 *    into a fade at that edge, next to a scrollbar that is always drawn.
 */
(function () {
  "use strict";

  const SCROLLBOX = "klbook-scrollbox";

  function scrollBoxFor(el) {
    // the nearest ancestor (or the element) that scrolls sideways, below the article
    for (let node = el; node && !node.matches("article, main, body"); node = node.parentElement) {
      const ox = getComputedStyle(node).overflowX;
      if (ox === "auto" || ox === "scroll") return node;
    }
    // none: wrap the table in a box of its own
    const box = document.createElement("div");
    el.parentNode.insertBefore(box, el);
    box.appendChild(el);
    box.classList.add("klbook-table-scroll");
    return box;
  }

  function updateCue(box) {
    const hidden = box.scrollWidth - box.clientWidth;
    box.classList.toggle("klbook-more-right", hidden > 1 && box.scrollLeft < hidden - 1);
    box.classList.toggle("klbook-more-left", hidden > 1 && box.scrollLeft > 1);
    box.classList.toggle("klbook-scrolls", hidden > 1);
  }

  const boxes = new Set();

  function register(box) {
    if (boxes.has(box)) return;
    boxes.add(box);
    box.classList.add(SCROLLBOX);
    if (!box.hasAttribute("tabindex")) box.setAttribute("tabindex", "0"); // keyboard scrolling
    box.addEventListener("scroll", () => updateCue(box), { passive: true });
  }

  function scan() {
    const article = document.querySelector("article.bd-article") || document.body;
    article.querySelectorAll('mjx-container[jax="CHTML"][display="true"]').forEach(register);
    // code and text outputs already scroll in their <pre>: give them the same cue
    article.querySelectorAll("pre").forEach((pre) => {
      const ox = getComputedStyle(pre).overflowX;
      if (ox === "auto" || ox === "scroll") register(pre);
    });
    article.querySelectorAll("table").forEach((t) => {
      if (t.closest("mjx-container, .highlight, pre")) return;
      register(scrollBoxFor(t));
    });
    boxes.forEach(updateCue);
  }

  function whenTypeset(cb) {
    const mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(cb, cb);
    else cb();
  }

  function start() {
    scan();
    window.addEventListener("load", () => whenTypeset(scan));
    whenTypeset(scan);
    let pending = null;
    window.addEventListener("resize", () => {
      clearTimeout(pending);
      pending = setTimeout(() => boxes.forEach(updateCue), 100);
    });
    if (window.ResizeObserver) {
      const article = document.querySelector("article.bd-article");
      if (article) new ResizeObserver(() => boxes.forEach(updateCue)).observe(article);
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
