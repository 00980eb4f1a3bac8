"""klbook_lib.display: tables for reading."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from klbook_lib.display import format_number, table


@settings(derandomize=True, max_examples=300)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12),
       st.integers(min_value=1, max_value=6))
def test_format_number_keeps_the_value_to_its_digits(x, digits):
    text = format_number(x, digits)
    assert not (text.startswith("-") and float(text) == 0), text
    # the printed value is x rounded to `digits` significant digits, as Python's %g rounds it
    assert float(text) == float(f"{x:.{digits}g}"), (x, digits, text)


def test_negative_zero_and_integers():
    assert format_number(-1e-9, 3) == "-1.00e-09"
    assert format_number(-0.0) == "0"
    assert format_number(np.int64(7)) == "7"
    assert format_number("label") == "label"
    with pytest.raises(ValueError, match="digits"):
        format_number(1.0, 0)


def test_table_hides_the_index_and_formats_columns():
    df = pd.DataFrame({"estimator": ["k1", "k3"], "bias": [-0.00001234, 0.5], "n": [10, 20]},
                      index=[7, 8])
    html = table(df, digits={"bias": 2}).to_html()
    assert ">7<" not in html and ">8<" not in html          # no index column
    assert "-1.2e-05" in html and "0.50" in html and ">10<" in html
    assert ">7<" in table(df, index=True).to_html()
    with pytest.raises(ValueError, match="digits"):
        table(df, digits={"nope": 2})
    with pytest.raises(ValueError, match="df"):
        table([1, 2])
