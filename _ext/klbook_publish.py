"""Publishing the book: buttons that work, notebooks that run outside the repository, print.

* **Repository, Binder and Colab buttons only for a real repository.** The default build
  has none of them (``_config.yml`` names no repository). A build started with
  ``KLBOOK_REPO_URL=https://github.com/OWNER/REPO`` (``make book REPO_URL=...``; branch
  ``KLBOOK_REPO_BRANCH``, default ``main``) gets the repository button and the Binder
  and Colab launch buttons pointing there. The URL is checked for the
  ``https://github.com/OWNER/REPO`` form (Binder and Colab only launch from GitHub);
  whether the repository exists cannot be checked offline, so set it only for a
  published repository.
* **A downloaded notebook can run.** Every chapter imports ``klbook_lib``. The HTML
  build writes a wheel of it (the book's library alone: the grader, klbook_grader, stays out) and the pinned
  ``requirements.txt`` into ``downloads/`` of the site; the directive
  ``{klbook-install}`` (used on the landing page) prints the exact commands, and the
  download menu of every notebook page says that the notebook needs ``klbook_lib`` and
  links those instructions.
* **No link to a PDF that is not there.** The landing page links ``book.pdf``, which
  ``make pdf`` writes (``tools/build_pdf.py``). After an HTML build without it the link
  is replaced by a note saying how to make it; ``tools/build_pdf.py`` puts the link back
  when it copies the PDF in (``pdf_link``).
* **Printing.** A print stylesheet makes the page's own print button (and
  ``tools/build_pdf.py``, which prints the whole book) produce every page of the
  text, with long code lines wrapped instead of cut off.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPO_ENV = "KLBOOK_REPO_URL"
BRANCH_ENV = "KLBOOK_REPO_BRANCH"
GITHUB_REPO = re.compile(r"^https://github\.com/([A-Za-z0-9](?:[A-Za-z0-9-]{0,38}))/([A-Za-z0-9._-]{1,100})$")
BINDER_URL = "https://mybinder.org"
COLAB_URL = "https://colab.research.google.com"
LAUNCH_KEYS = ("binderhub_url", "jupyterhub_url", "colab_url", "deepnote_url", "jupyterlite_url")
DOWNLOADS = "downloads"
RUN_ANCHOR = "running-the-notebooks-yourself"
# what the published wheel holds: the book's library only (the grader, ``klbook_grader``,
# with its hidden tests and reference solutions, is the instructor's and stays out)
WHEEL_PACKAGES = ("klbook_lib",)


# ----------------------------------------------------------------- repository buttons
def normalise_repo_url(url: str) -> str:
    """``url`` as ``https://github.com/OWNER/REPO``; ValueError if it is not of that form."""
    clean = url.strip().rstrip("/")
    if clean.endswith(".git"):
        clean = clean[:-4]
    if not GITHUB_REPO.match(clean):
        raise ValueError(
            f"{REPO_ENV} (make book REPO_URL=...): expected https://github.com/OWNER/REPO, got {url!r}; "
            "the Binder and Colab buttons can only launch a public GitHub repository")
    return clean


def apply_repository(theme_options: dict, url: str | None, branch: str | None = None) -> dict:
    """The theme options with the repository and launch buttons set from ``url``.

    No ``url`` (None or blank): no repository, edit, issues, Binder, Colab or other launch
    button, and no repository URL anywhere (Jupyter Book's default one included).
    A ``url``: the repository button and the Binder and Colab buttons, for ``branch``
    (default ``main``). Returns a new dict; ``theme_options`` is not changed.
    """
    opts = dict(theme_options or {})
    launch = dict(opts.get("launch_buttons") or {})
    if not (url or "").strip():
        for key in ("repository_url", "repository_branch"):
            opts.pop(key, None)
        for key in ("use_repository_button", "use_edit_page_button", "use_issues_button",
                    "use_source_button"):
            opts[key] = False
        for key in LAUNCH_KEYS:
            launch[key] = ""
        launch["thebe"] = False
        opts["launch_buttons"] = launch
        return opts
    opts["repository_url"] = normalise_repo_url(url)
    opts["repository_branch"] = (branch or "").strip() or "main"
    opts.setdefault("path_to_docs", "")
    opts["use_repository_button"] = True
    launch.update(binderhub_url=BINDER_URL, colab_url=COLAB_URL, thebe=False)
    launch.setdefault("notebook_interface", "jupyterlab")
    opts["launch_buttons"] = launch
    return opts


