"""Test-suite settings.

Property-based tests (hypothesis) run derandomized: the same examples on every run and
every machine, so CI is reproducible; `HYPOTHESIS_PROFILE=explore` searches afresh.
"""
import os

from hypothesis import settings

settings.register_profile("book", derandomize=True, deadline=None, max_examples=100)
settings.register_profile("explore", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "book"))
