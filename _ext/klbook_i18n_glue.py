"""Glued numbers inside translated paragraphs (the first step of the Chinese edition, issue 27).

Sphinx's ``Locale`` transform (priority 20) parses each translated message as a small document
of its own (its source ends in ``<translated>``); myst-nb's glue roles look for the notebook's
glue data in *that* document, find none, warn ``No key ... found in glue data`` and print the
sentence without its number. myst-nb also takes its renderer, which holds the glue data, off
the page's document at the end of parsing. So this extension keeps the renderer the notebook
parser made last (reading is sequential within a process), files it under the page's name in
a transform that runs just before ``Locale``, and lets a glue lookup that fails in a
``<translated>`` document fall back on that page's data: the translated sentence shows the very
number the English one shows. A key the page does not glue still fails as before.
Where the page also glued ``KEY__<language>`` (``klbook_lib.claims`` glues each claim's verdict
sentence in English under ``KEY`` and in Chinese under ``KEY__zh_CN``), a build in that language
shows that variant wherever the page writes ``{glue:text}`KEY``` (in a translated sentence, and
in text that needs no translation: a paragraph that is only the role, a table cell inside a
directive): the catalogue keeps the role exactly, and the Chinese edition says the verdict in
Chinese (issue 35). The English build never looks for a variant.
Checked against myst-nb 1.4.0 and Sphinx 7.4.7 (``sphinx/transforms/i18n.py`` ``publish_msgstr``,
``myst_nb/sphinx_.py`` ``Parser.parse``, ``myst_nb/ext/glue/utils.py`` ``retrieve_glue_data``).
"""
from __future__ import annotations

from docutils import nodes
from docutils.transforms import Transform
from myst_nb.core.render import NbElementRenderer
from myst_nb.core.variables import RetrievalError, VariableOutput
from myst_nb.ext.glue import roles, utils

_PAGES: dict[str, object] = {}       # docname -> the page's NbElementRenderer (this process)
_LAST: list = []                     # the renderer the notebook parser made last
_original = utils.retrieve_glue_data
_original_init = NbElementRenderer.__init__


def _init(self, *args, **kwargs) -> None:
    # myst-nb takes the renderer (and with it the glue data) off the document at the end of
    # parsing; keep the one made last, which belongs to the page being read in this process
    _original_init(self, *args, **kwargs)
    _LAST[:] = [self]


class KeepGlueData(Transform):
    default_priority = 19                 # Locale is 20

    def apply(self) -> None:
        env = getattr(self.document.settings, "env", None)
        if env is not None and _LAST:
            _PAGES[env.docname] = _LAST.pop()


def _language(document: nodes.document) -> str:
    env = getattr(document.settings, "env", None)
    language = getattr(getattr(env, "config", None), "language", None) or ""
    return "" if language in ("", "en") else language


def retrieve_glue_data(document: nodes.document, key: str) -> VariableOutput:
    language = _language(document)
    if language:
        try:
            return _retrieve(document, f"{key}__{language}")
        except RetrievalError:
            pass
    return _retrieve(document, key)


def _retrieve(document: nodes.document, key: str) -> VariableOutput:
    try:
        return _original(document, key)
    except RetrievalError:
        source = str(document.get("source", ""))
        env = getattr(document.settings, "env", None)
        page = _PAGES.get(getattr(env, "docname", None)) if source.endswith("<translated>") else None
        if page is None:
            raise
        data = page.renderer.nb_client.glue_data
        if key not in data:
            raise
        return VariableOutput(data=data[key]["data"], metadata=data[key].get("metadata", {}),
                              nb_renderer=page, vtype="glue")


def setup(app):
    utils.retrieve_glue_data = retrieve_glue_data
    roles.retrieve_glue_data = retrieve_glue_data
    try:
        from myst_nb.ext.glue import directives
        directives.retrieve_glue_data = retrieve_glue_data
    except ImportError:
        pass
    NbElementRenderer.__init__ = _init
    app.add_transform(KeepGlueData)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
