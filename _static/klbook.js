/* KL in RL: wide equations and tables (loaded on every page).
 *
 * Wide display equations, inline formulas wider than the line, tables and code scroll
 *    sideways inside their own box, and the
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

  // an inline formula wider than its line (MathJax 3 does not break inline math) becomes a
  // box of the line's width that scrolls, with the same cue (klbook.css: .klbook-inline-wide)
  function blockOf(el) {
    for (let node = el.parentElement; node; node = node.parentElement) {
      const d = getComputedStyle(node).display;
      if (d !== "inline" && d !== "contents") return node;
    }
    return document.body;
  }

  function fitInlineMath(article) {
    const inline = [...article.querySelectorAll('mjx-container[jax="CHTML"]:not([display="true"])')];
    inline.forEach((c) => c.classList.remove("klbook-inline-wide"));
    const wide = inline.filter((c) => {
      const block = blockOf(c);
      const cs = getComputedStyle(block);
      const box = block.getBoundingClientRect();
      const right = box.right - parseFloat(cs.paddingRight || 0) - parseFloat(cs.borderRightWidth || 0);
      const left = box.left + parseFloat(cs.paddingLeft || 0) + parseFloat(cs.borderLeftWidth || 0);
      const r = c.getBoundingClientRect();
      return r.width > right - left + 1 || r.right > right + 1 || r.right > document.documentElement.clientWidth;
    });
    wide.forEach((c) => {
      c.classList.add("klbook-inline-wide");
      register(c);
    });
  }

  function scan() {
    const article = document.querySelector("article.bd-article") || document.body;
    article.querySelectorAll('mjx-container[jax="CHTML"][display="true"]').forEach(register);
    fitInlineMath(article);
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
      pending = setTimeout(() => {
        fitInlineMath(document.querySelector("article.bd-article") || document.body);
        boxes.forEach(updateCue);
      }, 100);
    });
    if (window.ResizeObserver) {
      const article = document.querySelector("article.bd-article");
      if (article) new ResizeObserver(() => boxes.forEach(updateCue)).observe(article);
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();


/* Reading on a phone (issue 24).
 *
 * Tap to enlarge: every figure image (and every plot a code cell shows) opens in a
 *    full-screen view at its own pixel size, which scrolls; a tap on the image fits it
 *    to the screen and back; the close button, Escape or a tap beside the image close
 *    it. Works offline (no library). A figure with a phone rendering (a <picture> whose
 *    phone source shows the panels stacked below 640 px) opens its full rendering.
 * Prose tables of four or more columns become one card per row on a phone (the
 *    headings go into data-label, klbook.css shows them).
 * The phone's in-page contents closes after a tap on one of its entries.
 * A tap on "Exercise N.M" in the title of a solution opens the solution instead of
 *    jumping to the exercise.
 * Glued numbers say, on hover, that they were computed on the page.
 */