def _config_inited(app, config) -> None:
    from sphinx.errors import ConfigError

    try:
        config.html_theme_options = apply_repository(
            config.html_theme_options, os.environ.get(REPO_ENV), os.environ.get(BRANCH_ENV))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    static = str(HERE / "static")
    if static not in config.html_static_path:
        config.html_static_path = list(config.html_static_path) + [static]


# ---------------------------------------------------------------- the wheel and its note
def wheel_name(root: Path = ROOT) -> str:
    """The file name of klbook_lib's wheel, from pyproject.toml (pure Python, any platform)."""
    import tomllib

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    name = re.sub(r"[-_.]+", "_", project["name"])
    return f"{name}-{project['version']}-py3-none-any.whl"


def wheel_pyproject(text: str) -> str:
    """The repository's ``pyproject.toml`` for the readers' wheel: its tables that name the
    grader (``[project.scripts]``: the ``klbook`` command; ``[tool.setuptools.package-data]``)
    dropped, the packages found being :data:`WHEEL_PACKAGES` only."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        header = line.strip()
        if header.startswith("[") and header.endswith("]"):
            skipping = header in ("[project.scripts]", "[tool.setuptools.package-data]")
            if header == "[tool.setuptools.packages.find]":
                out += [line, f"include = {list(WHEEL_PACKAGES) + [p + '.*' for p in WHEEL_PACKAGES]!r}\n\n".replace("'", '"')]
                skipping = True
                continue
        if not skipping:
            out.append(line)
    return "".join(out)


def build_wheel(dest: Path, root: Path = ROOT) -> Path:
    """Build klbook_lib's wheel offline into ``dest``; return its path.

    The package is copied to a scratch folder first (the build writes ``build/`` and
    ``*.egg-info`` next to the sources), alone: the grader package beside it and the
    ``klbook`` command (the grader's) stay out of the scratch copy's ``pyproject.toml``; it
    is built with the running interpreter's pip and setuptools (no download, no isolation).
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="klbook-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "pyproject.toml").write_text(wheel_pyproject((root / "pyproject.toml").read_text()))

        def ignore(folder, names):
            return [n for n in names if n == "__pycache__" or n.endswith(".pyc")]

        for package in WHEEL_PACKAGES:
            shutil.copytree(root / package, src / package, ignore=ignore)
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
               "--no-index", "--quiet", "--wheel-dir", str(out), str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True,
                              env=dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1"))
        if done.returncode:
            raise RuntimeError(f"building the klbook_lib wheel failed:\n{done.stdout}\n{done.stderr}")
        built = sorted(out.glob("*.whl"))
        if [w.name for w in built] != [wheel_name(root)]:
            raise RuntimeError(f"expected {wheel_name(root)}, pip built {[w.name for w in built]}")
        target = dest / built[0].name
        shutil.copy2(built[0], target)
    return target


def _publish_downloads(app, exception) -> None:
    if exception is not None or app.builder.name != "html":
        return
    from sphinx.util import logging

    dest = Path(app.outdir) / DOWNLOADS
    wheel = build_wheel(dest)
    shutil.copy2(ROOT / "requirements.txt", dest / "requirements.txt")
    logging.getLogger(__name__).info(f"[klbook] {wheel.relative_to(app.outdir)} and requirements.txt written")


def install_commands(wheel: str) -> str:
    return "\n".join([
        "python3.11 -m venv klbook-env && . klbook-env/bin/activate",
        "# without an NVIDIA GPU, the CPU build of torch is much smaller (Linux):",
        "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
        f"pip install -r requirements.txt {wheel}",
        "jupyter lab 01_kl_definition.ipynb",
    ])


def _make_directive():
    from docutils import nodes
    from sphinx.util.docutils import SphinxDirective

    class InstallDirective(SphinxDirective):
        """``{klbook-install}``: the download links and the exact commands to run a notebook."""

        has_content = False

        def run(self):
            wheel = wheel_name()
            up = "../" * self.env.docname.count("/")
            para = nodes.paragraph()
            para += nodes.Text("Download ")
            para += nodes.reference("", wheel, refuri=f"{up}{DOWNLOADS}/{wheel}",
                                    classes=["klbook-download-wheel"])
            para += nodes.Text(" (the book's library) and ")
            para += nodes.reference("", "requirements.txt", refuri=f"{up}{DOWNLOADS}/requirements.txt",
                                    classes=["klbook-download-requirements"])
            para += nodes.Text(" (the pinned versions) next to the notebook, then, with Python 3.11:")
            code = nodes.literal_block(install_commands(wheel), install_commands(wheel), language="bash")
            return [para, code]

    return InstallDirective


def _download_menu(app, pagename, templatename, context, doctree) -> None:
    """The notebook download says what it needs; the menu links the instructions."""
    for group in context.get("header_buttons") or []:
        if group.get("label") != "download-buttons":
            continue
        buttons = group.get("buttons") or []
        # a page built from an .ipynb offers it as its "source"; a MyST notebook as "notebook"
        notebook = [b for b in buttons if b.get("label") == "download-notebook-button"
                    or (b.get("label") == "download-source-button" and b.get("text") == ".ipynb")]
        for b in notebook:
            b["text"] = ".ipynb (needs klbook_lib)"
            b["tooltip"] = ("Download the notebook. It imports klbook_lib: install the wheel from this "
                            "site first (see 'Run it yourself')")
        for b in buttons:
            if b.get("label") == "download-pdf-button":
                b["tooltip"] = "Print this page (the whole book is a PDF: see the landing page)"
        if notebook:
            buttons.append({
                "type": "link",
                "url": f"{context['pathto'](app.config.root_doc)}#{RUN_ANCHOR}",
                "text": "Run it yourself",
                "icon": "fas fa-circle-info",
                "tooltip": "What a downloaded notebook needs, and the commands to install it",
                "label": "run-notebook-help",
            })


def _singlehtml_visitors(app) -> None:
    """Let the single-page builder (the PDF's source) render what the HTML builder renders.

    Sphinx looks up node visitors under the builder's name and falls back to its format
    ("html") only when no extension registered any visitor for that name. sphinx-exercise
    registers some for "singlehtml", so sphinx-proof's (registered for "html" only) are
    not found and the build stops at the first definition; copy the missing ones.
    """
    if app.builder.name != "singlehtml":
        return
    handlers = app.registry.translation_handlers
    single = handlers.setdefault("singlehtml", {})
    for node_name, visitors in handlers.get("html", {}).items():
        single.setdefault(node_name, visitors)


# ------------------------------------------------------------------- the PDF's link
PDF_NAME = "book.pdf"
PDF_LINK = f'<a class="klbook-book-pdf" href="{PDF_NAME}">{PDF_NAME}</a>'
PDF_MISSING = ('<span class="klbook-book-pdf klbook-book-pdf-missing">book.pdf (not in this build '
               'of the site: <code class="docutils literal notranslate"><span class="pre">make</span> '
               '<span class="pre">pdf</span></code> writes it)</span>')
_PDF_ANY = re.compile(re.escape(PDF_LINK) + "|" + re.escape(PDF_MISSING))


def pdf_link(html: str, present: bool) -> str:
    """``html`` with the landing page's PDF link shown (``present``) or replaced by a note."""
    return _PDF_ANY.sub(lambda m: PDF_LINK if present else PDF_MISSING, html)


def sync_pdf_link(outdir: Path, root_doc: str = "intro") -> bool:
    """Link ``book.pdf`` from the landing page iff ``outdir/book.pdf`` exists; return whether it does."""
    page = Path(outdir) / f"{root_doc}.html"
    present = (Path(outdir) / PDF_NAME).is_file()
    if page.is_file():
        text = page.read_text(encoding="utf-8")
        new = pdf_link(text, present)
        if new != text:
            page.write_text(new, encoding="utf-8")
    return present


def _pdf_link_on_build(app, exception) -> None:
    if exception is None and app.builder.name == "html":
        sync_pdf_link(Path(app.outdir), app.config.root_doc)


def setup(app):
    app.connect("config-inited", _config_inited)
    app.connect("builder-inited", _singlehtml_visitors)
    app.add_directive("klbook-install", _make_directive())
    app.add_css_file("klbook-print.css", media="print")
    app.connect("html-page-context", _download_menu, priority=502)
    app.connect("build-finished", _publish_downloads)
    app.connect("build-finished", _pdf_link_on_build)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
