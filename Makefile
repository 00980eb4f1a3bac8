# The README's two commands:
#   make book   set everything up (.venv), execute every notebook, build the HTML book
#   make test   set up if needed, then run every test (library, notebooks, book build, browser)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.klbook-installed
JB     := $(VENV)/bin/jupyter-book
# -W: warnings are errors (a broken reference or a missing figure fails the build)
JBFLAGS := -W --keep-going
# notebooks run two at a time (one torch thread each) on a 2-core machine
JOBS ?= 2
export PYTHONHASHSEED := 0
export OMP_NUM_THREADS := 1
export MPLBACKEND := Agg
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export KLBOOK_CACHE ?= $(CURDIR)/_build/klbook_cache
# `make book REPO_URL=https://github.com/OWNER/REPO`: repository, Binder and Colab buttons
# (none without it; _ext/klbook_publish.py)
export KLBOOK_REPO_URL ?= $(REPO_URL)
export KLBOOK_REPO_BRANCH ?= $(REPO_BRANCH)

NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb)) $(sort $(wildcard exercises/*.ipynb)) $(sort $(wildcard exercises/masters/*.ipynb))

.PHONY: setup book pdf test test-lib test-notebooks test-book test-browser students print-notebooks clean help

help:
	@echo "make book   - set up .venv and build the book into _build/html"
	@echo "make test   - run every test (library, notebooks, book build, browser check)"
	@echo "make pdf    - the whole book as one PDF: _build/pdf/book.pdf"

setup: $(STAMP)
	@bash tools/ensure_bubblewrap.sh || echo "note: no bubblewrap: 'klbook grade' refuses to grade and the grader's tests fail"

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24"
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# the notebooks run first, $(JOBS) at a time, into the jupyter-cache (tools/execute_book.py:
# only those whose code, library modules or requirements changed since their cached run);
# a failing notebook stops here; the build then executes nothing itself
book: setup
	$(OFFLINE) $(PY) tools/execute_book.py --jobs $(JOBS)
	KLBOOK_ZH=1 $(OFFLINE) $(JB) build . $(JBFLAGS)
	$(OFFLINE) $(PY) tools/i18n.py build
	@echo
	@echo "The book is built. Open $(CURDIR)/_build/html/index.html in a browser (the Chinese edition: _build/html/zh/index.html)."

# Every test. nbval writes what it executes into the book's cache (conftest.py),
# so the book build after it reuses those runs instead of executing twice.
test: setup
	$(MAKE) test-lib
	$(MAKE) test-notebooks
	$(MAKE) test-book
	$(MAKE) pdf
	$(MAKE) test-browser

# Everything after set-up runs with the network cut off (tools/offline.sh).
OFFLINE := bash tools/offline.sh

# pytest's temporary directories: one folder per checkout, outside the repository (the
# grader's tests need paths outside it) and not the shared /tmp/pytest-of-USER: the grader's
# tests build directory trees too deep for pytest's own clean-up, so the folder is emptied
# with the grader's remove_tree first (a stale tree would otherwise break every later run)
PYTEST_TMP := $(or $(TMPDIR),/tmp)/klbook-pytest-$(shell printf '%s' '$(CURDIR)' | cksum | cut -d' ' -f1)

test-lib: setup
	$(PY) -c "from klbook_grader.sandbox import remove_tree; remove_tree('$(PYTEST_TMP)')"
	$(OFFLINE) $(PY) -m pytest tests -q -n $(JOBS) -m "not browser" --basetemp=$(PYTEST_TMP)

test-notebooks: setup
	$(OFFLINE) $(PY) -m pytest -q -n $(JOBS) --dist loadfile --nbval-lax --nbval-cell-timeout=900 -p no:cacheprovider $(NOTEBOOKS)

# both editions from the one jupyter-cache: the English site with its language switch, the
# Chinese one in _build/html/zh (issue 27), and the check that every English message of the
# book has a Chinese translation (a changed paragraph without one fails here)
test-book: setup
	KLBOOK_ZH=1 $(OFFLINE) $(JB) build . $(JBFLAGS)
	$(OFFLINE) $(PY) tools/i18n.py build
	$(OFFLINE) $(PY) tools/i18n.py check

test-browser: setup
	bash tools/ensure_chromium.sh
	$(OFFLINE) $(PY) -m pytest tests -q -m browser

# The whole book as one PDF, offline: _build/pdf/book.pdf (copied to _build/html/book.pdf,
# which the landing page links), and the Chinese edition's, _build/pdf/book-zh.pdf. A single-page build from the cache (nothing executes
# again), printed by the browser check's Chromium; see tools/build_pdf.py.
pdf: setup
	bash tools/ensure_chromium.sh
	$(OFFLINE) $(PY) tools/build_pdf.py
	$(OFFLINE) $(PY) tools/build_pdf.py --lang zh

students: setup
	$(VENV)/bin/klbook make-student

print-notebooks:
	@echo $(NOTEBOOKS)

clean:
	rm -rf _build
