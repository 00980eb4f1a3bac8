"""Tables for reading: what the chapters show instead of a raw ``DataFrame``.

A raw pandas table in a page prints its index column, every float to six digits and
``-0.000`` for tiny negative numbers, and grows wider than the text column. :func:`table`
returns a pandas ``Styler`` that hides the index (unless it carries information),
rounds to a chosen number of significant digits, writes a negative zero as ``0`` and
lets long column names wrap. The numbers themselves are untouched: asserts keep working
on the ``DataFrame``.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["table", "format_number"]


def format_number(x: Any, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits; integers as integers; ``-0`` as ``0``.

    Large or tiny magnitudes switch to scientific notation (``1.2e-05``). Non-numbers are
    returned as ``str(x)``.
    """
    if not isinstance(digits, int) or digits < 1:
        raise ValueError(f"digits: must be a positive integer, got {digits!r}")
    if isinstance(x, bool) or not isinstance(x, (int, float)) and not hasattr(x, "__float__"):
        return str(x)
    if isinstance(x, int) or (hasattr(x, "is_integer") and type(x).__name__.startswith("int")):
        return str(int(x))
    v = float(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    rounded = float(f"{v:.{digits}g}")          # round to `digits` significant digits first
    magnitude = math.floor(math.log10(abs(rounded)))
    if magnitude >= 6 or magnitude < -4:
        return f"{v:.{max(digits - 1, 0)}e}"
    text = f"{rounded:.{max(digits - 1 - magnitude, 0)}f}"
    if float(text) == 0:  # rounds to zero at this precision: no "-0.000"
        return "0"
    return text


def table(df, digits: int | Mapping[str, int] = 3, index: bool = False, caption: str | None = None):
    """A ``Styler`` of ``df`` for reading: no index column, ``digits`` significant digits.

    Args:
        df: a pandas ``DataFrame``.
        digits: significant digits for every numeric column, or a mapping from column
            name to digits (columns not named get 3).
        index: keep the index column (use it when the index is a label such as ``beta``).
        caption: an optional caption shown above the table.
    """
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: expected a pandas DataFrame, got {type(df).__name__}")
    per_column = dict(digits) if isinstance(digits, Mapping) else {}
    default = 3 if isinstance(digits, Mapping) else digits
    unknown = set(per_column) - set(df.columns)
    if unknown:
        raise ValueError(f"digits: names columns that df does not have: {sorted(map(str, unknown))}")
    formatters = {c: (lambda x, d=per_column.get(c, default): format_number(x, d)) for c in df.columns}
    styler = df.style.format(formatters)
    if index:
        styler = styler.format_index(lambda x: format_number(x, default) if isinstance(x, float) else str(x))
    else:
        styler = styler.hide(axis="index")
    if caption:
        styler = styler.set_caption(caption)
    return styler.set_table_attributes('class="klbook-table"')
