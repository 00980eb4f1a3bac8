"""Plain-data encoding of answers and their comparison with a reference.

Everything that crosses the boundary between a student's process and the grader is
plain JSON data built by :func:`encode`. :func:`compare` runs in whichever process
holds the reference: the grader's own process when grading, the student's process
for the public checks of :func:`klbook_grader.check`. Nothing here is secret.
"""
from __future__ import annotations

from typing import Any

import numpy as np

MAX_ELEMENTS = 100_000  # an answer larger than this is refused, not shipped


def encode(value: Any, _depth: int = 0) -> dict:
    """Turn a Python, numpy or torch value into plain JSON-able data.

    Arrays and tensors become ``{"t": "array", "lib": ..., "shape": [...], "v": nested list}``;
    numbers ``{"t": "num"}``, strings ``{"t": "str"}``, ``None`` ``{"t": "none"}``,
    lists and tuples ``{"t": "list"}``; anything else ``{"t": "other", "type": name}``.
    """
    if _depth > 20:
        return {"t": "other", "type": "too deeply nested"}
    if value is None:
        return {"t": "none"}
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return {"t": "bool", "v": bool(value)}
    if isinstance(value, (int, np.integer)):
        return {"t": "num", "v": float(value), "int": True}
    if isinstance(value, (float, np.floating)):
        return {"t": "num", "v": float(value)}
    if isinstance(value, str):
        return {"t": "str", "v": value[:10_000]}
    if isinstance(value, np.ndarray):
        return _encode_array(value, "numpy")
    mod = type(value).__module__ or ""
    if mod.startswith("torch") and hasattr(value, "detach"):
        arr = value.detach().cpu().double().numpy()
        return _encode_array(arr, "torch")
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_ELEMENTS:
            return {"t": "other", "type": f"{type(value).__name__} of {len(value)} items (too large)"}
        return {"t": "list", "v": [encode(x, _depth + 1) for x in value]}
    return {"t": "other", "type": type(value).__name__}


def _encode_array(arr: np.ndarray, lib: str) -> dict:
    shape = [int(s) for s in arr.shape]
    if arr.size > MAX_ELEMENTS:
        return {"t": "other", "type": f"{lib} array of shape {tuple(shape)} (too large)"}
    if arr.dtype.kind not in "biuf":
        return {"t": "other", "type": f"{lib} array of dtype {arr.dtype}"}
    return {"t": "array", "lib": lib, "shape": shape, "v": np.asarray(arr, dtype=np.float64).tolist()}


def materialise(data: Any) -> Any:
    """Rebuild an argument from :func:`encode` data (a fresh object on every call)."""
    t = data["t"]
    if t == "none":
        return None
    if t == "bool":
        return bool(data["v"])
    if t == "num":
        return int(data["v"]) if data.get("int") else float(data["v"])
    if t == "str":
        return str(data["v"])
    if t == "list":
        return [materialise(x) for x in data["v"]]
    if t == "array":
        arr = np.asarray(data["v"], dtype=np.float64).reshape(data["shape"])
        if data.get("lib") == "torch":
            import torch

            return torch.tensor(arr, dtype=torch.float64)
        return arr
    raise TypeError(f"cannot rebuild an argument of type {t!r}")


def to_numeric(data: Any) -> np.ndarray:
    """Decode plain data into a float64 array; raise ``TypeError`` with a reason if impossible."""
    if not isinstance(data, dict) or "t" not in data:
        raise TypeError("malformed answer data")
    t = data["t"]
    if t in ("num", "bool"):
        v = data.get("v")
        if not isinstance(v, (int, float)):
            raise TypeError("malformed number")
        return np.asarray(float(v), dtype=np.float64)
    if t == "array":
        arr = np.asarray(data.get("v"), dtype=np.float64)
        shape = tuple(data.get("shape", ()))
        if arr.shape != shape:
            raise TypeError("malformed array data")
        return arr
    if t == "list":
        items = [to_numeric(x) for x in data.get("v", [])]
        if not items:
            return np.zeros((0,), dtype=np.float64)
        shapes = {x.shape for x in items}
        if len(shapes) != 1:
            raise TypeError("a ragged list (items of different shapes)")
        return np.stack(items)
    if t == "none":
        raise TypeError("None (no answer)")
    if t == "str":
        raise TypeError(f"a string ({data.get('v', '')[:40]!r})")
    raise TypeError(f"a value of type {data.get('type', t)}")


