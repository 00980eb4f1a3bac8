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


# --------------------------------------------------------------------- page conventions
# (AUTHORING.md, "Page conventions"; issue 11)

def chapter_number(path: Path) -> int:
    return int(path.name[:2])


def opening_problems(source: str, number: int) -> list[str]:
    """What the first cell of chapter ``number`` lacks: a ``# Title``, the **Overview.**
    paragraph, **Learning objectives.** with 3-5 bullets, then **Prerequisites.** with
    {doc} links to earlier chapters (chapter 1: to the notation page)."""
    problems = []
    text = source.strip()
    if not re.match(r"#\s+\S", text):
        problems.append("it does not start with a '# Title'")
    marks = {name: text.find(f"**{name}.**") for name in ("Overview", "Learning objectives", "Prerequisites")}
    for name, at in marks.items():
        if at < 0:
            problems.append(f"no **{name}.** paragraph")
    if all(at >= 0 for at in marks.values()) and not (
            marks["Overview"] < marks["Learning objectives"] < marks["Prerequisites"]):
        problems.append("the order must be Overview, Learning objectives, Prerequisites")
    if marks["Learning objectives"] >= 0:
        end = marks["Prerequisites"] if marks["Prerequisites"] > marks["Learning objectives"] else len(text)
        block = text[marks["Learning objectives"]:end]
        bullets = re.findall(r"^\s*[-*+]\s+\S", block, re.M)
        if not 3 <= len(bullets) <= 5:
            problems.append(f"Learning objectives need a list of 3-5 bullets, found {len(bullets)}")
    if marks["Prerequisites"] >= 0:
        block = text[marks["Prerequisites"]:]
        targets = re.findall(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`", block)
        earlier = [t for t in targets if re.search(r"(?:^|/)(\d\d)_", t)
                   and int(re.search(r"(?:^|/)(\d\d)_", t).group(1)) < number]
        later = [t for t in targets if re.search(r"(?:^|/)(\d\d)_", t)
                 and int(re.search(r"(?:^|/)(\d\d)_", t).group(1)) >= number]
        if number == 1:
            if not any(t.rstrip("/").endswith("notation") for t in targets):
                problems.append("chapter 1's Prerequisites must link the notation page with {doc}")
        elif not earlier:
            problems.append("Prerequisites must link at least one earlier chapter with {doc}")
        if later:
            problems.append(f"Prerequisites link this or later chapters: {later}")
    return problems


def h2_headings(markdown_sources: list[str]) -> list[tuple[str, str]]:
    """(heading, body up to the next level-2 heading) for every '## ' heading, in order."""
    text = "\n".join(markdown_sources)
    text = _FENCE.sub(" ", text)  # a '## ' inside a code fence is not a heading
    parts = re.split(r"^(##\s+[^\n]*)$", text, flags=re.M)
    return [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def summary_problems(markdown_sources: list[str]) -> list[str]:
    """A '## Summary' with bullets must come right before '## Exercises'."""
    heads = h2_headings(markdown_sources)
    names = [h for h, _ in heads]
    if "## Exercises" not in names:
        return ["no '## Exercises' section"]
    at = names.index("## Exercises")
    if at == 0 or names[at - 1] != "## Summary":
        before = names[at - 1] if at else None
        return [f"the section before '## Exercises' must be '## Summary', found {before!r}"]
    if not re.search(r"^\s*(?:[-*+]|\d+[.)])\s+\S", heads[at - 1][1], re.M):
        return ["the Summary is a list of bullets (a table alone is not a summary)"]
    return []


_DRAWS = re.compile(
    r"\bplt\.(?:subplots|figure|plot|bar|barh|hist|scatter|imshow|step|fill_between|errorbar|semilogy|loglog)\("
    r"|\.subplots\(|\bax\w*(?:\[[^\]]*\])*\.(?:plot|bar|barh|hist|scatter|imshow|step|fill_between|errorbar"
    r"|semilogy|semilogx|loglog|axhline|axvline|contour|contourf|pcolormesh)\(")


def draws_figure(code: str) -> bool:
    return bool(_DRAWS.search(code))


def hide_input_problems(nb) -> list[str]:
    """Cells that draw a figure and assert nothing must carry the 'hide-input' tag, and
    a cell that asserts (a claim's check) must not hide its code, except behind the
    check fold ('klbook-check', whose toggle reads "Show the check")."""
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        tags = set(cell.metadata.get("tags", []))
        asserts = re.search(r"^\s*assert\b", cell.source, re.M) is not None
        if draws_figure(cell.source) and not asserts and "hide-input" not in tags:
            problems.append(f"cell {i} only draws a figure: tag it 'hide-input' ({cell.source[:60]!r})")
        if asserts and tags & {"hide-input", "hide-cell", "remove-input", "remove-cell"}:
            problems.append(f"cell {i} asserts a claim: its code must stay visible, remove the hiding tag")
    return problems


# "exercise Exercise 4.3": the role already writes the word
_REF_WORDS = {"exercise": "exercise", "exercises": "exercise", "figure": "figure", "figures": "figure",
              "fig.": "figure", "figs.": "figure", "table": "table", "tables": "table",
              "theorem": "theorem", "definition": "definition", "section": "section",
              "chapter": "chapter", "equation": "equation", "eq.": "equation", "listing": "listing"}
_DOUBLED = re.compile(r"\b(" + "|".join(re.escape(w) for w in _REF_WORDS) + r")\s+("
                      + "|".join(re.escape(w) for w in _REF_WORDS) + r")\s*\(?\d", re.I)
_WORD_ROLE = re.compile(r"\b(exercises?|figures?|figs?\.|tables?|theorems?|definitions?|listing)\s+"
                        r"\{(?:numref|prf:ref)\}`", re.I)
_WORD_EXREF = re.compile(r"\b(exercises?)\s+\{ref\}`(?:[^`<]*<)?ex-", re.I)


def doubled_reference_words(text: str) -> list[str]:
    """Rendered text in which a reference word is doubled: 'exercise Exercise 4.3'."""
    out = []
    for m in _DOUBLED.finditer(text):
        if _REF_WORDS[m.group(1).lower()] == _REF_WORDS[m.group(2).lower()]:
            out.append(text[m.start():m.end() + 4].strip())
    return out


def word_before_reference_role(markdown: str) -> list[str]:
    """Markdown that writes the word a {numref}/{ref} already renders: 'exercise {numref}`ex-4-3`'."""
    text = _CODE_BLOCKS_ONLY(markdown)
    return [m.group(0) for m in list(_WORD_ROLE.finditer(text)) + list(_WORD_EXREF.finditer(text))]


def _CODE_BLOCKS_ONLY(markdown: str) -> str:  # drop fenced code, keep directives' text
    return re.sub(r"^(`{3,}|~{3,})[^\n{]*\n.*?^\1\s*$", " ", markdown, flags=re.S | re.M)


# a divergence written with a single bar: D_KL(P | Q) (MyST turns '\|' in a table into '|')
_DIV_HEAD = re.compile(
    r"(?:D_\{(?:[^{}]|\{[^{}]*\})*\}|D_\\?[A-Za-z]+|\\mathrm\{KL\}|\\operatorname\{KL\}"
    r"|\\text(?:rm)?\{KL\}|\bKL|\bD_KL)"
    r"(?:\s*\^\{(?:[^{}]|\{[^{}]*\})*\}|\s*\^\\?\w+)?"
    r"\s*(?:\\(?:left|bigl?|Bigl?|biggl?|Biggl?)\s*)?([(\[])")
_DOUBLE_BAR = re.compile(r"\\\||\\Vert|\\lVert|\\rVert|\\parallel|\|\||‖|∥")
_SINGLE_BAR = re.compile(r"(?<![\\|])\|(?!\|)|\\mid\b|\\vert\b|\\lvert\b|\\rvert\b|∣")


def single_bar_divergences(text: str) -> list[str]:
    """Divergences such as ``D_{KL}(P | Q)`` or ``KL(p|q)`` whose two arguments are
    separated by a single bar (conditioning bars inside nested brackets are fine)."""
    found = []
    for m in _DIV_HEAD.finditer(text):
        depth, top, i = 1, [], m.end()
        while i < len(text) and depth:
            ch = text[i]
            if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}()[]|":
                if depth == 1:
                    top.append(text[i:i + 2])
                i += 2
                continue
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif depth == 1:
                top.append(ch)
            i += 1
        args = "".join(top)
        if not _DOUBLE_BAR.search(args) and _SINGLE_BAR.search(args):
            found.append(text[m.start():i])
    return found
