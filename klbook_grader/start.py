"""``klbook start ex04 [DIR]``: copy an exercise notebook out of the repository to work on.

Students should not edit ``exercises/*.ipynb`` in the book's repository: those files are
generated from the masters (``klbook make-student``), a test checks that they are up to
date, and a clone that holds a student's answers is easy to commit by mistake. ``start``
writes a fresh working copy of the student notebook into ``DIR`` (default
``~/klbook-exercises``), never inside the repository, and never over an existing file
unless ``--force`` is given. The copy's ``check()`` cells work wherever it is; grade it
with ``klbook grade DIR/exNN_....ipynb``.

``--lang zh`` writes the Chinese edition's notebook: the same cells, the text cells translated
from the page's catalogue (``locales/zh_CN/LC_MESSAGES/exercises/NAME.po``, the one the Chinese
site is built from), the code cells untouched, so it grades exactly as the English one.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from klbook_grader.student import REPO, STUDENTS

DEFAULT_DIR = Path("~") / "klbook-exercises"
LANGUAGES = ("en", "zh")
CATALOGUES = REPO / "locales" / "zh_CN" / "LC_MESSAGES" / "exercises"
_ITEM = re.compile(r"^(\s*(?:[-*+]|\d+\.)\s+)(.*)$")
_HEADING = re.compile(r"^(#{1,6}\s+)(.*)$")


class StartError(ValueError):
    """The working copy cannot be written (unknown exercise, target inside the repository...)."""


def available() -> list[str]:
    """The student notebooks of this checkout, by name (``ex04_estimating_kl``..., then the
    projects, ``project1_ppo_kl``...)."""
    return (sorted(p.stem for p in STUDENTS.glob("ex[0-9][0-9]_*.ipynb"))
            + sorted(p.stem for p in STUDENTS.glob("project[0-9]_*.ipynb")))


def resolve(exercise: str) -> str:
    """``ex04``, ``04``, ``4`` or ``ex04_estimating_kl`` -> ``ex04_estimating_kl``; ``project1``
    or ``project1_ppo_kl`` -> ``project1_ppo_kl``."""
    names = available()
    if not names:
        raise StartError(f"no student notebooks in {STUDENTS}: `klbook start` needs a clone of the "
                         "book's repository")
    text = str(exercise).strip()
    if text in names:
        return text
    m = re.fullmatch(r"project(\d)", text, re.IGNORECASE)
    if m:
        found = [n for n in names if n.startswith(f"project{m.group(1)}_")]
        if len(found) == 1:
            return found[0]
    m = re.fullmatch(r"(?:ex)?0*(\d{1,2})", text, re.IGNORECASE)
    if m:
        prefix = f"ex{int(m.group(1)):02d}_"
        found = [n for n in names if n.startswith(prefix)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:                    # two exercises share a number (ex14)
            raise StartError(f"exercise: {exercise!r} names several exercises; choose one of "
                             f"{', '.join(found)}")
    raise StartError(f"exercise: unknown exercise {exercise!r}; choose one of {', '.join(names)}")


def catalogue(name: str) -> dict[str, str]:
    """The Chinese translations of exercise ``name``'s text: English message -> Chinese."""
    from babel.messages.pofile import read_po

    path = CATALOGUES / f"{name}.po"
    if not path.is_file():
        raise StartError(f"lang: no Chinese catalogue for {name} ({path})")
    with path.open("rb") as f:
        return {m.id: m.string for m in read_po(f)
                if m.id and isinstance(m.id, str) and m.string and not m.fuzzy}