(function () {
  "use strict";

  let lastFocus = null;

  function closeLightbox() {
    const box = document.querySelector(".klbook-lightbox");
    if (!box) return;
    box.remove();
    document.body.classList.remove("klbook-lightbox-open");
    document.removeEventListener("keydown", onKey, true);
    if (lastFocus && lastFocus.focus) lastFocus.focus({ preventScroll: true });
  }

  function onKey(e) {
    if (e.key === "Escape") {
      e.preventDefault();
      e.stopPropagation();
      closeLightbox();
    }
  }

  function captionOf(img) {
    const fig = img.closest("figure");
    const cap = fig && fig.querySelector("figcaption");
    return cap ? cap.innerText.replace(/\s*#\s*$/, "").trim() : "";
  }

  function openLightbox(img) {
    closeLightbox();
    lastFocus = img;
    const box = document.createElement("div");
    box.className = "klbook-lightbox";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-modal", "true");
    box.setAttribute("aria-label", "Enlarged figure");
    const close = document.createElement("button");
    close.type = "button";
    close.className = "klbook-lightbox-close";
    close.setAttribute("aria-label", "Close the enlarged figure");
    close.textContent = "\u00d7";
    const stage = document.createElement("div");
    stage.className = "klbook-lightbox-stage";
    const big = document.createElement("img");
    // a figure with a phone rendering (<picture>, see _ext/klbook_reader.py) shows the
    // stacked panels on a phone; enlarged, it shows the full rendering (img.src)
    const full = img.closest("picture") ? img.src : img.currentSrc || img.src;
    big.alt = img.alt || "";
    // its own pixel size, but never smaller than the screen is wide
    const size = (natural) => {
      big.style.width = Math.max(natural, Math.min(window.innerWidth - 16, 2 * natural)) + "px";
    };
    size(full === (img.currentSrc || img.src) ? img.naturalWidth || img.width : img.width);
    big.addEventListener("load", () => size(big.naturalWidth), { once: true });
    big.src = full;
    stage.appendChild(big);
    const text = captionOf(img);
    if (text) {
      const cap = document.createElement("p");
      cap.className = "klbook-lightbox-caption";
      cap.textContent = text;
      stage.appendChild(cap);
    }
    box.appendChild(close);
    box.appendChild(stage);
    close.addEventListener("click", closeLightbox);
    big.addEventListener("click", (e) => {
      e.stopPropagation();
      box.classList.toggle("klbook-fit");
    });
    box.addEventListener("click", (e) => {
      if (e.target === box || e.target === stage) closeLightbox();
    });
    document.addEventListener("keydown", onKey, true);
    document.body.appendChild(box);
    document.body.classList.add("klbook-lightbox-open");
    close.focus({ preventScroll: true });
  }

  function zoomable(article) {
    article.querySelectorAll("figure img, .cell_output img").forEach((img) => {
      if (img.closest("a") || img.classList.contains("klbook-zoomable")) return;
      img.classList.add("klbook-zoomable");
      img.setAttribute("tabindex", "0");
      img.setAttribute("role", "button");
      const what = (img.getAttribute("alt") || "the figure").slice(0, 120);
      img.setAttribute("aria-label", "Enlarge: " + what);
      img.title = "Tap or click to enlarge";
      img.addEventListener("click", () => openLightbox(img));
      img.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          openLightbox(img);
        }
      });
      const fig = img.closest("figure");
      if (fig && !fig.querySelector(".klbook-zoom-hint")) {
        const hint = document.createElement("span");
        hint.className = "klbook-zoom-hint";
        hint.setAttribute("aria-hidden", "true");
        hint.textContent = "tap the figure to enlarge";
        (img.closest("picture") || img).insertAdjacentElement("afterend", hint);
      }
    });
  }

  function stackTables(article) {
    article.querySelectorAll(".pst-scrollable-table-container > table").forEach((t) => {
      const head = t.tHead && t.tHead.rows[0];
      if (!head || head.cells.length < 4 || t.closest(".cell_output")) return;
      const labels = [...head.cells].map((c) => c.innerText.trim());
      [...t.tBodies].forEach((b) => [...b.rows].forEach((r) => {
        [...r.cells].forEach((c, i) => { if (labels[i]) c.setAttribute("data-label", labels[i]); });
      }));
      t.classList.add("klbook-stack");
    });
  }

  function closePageTocOnTap() {
    const dialog = document.getElementById("pst-secondary-sidebar-modal");
    if (!dialog) return;
    dialog.addEventListener("click", (e) => {
      const a = e.target.closest && e.target.closest("a[href]");
      if (!a || !dialog.open) return;
      const href = a.getAttribute("href") || "";
      if (!href.startsWith("#")) return;
      e.preventDefault();
      dialog.close();
      // after the contents have gone back to the sidebar and focus has returned
      setTimeout(() => {
        const target = document.getElementById(decodeURIComponent(href.slice(1)));
        if (history.pushState) history.pushState(null, "", href);
        if (target) target.scrollIntoView();
        window.dispatchEvent(new HashChangeEvent("hashchange"));
      }, 0);
    });
  }

  function solutionTitleLinks(article) {
    article.querySelectorAll("div.solution.dropdown > .admonition-title a[href]").forEach((a) => {
      a.addEventListener("click", (e) => {
        e.preventDefault();
        e.stopPropagation();
        const button = a.closest("div.solution").querySelector("button.toggle-button");
        if (button) button.click();
      });
      a.setAttribute("title", "Opens the solution; the exercise is above it");
    });
  }

  // ---- figures a reader can move (klbook_lib.interactive.glue_slider): the notebook
  // computed every frame and every number; this only shows the one the slider picks.
  function interactives(article) {
    article.querySelectorAll(".klbook-interactive").forEach((box) => {
      if (box.dataset.ready) return;
      const holder = box.querySelector("script.klbook-interactive-data");
      const img = box.querySelector("img.klbook-interactive-frame");
      const slider = box.querySelector("input.klbook-interactive-slider");
      const out = box.querySelector("output.klbook-interactive-value");
      const controls = box.querySelector(".klbook-interactive-controls");
      if (!holder || !img || !slider || !out || !controls) return;
      let data;
      try { data = JSON.parse(holder.textContent); } catch (e) { return; }
      const start = Number(box.dataset.start || slider.value);
      const frames = data.frames.map((f, i) => (i === start ? img.getAttribute("src") : "data:image/png;base64," + f));
      const cells = [...box.querySelectorAll("[data-klbook-cell]")];
      const label = (slider.getAttribute("aria-valuetext") || "").split(" = ")[0];
      const show = (i) => {
        img.src = frames[i];
        img.alt = data.alts[i];
        out.textContent = data.labels[i];
        cells.forEach((c) => { c.textContent = data.cells[i][Number(c.dataset.klbookCell)]; });
        slider.setAttribute("aria-valuetext", label + " = " + data.labels[i]);
        box.dataset.index = String(i);
      };
      slider.addEventListener("input", () => show(Number(slider.value)));
      slider.addEventListener("change", () => show(Number(slider.value)));
      controls.hidden = false;
      box.dataset.index = String(start);
      box.dataset.ready = "1";
    });
  }

  // ---- the language switch keeps the reader's place: the other edition's page opens
  // at the section being read (both editions share their section ids)
  function currentSectionId(article) {
    let id = "";
    const top = 80;
    for (const s of article.querySelectorAll("section[id]")) {
      if (s.getBoundingClientRect().top <= top) id = s.id;
      else break;
    }
    return id;
  }

  function languageSwitchKeepsSection(article) {
    document.querySelectorAll("a.klbook-lang-link").forEach((a) => {
      const go = () => {
        const base = a.getAttribute("href").split("#")[0];
        // the section the URL names (the reader came by a link, the contents or search),
        // else the one at the top of the window
        const hash = decodeURIComponent((location.hash || "").slice(1));
        const named = hash && document.getElementById(hash) && document.getElementById(hash).closest("section[id]");
        const id = (named && named.id) || currentSectionId(article);
        a.setAttribute("href", id ? base + "#" + id : base);
      };
      a.addEventListener("click", go);
      a.addEventListener("auxclick", go);
      a.addEventListener("focus", go);
      a.addEventListener("pointerdown", go);
    });
  }

  function markGlued(article) {
    article.querySelectorAll("span.pasted-text").forEach((s) => {
      if (!s.title) s.title = "computed by the code on this page";
    });
  }

  function start() {
    const article = document.querySelector("article.bd-article") || document.body;
    zoomable(article);
    stackTables(article);
    closePageTocOnTap();
    solutionTitleLinks(article);
    markGlued(article);
    interactives(article);
    languageSwitchKeepsSection(article);
    window.addEventListener("load", () => zoomable(article));
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
