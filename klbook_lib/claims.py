"""Claims: the unit of evidence of the book's experiments (issue 35).

A *claim* is declared before its experiment runs. The declaration fixes everything a reader
needs to judge the result and everything an author could be tempted to choose after looking:

    c = kb.claims.Claim(
        "c05-gauge", "A strong fixed penalty gives a larger gradient ratio than the adaptive rule",
        arm="fixed beta 10", control="adaptive, lr 1e-2",      # BY NAME, never by position
        metric="median gradient ratio", better="higher",
        select_seeds=(), test_seeds=range(10), margin=0.1,      # "no difference" = CI in [-0.1, 0.1]
        says={"supported": "...", "opposite": "...", "no_difference": "...", "too_wide": "..."},
        zh={...the same four sentences in Chinese...})

Running it on the per-seed values of the arms, keyed by arm name (a dict may hold more arms
than the claim names; only ``arm`` and ``control`` are read), gives the estimate of
``mean(arm) - mean(control)`` with its bootstrap CI (:func:`klbook_lib.stats.diff_ci`), the
verdict and the sentence the page prints:

    r = c.run({"fixed beta 10": x, "adaptive, lr 1e-2": y, "adaptive, lr 1e-3": z})
    r.outcome      # "supported" | "opposite" | "no_difference" | "too_wide"
    r.sentence()   # the declared English sentence for that outcome, numbers filled in
    r.sentence("zh_CN")
    r.glue()       # glues "c05-gauge" style keys (see Result.glue) for {glue:text} in prose

The four outcomes, with ``d`` the difference arm minus control oriented so that "better" is
positive and ``[lo, hi]`` its CI:

* ``supported``: the CI lies wholly on the better side of zero;
* ``opposite``: the CI lies wholly on the worse side of zero;
* ``no_difference``: the CI contains zero and lies inside ``[-margin, margin]`` (the margin is
  part of the declaration: the smallest difference that would matter);
* ``too_wide``: the CI contains zero and reaches beyond the margin (these seeds cannot tell).

A CI that excludes zero is reported as a difference even when it lies inside the margin (a
detectable but small difference); the sentence may say how small with ``{value}``.

Sentences are Python format strings. Fields: ``value``, ``low``, ``high`` (the difference and
its CI, arm minus control, in the metric's units, not oriented), ``abs`` (``|value|``),
``ci`` (``"+0.21 [+0.05, +0.37]"`` at the claim's ``digits``), ``n`` (seeds per arm),
``level`` (``95``), ``arm``, ``control``, ``metric``, ``margin``.

The Chinese edition: each claim carries its four sentences in Chinese (``zh``), a message table
kept beside the English in the declaration. :meth:`Result.glue` glues the English sentence
under ``key`` and the Chinese one under ``key + "__zh_CN"``; a paragraph's Chinese translation in
the page's catalogue keeps the role ``{glue:text}`key``` exactly, and ``_ext/klbook_i18n_glue.py``
resolves it, in the Chinese build, to the ``__zh_CN`` variant when the page glued one.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from . import stats

OUTCOMES = ("supported", "opposite", "no_difference", "too_wide")
LANGUAGES = ("en", "zh_CN")
ZH_SUFFIX = "__zh_CN"
_FIELDS = dict(value=0.5, low=0.25, high=0.75, abs=0.5, ci="+0.50 [+0.25, +0.75]", n=10,
               level=95, arm="arm", control="control", metric="metric", margin=0.1)
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def _seeds(x, name: str) -> tuple[int, ...]:
    try:
        out = tuple(int(s) for s in x)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: expected a sequence of integer seeds ({err})") from None
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: seeds must be distinct, got {out}")
    return out


def _sentences(d, name: str) -> dict[str, str]:
    if not isinstance(d, Mapping):
        raise ValueError(f"{name}: expected a dict with one sentence per outcome {OUTCOMES}, "
                         f"got {type(d).__name__}")
    missing = [o for o in OUTCOMES if o not in d]
    extra = [k for k in d if k not in OUTCOMES]
    if missing or extra:
        raise ValueError(f"{name}: needs exactly the outcomes {OUTCOMES}; missing {missing}, "
                         f"unknown {extra}")
    out = {}
    for o in OUTCOMES:
        s = d[o]
        if not isinstance(s, str) or not s.strip():
            raise ValueError(f"{name}: the sentence for {o!r} must be a non-empty string")
        try:
            s.format(**_FIELDS)
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"{name}: the sentence for {o!r} has a bad field ({err!r}); "
                             f"allowed fields: {sorted(_FIELDS)}") from None
        out[o] = s
    return out


@dataclass(frozen=True)
class Claim:
    """An experimental claim, declared before its experiment runs (see the module docstring).

    ``better`` is ``"higher"`` or ``"lower"``: which sign of ``mean(arm) - mean(control)``
    supports the claim. ``select_seeds`` are the seeds on which anything the experiment chose
    (a beta, a learning rate, a threshold) was chosen; ``test_seeds`` the seeds the claim is
    tested on; the two must not overlap. ``margin`` (> 0, in the metric's units) is the
    difference below which the claim's author declares the arms equivalent.
    """

    id: str
    statement: str
    arm: str
    control: str
    metric: str
    better: str
    test_seeds: Sequence[int]
    margin: float
    says: Mapping[str, str]
    zh: Mapping[str, str]
    select_seeds: Sequence[int] = ()
    paired: bool = False
    digits: int = 2
    chapter: str = ""
    level: float = 0.95

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID.match(self.id):
            raise ValueError(f"id: must be a name of letters, digits, '_' or '-' starting with a "
                             f"letter, got {self.id!r}")
        for name in ("statement", "arm", "control", "metric"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"{name}: must be a non-empty string, got {v!r}")
        if self.arm == self.control:
            raise ValueError(f"control: must name another arm than arm ({self.arm!r})")
        if self.better not in ("higher", "lower"):
            raise ValueError(f"better: must be 'higher' or 'lower', got {self.better!r}")
        test = _seeds(self.test_seeds, "test_seeds")
        select = _seeds(self.select_seeds, "select_seeds")
        if len(test) < 2:
            raise ValueError(f"test_seeds: need at least 2 seeds, got {len(test)}")
        both = sorted(set(test) & set(select))
        if both:
            raise ValueError(f"test_seeds: must not reuse selection seeds, found {both}")
        object.__setattr__(self, "test_seeds", test)
        object.__setattr__(self, "select_seeds", select)
        if (isinstance(self.margin, bool) or not isinstance(self.margin, (int, float))
                or not math.isfinite(self.margin) or self.margin <= 0):
            raise ValueError(f"margin: must be a positive finite number, got {self.margin!r}")
        if not isinstance(self.paired, bool):
            raise ValueError(f"paired: must be True or False, got {self.paired!r}")
        if isinstance(self.digits, bool) or not isinstance(self.digits, int) or not 0 <= self.digits <= 8:
            raise ValueError(f"digits: must be an integer from 0 to 8, got {self.digits!r}")
        if not isinstance(self.level, float) or not 0 < self.level < 1:
            raise ValueError(f"level: must lie strictly between 0 and 1, got {self.level!r}")
        object.__setattr__(self, "says", _sentences(self.says, "says"))
        object.__setattr__(self, "zh", _sentences(self.zh, "zh"))

    # ------------------------------------------------------------------ running
    def run(self, values: Mapping[str, Sequence[float]], *, seed: int = 0,
            n_resamples: int = 9999) -> "Result":
        """Estimate, CI and verdict from ``values``: per-seed numbers keyed by arm name, one
        per test seed in the order of ``test_seeds``."""
        if not isinstance(values, Mapping):
            raise ValueError(f"values: expected a dict of per-seed values keyed by arm name, got "
                             f"{type(values).__name__} (arms are never taken by position)")
        for name in (self.arm, self.control):
            if name not in values:
                raise ValueError(f"values: no arm named {name!r} (has {sorted(map(str, values))})")
        samples = {}
        for role, name in (("arm", self.arm), ("control", self.control)):
            try:
                x = np.asarray(values[name], dtype=float)
            except (TypeError, ValueError) as err:
                raise ValueError(f"values: arm {name!r} is not a sequence of numbers ({err})") from None
            if x.ndim != 1 or x.size != len(self.test_seeds):
                raise ValueError(f"values: arm {name!r} needs one value per test seed "
                                 f"({len(self.test_seeds)}), got shape {x.shape}")
            if not np.all(np.isfinite(x)):
                raise ValueError(f"values: arm {name!r} has a non-finite value")
            samples[role] = x
        est = stats.diff_ci(samples["arm"], samples["control"], paired=self.paired,
                            level=self.level, seed=seed, n_resamples=n_resamples)
        return Result(self, est, decide(est, self.better, self.margin),
                      float(samples["arm"].mean()), float(samples["control"].mean()))


def decide(est: stats.Estimate, better: str, margin: float) -> str:
    """The outcome of a difference ``est`` (arm minus control) for a claim whose arm should be
    ``better`` ("higher" or "lower"), with the no-difference ``margin``."""
    if not isinstance(est, stats.Estimate):
        raise ValueError(f"est: must be a klbook_lib.stats.Estimate, got {type(est).__name__}")
    if better not in ("higher", "lower"):
        raise ValueError(f"better: must be 'higher' or 'lower', got {better!r}")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin: must be a positive finite number, got {margin!r}")
    sign = 1.0 if better == "higher" else -1.0
    lo, hi = sorted((sign * est.low, sign * est.high))
    if lo > 0:
        return "supported"
    if hi < 0:
        return "opposite"
    if -margin <= est.low and est.high <= margin:
        return "no_difference"
    return "too_wide"


@dataclass(frozen=True)
class Result:
    """A claim run on its test seeds: ``estimate`` (arm minus control), ``outcome``."""

    claim: Claim
    estimate: stats.Estimate
    outcome: str
    arm_mean: float
    control_mean: float

    def fields(self) -> dict:
        e, d = self.estimate, self.claim.digits
        ci = f"{e.value:+.{d}f} [{e.low:+.{d}f}, {e.high:+.{d}f}]"
        return dict(value=e.value, low=e.low, high=e.high, abs=abs(e.value), ci=ci,
                    n=len(self.claim.test_seeds), level=round(100 * e.level), arm=self.claim.arm,
                    control=self.claim.control, metric=self.claim.metric, margin=self.claim.margin)

    def sentence(self, lang: str = "en") -> str:
        """The declared sentence for this outcome, its numbers filled in (``lang`` "en" or "zh_CN")."""
        if lang not in LANGUAGES:
            raise ValueError(f"lang: must be one of {LANGUAGES}, got {lang!r}")
        table = self.claim.says if lang == "en" else self.claim.zh
        return table[self.outcome].format(**self.fields())

    def require(self, *outcomes: str) -> "Result":
        """Assert that the outcome is one of ``outcomes`` (what holds with a margin on any CPU)."""
        bad = [o for o in outcomes if o not in OUTCOMES]
        if not outcomes or bad:
            raise ValueError(f"outcomes: must be one or more of {OUTCOMES}, got {outcomes!r}")
        if self.outcome not in outcomes:
            raise AssertionError(f"{self.claim.id}: outcome {self.outcome!r} not in {outcomes}; "
                                 f"{self.claim.arm} - {self.claim.control} = {self.estimate}")
        return self

    def row(self, lang: str = "en") -> dict:
        """One line of a Finding table."""
        e, d = self.estimate, self.claim.digits
        diff = f"{e.value:+.{d}f} [{e.low:+.{d}f}, {e.high:+.{d}f}]"
        if lang == "zh_CN":
            return {"比较": f"{self.claim.arm} − {self.claim.control}", "指标": self.claim.metric,
                    "差值 [95% CI]": diff, "种子数": len(self.claim.test_seeds),
                    "结论": VERDICT_WORDS["zh_CN"][self.outcome]}
        return {"comparison": f"{self.claim.arm} − {self.claim.control}", "metric": self.claim.metric,
                "difference [95 % CI]": diff, "seeds": len(self.claim.test_seeds),
                "verdict": VERDICT_WORDS["en"][self.outcome]}

    def glue(self, key: str | None = None) -> "Result":
        """Glue the sentence under ``key`` (default: the claim's id with '-' as '_'), its Chinese
        under ``key + '__zh_CN'``, and ``key_value``, ``key_low``, ``key_high``, ``key_n`` and
        ``key_verdict`` (a word of :data:`VERDICT_WORDS`, also ``key_verdict__zh_CN``) for a
        Finding box's table."""
        from myst_nb import glue
        key = key or self.claim.id.replace("-", "_")
        glue(key, self.sentence("en"), display=False)
        glue(key + ZH_SUFFIX, self.sentence("zh_CN"), display=False)
        glue(f"{key}_value", float(self.estimate.value), display=False)
        glue(f"{key}_low", float(self.estimate.low), display=False)
        glue(f"{key}_high", float(self.estimate.high), display=False)
        glue(f"{key}_n", len(self.claim.test_seeds), display=False)
        glue(f"{key}_verdict", VERDICT_WORDS["en"][self.outcome], display=False)
        glue(f"{key}_verdict" + ZH_SUFFIX, VERDICT_WORDS["zh_CN"][self.outcome], display=False)
        return self


VERDICT_WORDS = {
    "en": {"supported": "supported", "opposite": "the opposite", "no_difference": "no difference",
           "too_wide": "cannot tell"},
    "zh_CN": {"supported": "成立", "opposite": "相反", "no_difference": "无差别", "too_wide": "无法判断"},
}


def finding_table(results: Iterable[Result], lang: str = "en"):
    """The effects table of a Finding box: one row per claim (a pandas DataFrame)."""
    import pandas as pd
    rows = list(results)
    if not rows or not all(isinstance(r, Result) for r in rows):
        raise ValueError("results: expected one or more claims.Result")
    return pd.DataFrame([r.row(lang) for r in rows])
