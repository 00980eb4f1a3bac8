"""What readers see: navigation, figures that are images, a readable proof index.

Loaded by ``klbook_offline`` (the local extension named in ``_config.yml``).

* **One header.** pydata-sphinx-theme 0.17 renders its own top navbar with a search
  field (``navbar_persistent``) above sphinx-book-theme's article header. That band
  repeats the search box, and its hidden menu button is the first ``.primary-toggle``
  on the page, the one both themes' scripts wire up, so the visible button did nothing
  (pydata-sphinx-theme #2451). With ``navbar_persistent`` empty the band is not
  rendered and the article header's buttons are the only toggles.
* **Figures are images.** A figure output that carries only ``text/plain``
  ``<Figure size ...>`` (a notebook executed with a non-inline matplotlib backend) is a
  defect. Cached executions holding one are evicted before the build reads anything,
  so the notebook runs again; a page whose cached execution changed since the page
  was last read is read again (Sphinx alone only re-reads changed sources); and a page
  that still shows ``<Figure size`` is a build warning (an error under ``-W``).
* **Plain check marks** on the execution-status page (no emoji font needed).
* **Proof index with titles.** The sphinx-proof index lists bare labels
  (``def-01-kl``); here it lists "Definition 1.1 (Kullback–Leibler divergence)",
  grouped by chapter.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

HERE = Path(__file__).resolve().parent
RECORD_PREFIX = "application/papermill.record/"
FIGURE_TEXT = re.compile(r"<Figure size \d+(?:\.\d+)?x\d+(?:\.\d+)? with \d+ Axes>")


# --------------------------------------------------------------------------- figures
def _mime_groups(data: dict) -> list[dict]:
    """Split an output's mime bundle into the plain bundle and myst-nb's glue records."""
    plain = {k: v for k, v in data.items() if not k.startswith(RECORD_PREFIX)}
    glued = {k[len(RECORD_PREFIX):]: v for k, v in data.items() if k.startswith(RECORD_PREFIX)}
    return [g for g in (plain, glued) if g]


def text_only_figures(nb: Any) -> list[str]:
    """Outputs of ``nb`` that show a matplotlib figure as text only.

    A figure output is text only when its ``text/plain`` is ``<Figure size ...>`` and
    the same mime bundle has no ``image/*`` entry. Glued outputs (myst-nb's
    ``application/papermill.record/...`` mime types) are checked the same way.
    Returns one line per offending output: ``"cell N: <Figure size ...>"``.
    """
    found = []
    for index, cell in enumerate(nb.get("cells", []) if isinstance(nb, dict) else nb.cells):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []) or []:
            for bundle in _mime_groups(output.get("data", {}) or {}):
                text = bundle.get("text/plain", "")
                text = "".join(text) if isinstance(text, list) else str(text)
                match = FIGURE_TEXT.search(text)
                if match and not any(k.startswith("image/") for k in bundle):
                    found.append(f"cell {index}: {match.group(0)}")
    return found


def _cache(app):
    if getattr(app.config, "nb_execution_mode", None) != "cache":
        return None
    path = app.config.nb_execution_cache_path
    if not path:
        return None
    path = Path(app.srcdir, path)
    if not path.exists():
        return None
    from jupyter_cache import get_cache

    return get_cache(str(path))


def evict_text_only_figures(cache) -> list[str]:
    """Remove every cached execution that holds a text-only figure; return their URIs."""
    evicted = []
    for record in cache.list_cache_records():
        try:
            nb = cache.get_cache_bundle(record.pk).nb
        except Exception:  # an unreadable record is as stale as a bad one
            nb = None
        if nb is None or text_only_figures(nb):
            cache.remove_cache(record.pk)
            evicted.append(str(record.uri))
    return evicted


def _evict_on_build(app) -> None:
    from sphinx.util import logging

    cache = _cache(app)
    if cache is None:
        return
    for uri in evict_text_only_figures(cache):
        logging.getLogger(__name__).info(
            f"[klbook] evicted a cached execution with a text-only figure: {uri}")


def _cache_signature(app, docname: str):
    """(pk, created) of the cached execution the build would use for ``docname``."""
    source = Path(app.env.doc2path(docname))
    if source.suffix != ".ipynb":
        return None
    cache = _cache(app)
    if cache is None:
        return None
    import nbformat

    try:
        record = cache.match_cache_notebook(nbformat.read(source, as_version=4))
    except (KeyError, OSError, ValueError):
        return None
    return (record.pk, record.created.isoformat())


def _remember_execution(app, doctree) -> None:
    env = app.env
    if not hasattr(env, "klbook_exec_sig"):
        env.klbook_exec_sig = {}
    env.klbook_exec_sig[env.docname] = _cache_signature(app, env.docname)


def _reread_if_execution_changed(app, env, added, changed, removed) -> list[str]:
    """Docs whose cached execution is not the one their stored page was built from."""
    stored = getattr(env, "klbook_exec_sig", {})
    return [doc for doc, sig in stored.items()
            if doc in env.found_docs and doc not in added | changed | removed
            and _cache_signature(app, doc) != sig]


def _warn_figure_text(app, pagename, templatename, context, doctree) -> None:
    body = context.get("body", "") or ""
    if "&lt;Figure size" in body or "<Figure size" in body:
        from sphinx.util import logging

        logging.getLogger(__name__).warning(
            f"{pagename}: a figure is shown as the text '<Figure size ...>' instead of an image; "
            "call kb.runtime.setup() before plotting (it selects the inline backend)",
            location=pagename)


# ----------------------------------------------------------------------- proof index
_SUBSCRIPT = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def plain_title(tex_title: str) -> str:
    """A proof title for plain text: ``$k_3$ is unbiased`` -> ``k₃ is unbiased``."""
    text = tex_title.replace("$", "")
    text = re.sub(r"\\(?:mathrm|text|mathbf|operatorname)\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"_\{?(\d+)\}?", lambda m: m.group(1).translate(_SUBSCRIPT), text)
    text = re.sub(r"\\([A-Za-z]+)", r"\1", text)
    return re.sub(r"\s+", " ", text).strip()


def _collect_proof_titles(app, doctree) -> None:
    env = app.env
    if not hasattr(env, "klbook_proofs"):
        env.klbook_proofs = {}
    from docutils import nodes

    for node in doctree.findall(nodes.Element):
        if "realtype" not in node.attributes or "label" not in node.attributes:
            continue
        if node.get("realtype") == "proof" or "nonumber" in node.get("classes", []):
            continue
        title = ""
        for child in node.children:
            if isinstance(child, nodes.title):
                title = child.astext().strip()
                break
        if title.startswith("(") and title.endswith(")"):
            title = title[1:-1]
        env.klbook_proofs[node["label"]] = {
            "docname": env.docname, "realtype": node["realtype"],
            "countertype": node.get("countertype", node["realtype"]),
            "title": plain_title(title),
        }


def _purge(app, env, docname) -> None:
    for attr in ("klbook_proofs",):
        table = getattr(env, attr, {})
        for key in [k for k, v in table.items() if v["docname"] == docname]:
            del table[key]
    getattr(env, "klbook_exec_sig", {}).pop(docname, None)


def _merge(app, env, docnames, other) -> None:
    for attr in ("klbook_proofs", "klbook_exec_sig"):
        mine = getattr(env, attr, None)
        if mine is None:
            mine = {}
            setattr(env, attr, mine)
        mine.update(getattr(other, attr, {}))


def _make_proof_index(base):
    class ProofIndex(base):
        """sphinx-proof's index with numbers and titles, grouped by chapter."""

        name = "prf"
        localname = "Definitions and theorems"
        shortname = "Definitions and theorems"

        def generate(self, docnames: Iterable[str] | None = None):
            env = self.domain.env
            proofs = getattr(env, "klbook_proofs", {})
            order = {doc: i for i, doc in enumerate(_doc_order(env))}
            groups: dict[str, list] = {}
            for label, info in proofs.items():
                doc = info["docname"]
                if docnames is not None and doc not in docnames:
                    continue
                number = env.toc_fignumbers.get(doc, {}).get(info["countertype"], {}).get(label)
                num = ".".join(map(str, number)) if number else ""
                name = f"{info['realtype'].title()} {num}".strip()
                if info["title"]:
                    name += f" ({info['title']})"
                groups.setdefault(doc, []).append(
                    (number or (), (name, 0, doc, label, "", "", "")))
            content = []
            for doc in sorted(groups, key=lambda d: (order.get(d, 10 ** 6), d)):
                secnum = env.toc_secnumbers.get(doc, {}).get("")
                title = env.titles[doc].astext() if doc in env.titles else doc
                heading = f"{'.'.join(map(str, secnum))}. {title}" if secnum else title
                entries = [e for _, e in sorted(groups[doc], key=lambda t: t[0])]
                content.append((heading, entries))
            return content, False

    return ProofIndex


def _doc_order(env) -> list[str]:
    """Documents in reading order (the toctree's), for sorting the index by chapter."""
    order: list[str] = []
    root = env.config.root_doc

    def walk(doc):
        if doc in order:
            return
        order.append(doc)
        for child in env.toctree_includes.get(doc, []):
            walk(child)

    walk(root)
    return order


# ------------------------------------------------------------------ execution status
STATUS_OK, STATUS_FAILED = "\u2713 passed", "\u2717 failed"  # plain check marks, no emoji font


def _plain_status_marks() -> None:
    """myst-nb's execution table writes the emoji U+2705/U+274C; use text marks."""
    from myst_nb.ext import execution_tables

    execution_tables._key2transform["succeeded"] = (
        lambda ok: STATUS_OK if ok is True else STATUS_FAILED)


def _mark_status_cells(app, doctree, docname) -> None:
    from docutils import nodes

    for entry in doctree.findall(nodes.entry):
        text = entry.astext().strip()
        if text in (STATUS_OK, STATUS_FAILED):
            for par in entry.findall(nodes.paragraph):
                par["classes"].append("klbook-status-ok" if text == STATUS_OK else "klbook-status-failed")


# ---------------------------------------------------------------------------- set-up
def _config_inited(app, config) -> None:
    options = dict(config.html_theme_options or {})
    options.setdefault("navbar_persistent", [])
    config.html_theme_options = options
    templates = str(HERE / "templates")
    if templates not in config.templates_path:
        config.templates_path = list(config.templates_path) + [templates]


def setup(app):
    app.setup_extension("sphinx_proof")
    from sphinx_proof.domain import ProofDomain, ProofIndex as _Base

    ProofDomain.indices = [_make_proof_index(_Base)]
    app.connect("config-inited", _config_inited)
    app.connect("builder-inited", _evict_on_build)
    app.connect("doctree-read", _remember_execution)
    app.connect("doctree-read", _collect_proof_titles)
    app.connect("env-get-outdated", _reread_if_execution_changed)
    app.connect("env-purge-doc", _purge)
    app.connect("env-merge-info", _merge)
    app.connect("html-page-context", _warn_figure_text)
    _plain_status_marks()
    app.connect("doctree-resolved", _mark_status_cells)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