def describe(arr: np.ndarray) -> str:
    """A short human-readable rendering of an array for messages."""
    with np.printoptions(precision=6, threshold=8, edgeitems=3, linewidth=100):
        return np.array2string(np.asarray(arr), separator=", ")


def compare_numeric(expected: np.ndarray, got_data: Any, rtol: float, atol: float,
                    reveal: bool = True) -> tuple[bool, str]:
    """Compare an encoded answer with the expected array. Returns ``(passed, reason)``.

    The shape must match exactly (a Python number, a 0-d array and a 0-d tensor are all
    scalars). Infinities must match exactly; a NaN never passes. With ``reveal=False``
    the reason does not show the expected value (hidden cases, numeric answers).
    """
    expected = np.asarray(expected, dtype=np.float64)
    try:
        got = to_numeric(got_data)
    except (TypeError, ValueError, OverflowError) as exc:
        kind = "a scalar" if expected.ndim == 0 else f"an array of shape {expected.shape}"
        return False, f"expected {kind}, got {exc}"
    if got.shape != expected.shape:
        want = "a scalar" if expected.ndim == 0 else f"shape {expected.shape}"
        have = "a scalar" if got.ndim == 0 else f"shape {got.shape}"
        return False, f"wrong shape: expected {want}, got {have}"
    shown = (f"expected {describe(expected)}, got {describe(got)}" if reveal
             else f"got {describe(got)}")
    nan = np.isnan(got)
    finite = np.isfinite(expected)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(got - np.where(finite, expected, 0.0)) <= atol + rtol * np.abs(np.where(finite, expected, 0.0))
    good = ~nan & np.where(finite, close, got == expected)
    if nan.any():
        if got.ndim:
            return False, f"returned NaN: {_first(nan, got, expected, reveal, 'NaN')}"
        return False, f"returned NaN ({shown})"
    if not good.all():
        if got.ndim:      # where the answer goes wrong, not a truncated dump (issue 36)
            return False, f"wrong value: {_first(~good, got, expected, reveal)} ({tolerance_text(rtol, atol)})"
        return False, f"wrong value: {shown} ({tolerance_text(rtol, atol)})"
    return True, "ok"


def _first(bad: np.ndarray, got: np.ndarray, expected: np.ndarray, reveal: bool,
           what: str = "wrong") -> str:
    """The first entry (in row-major order) that is wrong, its position, and how many are."""
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    where = f"[{', '.join(map(str, idx))}]"
    text = f"{int(bad.sum())} of {bad.size} entries {what}; the first at index {where}: got {float(got[idx]):.6g}"
    if reveal:
        text += f", expected {float(expected[idx]):.6g}"
    return text


def tolerance_text(rtol: float, atol: float) -> str:
    """How close an answer must be, in words: exact, absolute, relative or both."""
    if rtol == 0 and atol == 0:
        return "the answer must be exact"
    if atol == 0:
        return f"tolerance: relative error <= {rtol:g}"
    if rtol == 0:
        return f"tolerance: |error| <= {atol:g}"
    return f"tolerance: |error| <= {atol:g} + {rtol:g} * |expected|"


def normalise_choice(data: Any) -> str | None:
    """The letter a student chose (upper case, stripped), or ``None`` if not a string."""
    if isinstance(data, dict) and data.get("t") == "str" and isinstance(data.get("v"), str):
        return data["v"].strip().upper()
    return None


def compare_choice(correct: str, got_data: Any, options: str,
                   explain: dict | None = None) -> tuple[bool, str]:
    """Whether the chosen letter is ``correct``; a wrong letter's message says, in the sentence
    ``explain[letter]`` if there is one, why that statement is wrong (not which one is right)."""
    letter = normalise_choice(got_data)
    if letter is None:
        return False, "no answer: set it to one of the letters " + ", ".join(options)
    if letter not in options or len(letter) != 1:
        return False, f"{letter!r} is not one of the options " + ", ".join(options)
    if letter == correct:
        return True, "ok"
    why = (explain or {}).get(letter, "")
    return False, f"{letter} is not the right choice" + (f": {why}" if why else "")