def translate_markdown(source: str, messages: dict[str, str]) -> tuple[str, int, int]:
    """``source`` (a Markdown cell) with each paragraph, heading and list item replaced by its
    translation in ``messages``, keyed as Sphinx's gettext builder extracts them (the lines of
    a block joined by spaces). Fenced blocks and display math stay as they are. Returns the new source, the
    number of blocks translated and the number of blocks with text."""
    out: list[str] = []
    done = total = 0
    block: list[str] = []
    fenced = False

    def flush() -> None:
        nonlocal done, total
        if not block:
            return
        if block[0].lstrip().startswith("$$"):          # display math: nothing to translate
            out.extend(block)
            block.clear()
            return
        units: list[tuple[str, list[str]]] = []          # (prefix, lines) of each unit
        for line in block:
            head, item = _HEADING.match(line), _ITEM.match(line)
            if head:
                units.append((head.group(1), [head.group(2)]))
                units.append(("", []))                   # what follows a heading starts afresh
            elif item:
                units.append((item.group(1), [item.group(2)]))
            elif units and units[-1][1]:
                units[-1][1].append(line)
            else:
                units.append(("", [line]))
        for prefix, lines in units:
            if not lines:
                continue
            total += 1
            key = " ".join(x.strip() for x in lines)
            if key in messages:
                done += 1
                out.append(prefix + messages[key])
            else:
                out.extend([prefix + lines[0]] + lines[1:])
        block.clear()

    for line in source.split("\n"):
        if line.strip().startswith("```"):
            flush()
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)
        elif not line.strip():
            flush()
            out.append(line)
        else:
            block.append(line)
    flush()
    return "\n".join(out), done, total


def start(exercise: str, directory: str | os.PathLike | None = None, force: bool = False,
          lang: str = "en") -> Path:
    """Write the student notebook of ``exercise`` into ``directory``; return the new file's path.

    ``lang="zh"``: its text cells in Chinese (:func:`translate_markdown`), its code unchanged."""
    if lang not in LANGUAGES:
        raise StartError(f"lang: must be one of {', '.join(LANGUAGES)}, got {lang!r}")
    name = resolve(exercise)
    target_dir = Path(directory if directory is not None else DEFAULT_DIR).expanduser().resolve()
    repo = REPO.resolve()
    if target_dir == repo or repo in target_dir.parents:
        raise StartError(f"directory: {target_dir} is inside the book's repository ({repo}); work "
                         "on a copy outside it, e.g. `klbook start ex04 ~/klbook-exercises`")
    target = target_dir / f"{name}.ipynb"
    if target.exists() and not force:
        raise StartError(f"{target} already exists (your work?); pass --force to overwrite it, or "
                         "choose another directory")
    if target_dir.exists() and not target_dir.is_dir():
        raise StartError(f"directory: {target_dir} exists and is not a directory")
    target_dir.mkdir(parents=True, exist_ok=True)
    text = (STUDENTS / f"{name}.ipynb").read_text(encoding="utf-8")
    if lang == "zh":
        messages = catalogue(name)
        nb = json.loads(text)
        for cell in nb["cells"]:
            if cell.get("cell_type") == "markdown":
                src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
                new, _, _ = translate_markdown(src, messages)
                cell["source"] = new.splitlines(keepends=True)
        nb["metadata"].setdefault("klbook", {})["lang"] = "zh"
        text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return target


def _run(args: argparse.Namespace) -> int:
    try:
        path = start(args.exercise, args.directory, force=args.force, lang=args.lang)
    except (StartError, OSError) as exc:
        print(f"klbook start: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    print(f"open it with `jupyter lab {path}`; run its check() cells as you go; "
          f"grade it with `klbook grade {path}`")
    return 0


def add_parser(subparsers) -> None:
    """Register ``klbook start`` on the CLI's subparsers."""
    s = subparsers.add_parser("start", help="copy an exercise notebook out of the repository to work on")
    s.add_argument("exercise", help="ex04, 4, ex04_estimating_kl or project1")
    s.add_argument("directory", nargs="?", default=None,
                   help=f"where to write it (default {DEFAULT_DIR}); not inside the repository")
    s.add_argument("--force", action="store_true", help="overwrite an existing copy")
    s.add_argument("--lang", choices=LANGUAGES, default="en",
                   help="zh: the text cells in Chinese (the code and the grading are the same)")
    s.set_defaults(func=_run)
