"""What the sandbox sends, read as hostile data: parsing, validation and clean text.

The runner sends one JSON object per line (see ``runner.py``). Student code shares the
runner's process, so every line may have been forged or corrupted: :class:`Reader` accepts
a line only if it is valid UTF-8 JSON of bounded size and depth whose fields have exactly
the expected types and ranges; anything else is dropped and counted. Text that reaches
the grader's messages goes through :func:`clean` (no control characters, no terminal
escape sequences, no bidirectional overrides, one line, bounded length).
"""
from __future__ import annotations

import json
import math
import re

MAX_LINE_BYTES = 16 << 20          # one event (a case's answer is at most 100,000 numbers)
MAX_TOTAL_BYTES = 256 << 20        # everything one run may send
MAX_ELEMENTS = 100_000             # as compare.MAX_ELEMENTS: the largest answer
MAX_DEPTH = 24
MAX_TEXT = 500

_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]"          # CSI: colours, cursor moves, clears
                      r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, links
                      r"|\x1b[P^_X][^\x1b]*(?:\x1b\\)?"      # DCS, PM, APC, SOS strings
                      r"|\x1b[@-Z\\-_]"                       # two-character sequences
                      r"|\x9b[0-?]*[ -/]*[@-~]")              # 8-bit CSI


def clean(text, limit: int = 300) -> str:
    """One printable line: escape sequences removed, every other non-printable character
    (controls, bidirectional overrides, zero-width characters) replaced by a space."""
    if not isinstance(text, str):
        text = str(text)
    text = _ESCAPES.sub("", text[: limit * 4])
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())
    return text[:limit]


def _is_number(v) -> bool:
    if type(v) is float:
        return True                      # NaN and infinities are answers (wrong ones)
    return type(v) is int and abs(v) < 2 ** 1023


class _Budget:
    def __init__(self, n: int) -> None:
        self.n = n

    def take(self, k: int) -> bool:
        self.n -= k
        return self.n >= 0


def _valid_nested(v, shape: list, budget: _Budget) -> bool:
    # iterative walk of a nested list that must have exactly ``shape``
    stack = [(v, 0)]
    while stack:
        x, level = stack.pop()
        if level == len(shape):
            if not _is_number(x):
                return False
            continue
        if type(x) is not list or len(x) != shape[level] or not budget.take(len(x)):
            return False
        stack.extend((y, level + 1) for y in x)
    return True


def valid_encoded(data, budget: _Budget | None = None, depth: int = 0) -> bool:
    """Is ``data`` exactly what ``compare.encode`` produces (bounded in size and depth)?"""
    budget = budget or _Budget(2 * MAX_ELEMENTS)
    if depth > MAX_DEPTH or type(data) is not dict or not budget.take(1):
        return False
    t = data.get("t")
    keys = set(data)
    if t == "none":
        return keys == {"t"}
    if t == "bool":
        return keys == {"t", "v"} and type(data["v"]) is bool
    if t == "num":
        return (keys in ({"t", "v"}, {"t", "v", "int"}) and _is_number(data["v"])
                and type(data.get("int", True)) is bool)
    if t == "str":
        return keys == {"t", "v"} and type(data["v"]) is str and len(data["v"]) <= 10_000
    if t == "other":
        return keys == {"t", "type"} and type(data["type"]) is str and len(data["type"]) <= 300
    if t == "list":
        v = data.get("v")
        return (keys == {"t", "v"} and type(v) is list and len(v) <= MAX_ELEMENTS
                and all(valid_encoded(x, budget, depth + 1) for x in v))
    if t == "array":
        shape = data.get("shape")
        if (keys != {"t", "lib", "shape", "v"} or data["lib"] not in ("numpy", "torch")
                or type(shape) is not list or len(shape) > 32
                or not all(type(s) is int and 0 <= s <= MAX_ELEMENTS for s in shape)
                or math.prod(shape) > MAX_ELEMENTS):
            return False
        return _valid_nested(data["v"], shape, budget)
    return False


def _valid_result(r) -> bool:
    if type(r) is not dict or len(r) != 1:
        return False
    if "error" in r:
        return type(r["error"]) is str
    return "value" in r and valid_encoded(r["value"])


class Reader:
    """Splits the result pipe's bytes into validated events for one plan."""

    def __init__(self, n_cells: int, questions: list[dict]) -> None:
        self.n_cells = n_cells
        self.questions = {q["id"]: q for q in questions}
        self.buf = bytearray()
        self.total = 0
        self.rejected = 0
        self.skipping = False          # inside an over-long line: drop until its end
        self.overflow = False

    def feed(self, data: bytes) -> list[dict]:
        """Events completed by ``data``; malformed lines are dropped (``rejected`` counts them)."""
        self.total += len(data)
        if self.total > MAX_TOTAL_BYTES:
            self.overflow = True
            return []
        events = []
        self.buf += data
        while True:
            nl = self.buf.find(b"\n")
            if nl < 0:
                if len(self.buf) > MAX_LINE_BYTES:
                    self.buf.clear()
                    self.skipping = True
                    self.rejected += 1
                break
            line = bytes(self.buf[:nl])
            del self.buf[: nl + 1]
            if self.skipping:
                self.skipping = False
                continue
            if not line.strip():
                continue
            event = self.parse(line)
            if event is None:
                self.rejected += 1
            else:
                events.append(event)
        return events

    def parse(self, line: bytes) -> dict | None:
        if len(line) > MAX_LINE_BYTES:
            return None
        try:
            ev = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError, MemoryError):
            return None
        return ev if self.valid(ev) else None

    def valid(self, ev) -> bool:
        if type(ev) is not dict:
            return False
        kind, keys = ev.get("ev"), set(ev)
        q = self.questions.get(ev.get("q")) if type(ev.get("q")) is str else None
        if kind == "cell":
            i = ev.get("i")
            if type(i) is not int or not 0 <= i < self.n_cells:
                return False
            if ev.get("t") == "start":
                return keys == {"ev", "i", "t"}
            return (ev.get("t") == "end" and keys in ({"ev", "i", "t", "ok"}, {"ev", "i", "t", "ok", "error"})
                    and type(ev["ok"]) is bool and type(ev.get("error", "")) is str)
        if kind == "q":
            return q is not None and keys == {"ev", "q", "t"} and ev["t"] in ("start", "end")
        if kind == "call":
            j = ev.get("j")
            return (q is not None and keys == {"ev", "q", "j"} and type(j) is int
                    and 0 <= j < max(1, len(q["cases"])))
        if kind == "case":
            j = ev.get("j")
            return (q is not None and q["kind"] == "function" and keys == {"ev", "q", "j", "r"}
                    and type(j) is int and 0 <= j < len(q["cases"]) and _valid_result(ev["r"]))
        if kind == "value":
            return (q is not None and q["kind"] != "function" and keys == {"ev", "q", "r"}
                    and _valid_result(ev["r"]))
        if kind == "missing":
            return q is not None and keys == {"ev", "q", "why"} and type(ev["why"]) is str
        if kind == "note":
            return keys == {"ev", "text"} and type(ev["text"]) is str
        if kind == "done":
            return keys == {"ev"}
        return False
