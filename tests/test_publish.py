"""Only buttons that work, and notebooks that run outside the repository.

* Repository, Binder and Colab buttons appear only when a real repository is configured
  at build time (``KLBOOK_REPO_URL``, ``make book REPO_URL=...``): checked on the theme
  options, and by building a one-notebook Sphinx project with and without the setting.
* The site ships klbook_lib as a wheel: built here from the repository, unzipped into a
  temporary folder and imported from there by a fresh interpreter outside the
  repository (the grader, klbook_grader, and its hidden tests are not in it).
* The built site (marked ``browser``: needs ``_build/html``): the wheel and
  ``requirements.txt`` are in ``downloads/``, the landing page gives the commands, the
  download menu of a notebook page says what the notebook needs, and no page links a
  repository, Binder or Colab.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
sys.path.insert(0, str(ROOT / "_ext"))

import klbook_publish as kp  # noqa: E402

REPO = "https://github.com/example-owner/example-book"


def _theme_options_from_config() -> dict:
    """html_theme_options as Jupyter Book derives them from _config.yml (plus its defaults)."""
    from jupyter_book.config import get_final_config

    config, _ = get_final_config(user_yaml=yaml.safe_load((ROOT / "_config.yml").read_text()),
                                 cli_config={"latex_individualpages": False}, sourcedir=ROOT)
    return config["html_theme_options"]


# ------------------------------------------------------------------ config level
def test_config_names_no_repository():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert not cfg["repository"]["url"], "_config.yml must not name a repository URL; set KLBOOK_REPO_URL"
    assert cfg["html"]["use_repository_button"] is False
    assert not cfg["launch_buttons"].get("binderhub_url") and not cfg["launch_buttons"].get("colab_url")


def test_default_build_has_no_repository_or_launch_buttons():
    opts = kp.apply_repository(_theme_options_from_config(), None)
    assert "repository_url" not in opts  # Jupyter Book's default repository is dropped too
    assert opts["use_repository_button"] is False
    assert opts["use_edit_page_button"] is False and opts["use_issues_button"] is False
    launch = opts["launch_buttons"]
    assert all(not launch.get(k) for k in kp.LAUNCH_KEYS) and launch["thebe"] is False


def test_configured_repository_gets_the_buttons():
    opts = kp.apply_repository(_theme_options_from_config(), REPO + ".git/", "gh-pages")
    assert opts["repository_url"] == REPO
    assert opts["repository_branch"] == "gh-pages"
    assert opts["use_repository_button"] is True
    assert opts["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert opts["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert kp.apply_repository({}, REPO)["repository_branch"] == "main"


@pytest.mark.parametrize("url", ["github.com/a/b", "http://github.com/a/b", "https://gitlab.com/a/b",
                                 "https://github.com/a", "https://github.com/a/b/tree/main", "not a url"])
def test_bad_repository_url_is_refused(url):
    with pytest.raises(ValueError, match="KLBOOK_REPO_URL"):
        kp.apply_repository({}, url)


NOTEBOOK = {
    "cells": [{"cell_type": "markdown", "id": "a1", "metadata": {}, "source": "# A page\n\nText."},
              {"cell_type": "code", "id": "b2", "metadata": {}, "execution_count": None,
               "outputs": [], "source": "1 + 1"}],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def _mini_build(tmp: Path, repo: str | None) -> str:
    """Build a one-notebook Sphinx site with the book's theme and klbook_publish."""
    src = tmp / "src"
    src.mkdir(parents=True)
    (src / "page.ipynb").write_text(json.dumps(NOTEBOOK))
    (src / "index.md").write_text("# Home\n\n```{toctree}\npage\n```\n")
    (src / "conf.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "_ext")!r})
        extensions = ["myst_nb", "klbook_publish"]
        html_theme = "sphinx_book_theme"
        nb_execution_mode = "off"
        html_theme_options = {{"launch_buttons": {{"notebook_interface": "jupyterlab"}},
                               "repository_url": "https://github.com/executablebooks/jupyter-book",
                               "use_download_button": True}}
    """))
    env = dict(os.environ)
    env.pop(kp.REPO_ENV, None)
    if repo:
        env[kp.REPO_ENV] = repo
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(tmp / "out")],
                          env=env, capture_output=True, text=True, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return (tmp / "out" / "page.html").read_text()


@pytest.mark.slow
def test_built_page_has_buttons_only_with_a_repository(tmp_path):
    default = _mini_build(tmp_path / "default", None)
    for needle in ("mybinder.org", "colab.research.google.com", "btn-source-repository-button", "github.com"):
        assert needle not in default, f"default build links {needle}"
    assert ".ipynb (needs klbook_lib)" in default and "Run it yourself" in default
    configured = _mini_build(tmp_path / "configured", REPO)
    assert f"https://mybinder.org/v2/gh/example-owner/example-book/main?urlpath=lab/tree/page.ipynb" in configured
    assert "https://colab.research.google.com/github/example-owner/example-book/blob/main/page.ipynb" in configured
    soup = BeautifulSoup(configured, "html.parser")
    assert any(a.get("href") == REPO for a in soup.select("a.btn-source-repository-button")), "no repository button"


# ------------------------------------------------------------------ the wheel
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return kp.build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_contents(wheel):
    assert wheel.name == kp.wheel_name()
    names = zipfile.ZipFile(wheel).namelist()
    assert "klbook_lib/__init__.py" in names and "klbook_lib/divergences.py" in names
    # the readers' wheel holds the book's library only: no grader, no hidden tests, no command
    assert not [n for n in names if n.startswith("klbook_grader")], "the grader leaked into the wheel"
    assert {n.split("/")[0] for n in names} == {"klbook_lib", kp.wheel_name().removesuffix("-py3-none-any.whl") + ".dist-info"}
    assert not [n for n in names if n.endswith("entry_points.txt")], "the wheel installs a command"
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Name: klbook_lib" in meta


def test_wheel_imports_outside_the_repository(wheel, tmp_path):
    """A fresh interpreter, run in a folder outside the repository, imports the unzipped wheel."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = textwrap.dedent(f"""
        import math, klbook_lib as kb
        assert kb.__file__.startswith({str(site)!r}), kb.__file__
        # KL(Bernoulli(0.5) || Bernoulli(0.9)), summed by hand
        expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
        got = float(kb.divergences.kl([0.5, 0.5], [0.9, 0.1]))
        assert abs(got - expected) < 1e-9, (got, expected)
        import importlib.util
        spec = importlib.util.find_spec("klbook_grader")
        assert spec is None or not str(spec.origin).startswith({str(site)!r}), spec
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["PYTHONPATH"] = str(site)
    done = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


# ------------------------------------------------------------------ the built site
def _need_site():
    if not (HTML / "intro.html").exists():
        pytest.fail("_build/html does not exist: build the book first (make test-book)")


@pytest.mark.browser
def test_site_ships_the_wheel_and_the_commands():
    _need_site()
    wheel = HTML / kp.DOWNLOADS / kp.wheel_name()
    assert wheel.is_file() and zipfile.is_zipfile(wheel)
    assert (HTML / kp.DOWNLOADS / "requirements.txt").read_text() == (ROOT / "requirements.txt").read_text()
    soup = BeautifulSoup((HTML / "intro.html").read_text(), "html.parser")
    section = soup.find(id=kp.RUN_ANCHOR)
    assert section is not None, "the landing page has no 'Running the notebooks yourself' section"
    code = section.select_one("pre")
    assert code is not None and f"pip install -r requirements.txt {kp.wheel_name()}" in code.get_text()
    hrefs = {a["href"] for a in section.select("a[href]")}
    assert f"{kp.DOWNLOADS}/{kp.wheel_name()}" in hrefs and f"{kp.DOWNLOADS}/requirements.txt" in hrefs


@pytest.mark.browser
def test_notebook_download_says_what_it_needs():
    _need_site()
    page = HTML / "chapters" / "01_kl_definition.html"
    soup = BeautifulSoup(page.read_text(), "html.parser")
    menu = soup.select_one(".dropdown-download-buttons")
    assert menu is not None
    assert ".ipynb (needs klbook_lib)" in menu.get_text(" ")
    help_links = [a["href"] for a in menu.select("a.btn-run-notebook-help")]
    assert help_links, "no 'Run it yourself' item in the download menu"
    target = urlparse(help_links[0])
    assert (page.parent / target.path).resolve() == (HTML / "intro.html").resolve()
    assert target.fragment == kp.RUN_ANCHOR


@pytest.mark.browser
def test_no_page_links_a_repository_binder_or_colab():
    """The default build names no repository (KLBOOK_REPO_URL unset)."""
    _need_site()
    if os.environ.get(kp.REPO_ENV):
        pytest.skip(f"{kp.REPO_ENV} is set: this build is meant to have the buttons")
    offenders = []
    for page in HTML.rglob("*.html"):
        soup = BeautifulSoup(page.read_text(errors="replace"), "html.parser")
        for a in soup.select("a[href]"):
            host = urlparse(a["href"]).netloc
            if host in ("mybinder.org", "colab.research.google.com") or "btn-source-repository-button" in a.get("class", []):
                offenders.append(f"{page.relative_to(HTML)}: {a['href']}")
    assert not offenders, "\n".join(offenders[:20])


# ------------------------------------------------------------------- the PDF's link
def test_landing_page_links_the_pdf_only_when_it_exists(tmp_path):
    """After `make book` alone there is no book.pdf: the landing page says how to make it
    instead of linking a 404; tools/build_pdf.py links it again once it copies the PDF in."""
    page = tmp_path / "intro.html"
    page.write_text(f"<p>one PDF: {kp.PDF_LINK}.</p>")
    assert kp.sync_pdf_link(tmp_path) is False
    text = page.read_text()
    assert 'href="book.pdf"' not in text and "make" in text and "klbook-book-pdf-missing" in text
    assert kp.sync_pdf_link(tmp_path) is False and page.read_text() == text, "idempotent"
    (tmp_path / "book.pdf").write_bytes(b"%PDF-1.4")
    assert kp.sync_pdf_link(tmp_path) is True
    assert page.read_text() == f"<p>one PDF: {kp.PDF_LINK}.</p>"


def test_the_intro_uses_the_link_the_build_rewrites():
    intro = (ROOT / "intro.md").read_text()
    assert kp.PDF_LINK in intro, "intro.md must write the PDF link exactly as kp.PDF_LINK"
    assert "{klbook-repo}" in intro and "(get-the-sources)=" in intro
