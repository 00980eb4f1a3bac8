"""Test-suite settings.

Property-based tests (hypothesis) run derandomized: the same examples on every run and
every machine, so CI is reproducible; `HYPOTHESIS_PROFILE=explore` searches afresh.
"""
import os
import zlib

import pytest
from hypothesis import settings

settings.register_profile("book", derandomize=True, deadline=None, max_examples=100)
settings.register_profile("explore", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "book"))


def pytest_collection_modifyitems(config, items):
    """``KLBOOK_BROWSER_SHARD=i/n`` keeps the n-th share of the checks of the built book
    (``make test-browser`` runs two shares side by side, each with its own Chromium). A page's
    checks stay together in one share (the parameter ``rel``, its Chinese twin with it), so the
    views a share caches per page are opened once; the other tests are shared by name."""
    shard = os.environ.get("KLBOOK_BROWSER_SHARD")
    if not shard:
        return
    try:
        index, count = (int(x) for x in shard.split("/"))
        if not 0 <= index < count:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"KLBOOK_BROWSER_SHARD must be i/n with 0 <= i < n, got {shard!r}")
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        key = params.get("rel") or getattr(item, "originalname", None) or item.nodeid
        key = str(key).removeprefix("zh/")
        (keep if zlib.crc32(key.encode()) % count == index else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
