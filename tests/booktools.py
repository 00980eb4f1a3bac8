"""Helpers the structure tests share: reading _toc.yml and the notebooks' markdown."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]


def toc_files() -> list[str]:
    """Every document named in _toc.yml, as a path without suffix, in order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    out: list[str] = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                out.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return out


def toc_notebooks() -> list[Path]:
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]


def disk_notebooks() -> list[Path]:
    return sorted(list((ROOT / "chapters").glob("*.ipynb")) + list((ROOT / "exercises").rglob("*.ipynb")))


EXCLUDED_DIRS = ("exercises/masters",)  # listed in _config.yml exclude_patterns


def markdown_cells(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "markdown"]


_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+?\$|\\\(.*?\\\)|\\\[.*?\\\]", re.S)
_FENCE = re.compile(r"^(?P<f>`{3,}|~{3,}|:{3,})(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=f)\s*$", re.S | re.M)
_VERBATIM = ("", "{math}", "{code-block}", "{code}", "{code-cell}", "{literalinclude}")


def _fence(m: re.Match) -> str:
    info = m.group("info").strip()
    directive = info.split()[0] if info else ""
    if directive in _VERBATIM or not directive.startswith("{"):
        return " "  # code or math: not prose
    # a directive (theorem, exercise, note, ...): keep its text, drop its :options:
    body = re.sub(r"^:[\w-]+:.*$", " ", m.group("body"), flags=re.M)
    return prose_only(body)
_CODE = re.compile(r"``.*?``|`[^`\n]*`", re.S)
_ROLE = re.compile(r"\{[a-zA-Z:-]+\}`[^`]*`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)|<[^>]+>|https?://\S+")
_LABEL = re.compile(r"^\([^)]*\)=\s*$", re.M)
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])|(?<![\w.])\d+(\.\d+)?\s?%")


def prose_only(markdown: str) -> str:
    """Markdown with math, code, directives, roles (glue, cite, ...) and link targets removed."""
    text = _FENCE.sub(_fence, markdown)
    text = _ROLE.sub(" ", text)
    text = _MATH.sub(" ", text)
    text = _CODE.sub(" ", text)
    text = _LINK_TARGET.sub(" ", text)
    text = _LABEL.sub(" ", text)
    return text


def hand_typed_numbers(markdown: str) -> list[str]:
    """Decimal numbers and percentages typed into prose instead of glued from code."""
    return [m.group(0) for m in DECIMAL.finditer(prose_only(markdown))]
