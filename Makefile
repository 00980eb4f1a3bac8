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

.PHONY: setup book pdf test test-code test-lib test-notebooks test-quick test-chapter test-book test-browser _chain-en _chain-zh _pdf-en _pdf-zh _browser-0 _browser-1 students print-notebooks clean help

help:
	@echo "make book   - set up .venv and build the book into _build/html"
	@echo "make test   - run every test (library, notebooks, book build, browser check)"
	@echo "make pdf    - the whole book as one PDF: _build/pdf/book.pdf"
	@echo "make test-quick - the library's tests without the grader's, the slow ones and the book"
	@echo "make test-chapter NB=chapters/05_kl_in_practice.ipynb - re-execute and check one notebook"

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

# Every test, in four timed stages (tools/stage_times.py prints the table at the end; the
# README states the budget): (1) the library's tests and nbval over every notebook in ONE
# pytest run, two workers sharing the queue (heaviest notebooks first; a notebook's cells
# stay together on one worker); nbval writes what it executes into the book's cache
# (conftest.py), so nothing executes twice; (2) the English and the Chinese chains side by
# side: each edition's HTML build from that cache, then its PDF (the Chinese chain also runs
# the translation check); (3) the browser check of both editions, two workers.
TIMED = $(PY) tools/stage_times.py run
TEST_BUDGET_MIN := 45
test: setup
	@$(PY) tools/stage_times.py reset
	$(TIMED) "1. pytest tests + nbval (every notebook)" -- $(MAKE) --no-print-directory test-code
	@bash tools/ensure_chromium.sh
	$(TIMED) "2. HTML, translation check and PDF, both editions" -- $(MAKE) --no-print-directory -j2 --output-sync=target _chain-en _chain-zh
	$(TIMED) "3. browser check (both editions, the PDFs)" -- $(MAKE) --no-print-directory test-browser
	@$(PY) tools/stage_times.py report --budget $(TEST_BUDGET_MIN)

# the notebooks heaviest first (their last measured CPU time, README), so that the two
# workers finish together; the rest of NOTEBOOKS after the library's tests
HEAVY_NOTEBOOKS := chapters/12_overoptimisation_distillation.ipynb chapters/09_choosing_beta.ipynb \
	chapters/13_kl_as_a_tool.ipynb chapters/11_sequence_kl_grpo.ipynb chapters/03_trpo_ppo.ipynb \
	chapters/05_kl_in_practice.ipynb chapters/06_rlhf_reverse_kl.ipynb chapters/08_vi_elbo_dpo.ipynb
# The masters (exercises/masters/, not part of the book) are not run by nbval here: the
# grader's tests execute every master top to bottom in its sandbox and fail on any cell that
# raises (tests/test_exercises.py: "notes == []", every master of the bank; nbval-lax checked
# the same, no error), so nbval running them again was the same check twice (issue 34).
BOOK_NOTEBOOKS := $(sort $(wildcard chapters/*.ipynb)) $(sort $(wildcard exercises/*.ipynb))
LIGHT_NOTEBOOKS := $(filter-out $(HEAVY_NOTEBOOKS),$(BOOK_NOTEBOOKS))

test-code: setup
	$(PY) -c "from klbook_grader.sandbox import remove_tree; remove_tree('$(PYTEST_TMP)')"
	$(OFFLINE) $(PY) -m pytest -q -n $(JOBS) --dist loadfile -m "not browser" --basetemp=$(PYTEST_TMP) \
		--durations=30 --nbval-lax --nbval-cell-timeout=900 $(HEAVY_NOTEBOOKS) tests $(LIGHT_NOTEBOOKS)

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

# The authors' inner loop (not what CI runs):
#   make test-quick            the library's tests without the grader's, the slow ones and the book (minutes)
#   make test-chapter NB=chapters/05_kl_in_practice.ipynb
#                              re-execute one notebook under nbval (into the book's cache) and run the
#                              book's structure and prose checks
test-quick: setup
	$(OFFLINE) $(PY) -m pytest tests -q -n $(JOBS) -m "not browser and not slow" --ignore=tests/grader \
		--basetemp=$(PYTEST_TMP)

test-chapter: setup
	@test -n "$(NB)" || { echo "usage: make test-chapter NB=chapters/NN_name.ipynb"; exit 2; }
	@test -f "$(NB)" || { echo "make test-chapter: no notebook $(NB)"; exit 2; }
	$(OFFLINE) $(PY) -m pytest -q --nbval-lax --nbval-cell-timeout=900 $(NB)
	$(OFFLINE) $(PY) -m pytest -q tests/test_book_structure.py tests/test_book_text.py

# both editions from the one jupyter-cache: the English site with its language switch, the
# Chinese one in _build/html/zh (issue 27), and the check that every English message of the
# book has a Chinese translation (a changed paragraph without one fails here)
test-book: setup
	KLBOOK_ZH=1 $(OFFLINE) $(JB) build . $(JBFLAGS)
	$(OFFLINE) $(PY) tools/i18n.py build
	$(OFFLINE) $(PY) tools/i18n.py check

# make test's stage 2: the two editions side by side (make -j2), each built from the
# jupyter-cache and then printed; every step timed on its own
_chain-en: setup
	$(TIMED) "2a. HTML build, English" -- env KLBOOK_ZH=1 $(OFFLINE) $(JB) build . $(JBFLAGS)
	$(TIMED) "2b. PDF, English" -- $(OFFLINE) $(PY) tools/build_pdf.py

_chain-zh: setup
	$(TIMED) "2c. HTML build, Chinese" -- $(OFFLINE) $(PY) tools/i18n.py build
	$(TIMED) "2d. translation check" -- $(OFFLINE) $(PY) tools/i18n.py check
	$(TIMED) "2e. PDF, Chinese" -- $(OFFLINE) $(PY) tools/build_pdf.py --lang zh

# two shares of the checks side by side, each with its own Chromium and server; a page's
# checks stay in one share (tests/conftest.py, KLBOOK_BROWSER_SHARD)
test-browser: setup
	bash tools/ensure_chromium.sh
	$(MAKE) --no-print-directory -j2 --output-sync=target _browser-0 _browser-1

BROWSER_PYTEST = $(OFFLINE) $(PY) -m pytest tests -q -m browser --durations=15
_browser-0: setup
	KLBOOK_BROWSER_SHARD=0/2 $(BROWSER_PYTEST)

_browser-1: setup
	KLBOOK_BROWSER_SHARD=1/2 $(BROWSER_PYTEST)

# The whole book as one PDF, offline: _build/pdf/book.pdf (copied to _build/html/book.pdf,
# which the landing page links), and the Chinese edition's, _build/pdf/book-zh.pdf. A
# single-page build from the cache (nothing executes again), printed by the browser
# check's Chromium (tools/build_pdf.py); the two editions side by side.
pdf: setup
	bash tools/ensure_chromium.sh
	$(MAKE) --no-print-directory -j2 --output-sync=target _pdf-en _pdf-zh

_pdf-en: setup
	$(OFFLINE) $(PY) tools/build_pdf.py

_pdf-zh: setup
	$(OFFLINE) $(PY) tools/build_pdf.py --lang zh

students: setup
	$(VENV)/bin/klbook make-student

print-notebooks:
	@echo $(NOTEBOOKS)

clean:
	rm -rf _build
