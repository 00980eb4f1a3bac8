"""The Chinese edition's catalogues and build (issue 27).

    python tools/i18n.py extract     # the English messages of every page -> _build/gettext/*.pot
    python tools/i18n.py update      # merge them into locales/zh_CN/LC_MESSAGES/*.po (make catalogues)
    python tools/i18n.py status      # per page: translated / total messages
    python tools/i18n.py build       # the Chinese edition -> _build/html/zh (make book runs it)
    python tools/i18n.py export PAGE FILE   # a page's messages as plain text blocks, for translating
    python tools/i18n.py import PAGE FILE   # those blocks, translated, back into the page's catalogue
    python tools/i18n.py check       # fails if any English message of the book has no translation
    python tools/i18n.py terms [--fix]   # the term table (locales/zh_CN/terms.tsv): list / rewrite rejected variants
    python tools/i18n.py headers     # the English build's table headers -> locales/zh_CN/interface.po

``extract`` runs Sphinx's gettext builder over the book with the same configuration as the
HTML build (the notebooks' outputs come from the jupyter-cache, so glued figures and their
captions are there). ``update`` keeps every existing translation; a message whose English
changed becomes fuzzy (Babel's fuzzy matching keeps the old translation as a starting point),
and a fuzzy or empty message counts as untranslated for the tests and the page's note. A
message with nothing to translate (a display equation, a lone role or code span) is filled
with itself. ``build`` is the English build with ``language=zh_CN``, its own doctrees, into
``_build/html/zh``.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGUAGE = "zh_CN"
POT_DIR = ROOT / "_build" / "gettext"
LOCALE_DIR = ROOT / "locales" / LANGUAGE / "LC_MESSAGES"
ZH_HTML = ROOT / "_build" / "html" / "zh"

# what needs no translation: math, MyST roles with their argument, code spans, URLs
_NO_TEXT = [re.compile(p, re.S) for p in (
    r"\$\$.*?\$\$", r"\$[^$]*\$", r"\\begin\{(\w+\*?)\}.*?\\end\{\1\}", r"\{[\w:-]+\}`[^`]*`", r"``[^`]*``",
    r"`[^`]*`", r"https?://\S+")]


def is_math_block(msgid: str) -> bool:
    """A display equation (``$$...$$`` or ``\\begin{...}`` on lines of its own): Sphinx extracts
    its TeX, starting with a newline. Sphinx's locale transform re-parses a *changed* literal
    or math node as reStructuredText ("::" and an indented block), which MyST does not read: the
    page would show "::" instead of the equation. So its translation must be the TeX itself,
    byte for byte (Sphinx then leaves the node alone)."""
    return msgid.startswith("\n") and "$" not in msgid


def needs_translation(msgid: str) -> bool:
    """False for a message that has no words of prose: only math (inline, display or an
    environment), roles, code or links, digits and punctuation. Such a message is its own
    translation. A bare display equation is extracted by Sphinx without its dollars, so a
    message made of TeX commands and symbols only also counts as math."""
    text = msgid
    for pattern in _NO_TEXT:
        text = pattern.sub(" ", text)
    if re.fullmatch(r"[\s\W\d_]*", text):
        return False
    if "\\" in msgid and not re.search(r"(?<![\\\w])[A-Za-z]{4,}(?![\w{])", re.sub(r"\\[A-Za-z]+", " ", msgid)):
        return False          # TeX: every word is a command (\mathrm, \frac) or a one- to three-letter symbol
    return True


def _sphinx(outdir: Path, builder: str, doctrees: str, overrides: dict | None = None, **kwargs) -> None:
    """One Sphinx build of the book as `jupyter-book build` makes it (its config, its toc)."""
    from jupyter_book.sphinx import build_sphinx

    confoverrides = {"external_toc_path": str(ROOT / "_toc.yml"), "latex_individualpages": False,
                     **(overrides or {})}
    result = build_sphinx(ROOT, outdir, noconfig=True, path_config=str(ROOT / "_config.yml"),
                          confoverrides=confoverrides, builder=builder,
                          doctreedir=str(ROOT / "_build" / doctrees), **kwargs)
    if result:
        raise SystemExit(f"the {builder} build into {outdir} failed")


def extract(overrides: dict | None = None) -> None:
    _sphinx(POT_DIR, "gettext", ".doctrees-gettext", overrides, quiet=True)


def untranslated(pot_dir: Path = POT_DIR) -> dict[str, list[str]]:
    """Per page, the English messages of the templates in ``pot_dir`` that its catalogue does
    not translate (missing, empty or fuzzy; a message with nothing to translate counts as
    translated). A paragraph changed in a notebook and not yet translated shows up here."""
    out: dict[str, list[str]] = {}
    for template_path in sorted(pot_dir.rglob("*.pot")):
        page = str(template_path.relative_to(pot_dir).with_suffix(""))
        po_path = LOCALE_DIR / f"{page}.po"
        done = {}
        if po_path.is_file():
            done = {m.id: m for m in _read(po_path) if m.id}
        missing = [m.id for m in _read(template_path) if m.id and needs_translation(m.id)
                   and (m.id not in done or not done[m.id].string or done[m.id].fuzzy)]
        if missing:
            out[page] = missing
    return out


def check() -> int:
    """Extract the English messages afresh (into ``_build/gettext-check``, the notebooks' outputs
    from the jupyter-cache) and list every one that no catalogue translates. Returns the count."""
    pot_dir = ROOT / "_build" / "gettext-check"
    _sphinx(pot_dir, "gettext", ".doctrees-gettext-check", None, quiet=True)
    missing = untranslated(pot_dir)
    for page, ids in missing.items():
        for msgid in ids:
            first = msgid.splitlines()[0]
            print(f"{page}: untranslated: {first[:100]}{'...' if len(first) > 100 else ''}")
    n = sum(map(len, missing.values()))
    print(f"{n} English message(s) without a Chinese translation"
          + ("" if not n else ": run `tools/i18n.py extract`, `update`, then translate them "
             "(`export` / `import`)"))
    return n


def _read(path: Path):
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        return read_po(f, locale=LANGUAGE)


def _write(catalog, path: Path) -> None:
    from babel.messages.pofile import write_po

    for message in catalog:          # Babel guesses Python format flags from braces: not ours
        message.flags.discard("python-format")
        message.flags.discard("python-brace-format")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=0, omit_header=False, sort_output=False, include_previous=False)


def update() -> list[Path]:
    """Merge every template into its catalogue (created when missing). Returns the paths."""
    from babel.messages.catalog import Catalog

    if not POT_DIR.is_dir():
        raise SystemExit(f"{POT_DIR}: no templates; run `python tools/i18n.py extract` first")
    written = []
    templates = sorted(POT_DIR.rglob("*.pot"))
    keep = {t.relative_to(POT_DIR).with_suffix(".po") for t in templates}
    for template_path in templates:
        rel = template_path.relative_to(POT_DIR).with_suffix(".po")
        template = _read(template_path)
        po_path = LOCALE_DIR / rel
        if po_path.is_file():
            catalog = _read(po_path)
            catalog.update(template, no_fuzzy_matching=False, update_header_comment=False)
            catalog.obsolete.clear()
        else:
            catalog = Catalog(locale=LANGUAGE, project="KL in RL", fuzzy=False)
            for message in template:
                if message.id:
                    catalog.add(message.id, "", locations=message.locations)
        for message in catalog:
            if message.id and (is_math_block(message.id) or not needs_translation(message.id)
                               and (not message.string or message.fuzzy)):
                message.string, message.flags = message.id, set()
        _write(catalog, po_path)
        written.append(po_path)
    for stale in LOCALE_DIR.rglob("*.po"):
        if stale.relative_to(LOCALE_DIR) not in keep:
            print(f"note: {stale.relative_to(ROOT)} has no page any more (left in place)")
    return written


# ---------------------------------------------------------------- translating by hand
# A page's messages as plain text, no escaping: each block is
#     ##### N
#     <the English message, verbatim>
#     ----- zh
#     <its translation (empty: not translated yet)>
BLOCK = re.compile(r"^##### (\d+)\n(.*?)\n----- zh\n(.*?)(?=\n##### \d+\n|\Z)", re.S | re.M)

# what a translation must keep exactly: math, glued numbers, references, code
_KEEP = [("display math", re.compile(r"\$\$.*?\$\$", re.S)), ("math", re.compile(r"(?<!\$)\$(?!\$)[^$]+?\$")),
         ("role", re.compile(r"\{(glue|glue:text|glue:md|eq|numref|ref|doc|cite|cite:p|cite:t|download|prf:ref)\}`[^`]*`")),
         ("code", re.compile(r"(?<![`}])`[^`]+`"))]
_TERM = re.compile(r"\{term\}`([^`]*)`")
_REPO = re.compile(r"\{klbook-repo\}`[^`]*`")
_TITLED = re.compile(r"\{(doc|ref|prf:ref)\}`[^`<]*<([^<>`]+)>`")


def kept_parts(text: str) -> list[tuple[str, str]]:
    """The pieces of a message that its translation must contain unchanged: math, the roles
    that glue numbers or point somewhere, code spans, and each {term} role's target (its
    title may be translated: {term}`反向 KL <reverse KL>`)."""
    # a {term} role is neither code nor another role; the repository link's title is prose
    parts = [("role", "{klbook-repo}") for _ in _REPO.finditer(text)]
    # a cross-reference with a title ({prf:ref}`never negative <thm-01-gibbs>`): the title is prose
    parts += [("role", f"{{{m.group(1)}}}`<{m.group(2).strip()}>`") for m in _TITLED.finditer(text)]
    rest = _TITLED.sub(" ", _REPO.sub(" ", _TERM.sub(" ", text)))
    for kind, pattern in _KEEP:
        parts += [(kind, m.group(0)) for m in pattern.finditer(rest)]
        rest = pattern.sub(" ", rest)
    for m in _TERM.finditer(text):
        target = re.search(r"<([^<>]*)>\s*$", m.group(1))
        parts.append(("term", (target.group(1) if target else m.group(1)).strip()))
    return sorted(parts)


def check_translation(msgid: str, msgstr: str) -> list[str]:
    """What a translation lost or changed, as readable problems (empty: fine)."""
    if not msgstr:
        return []
    want, got = kept_parts(msgid), kept_parts(msgstr)
    problems = []
    for part in want:
        if part in got:
            got.remove(part)
        else:
            problems.append(f"missing {part[0]} {part[1]!r}")
    problems += [f"extra {kind} {text!r}" for kind, text in got]
    if msgid.count("\n") == 0 and "\n" in msgstr.strip("\n") and "$$" not in msgid:
        problems.append("a one-line message translated over several lines")
    return problems


def _page_po(page: str) -> Path:
    page = page.removesuffix(".po").removesuffix(".ipynb").removesuffix(".md")
    path = LOCALE_DIR / f"{page}.po"
    if not path.is_file():
        raise SystemExit(f"page: no catalogue {path.relative_to(ROOT)} (run extract and update first)")
    return path


def export_page(page: str, out: Path) -> int:
    catalog = _read(_page_po(page))
    blocks = []
    for n, message in enumerate(m for m in catalog if m.id):
        string = "" if message.fuzzy else message.string
        blocks.append(f"##### {n}\n{message.id}\n----- zh\n{string}")
    out.write_text("\n".join(blocks) + "\n", encoding="utf-8")
    return len(blocks)


def import_page(page: str, src: Path) -> tuple[int, list[str]]:
    """Read translated blocks back; a block whose English no longer matches the catalogue's
    message, or whose translation loses math, a glued number, a reference or code, is refused
    (listed, not written). Returns (messages translated now, problems)."""
    po_path = _page_po(page)
    catalog = _read(po_path)
    messages = [m for m in catalog if m.id]
    problems, done = [], 0
    for m in BLOCK.finditer(src.read_text(encoding="utf-8")):
        n, english, chinese = int(m.group(1)), m.group(2), m.group(3).strip("\n")
        if n >= len(messages) or messages[n].id != english:
            problems.append(f"block {n}: its English is not message {n} of {page} (export again)")
            continue
        if chinese and is_math_block(english):
            if chinese.strip() != english.strip():
                problems.append(f"block {n}: a display equation stays as it is (Sphinx cannot "
                                "translate one: it would print '::' instead); kept the English")
            chinese = english
        elif chinese.strip() == english.strip():
            chinese = english              # the same text: keep it byte for byte
        bad = check_translation(english, chinese)
        if bad:
            problems.append(f"block {n}: " + "; ".join(bad))
            continue
        if chinese:
            messages[n].string, messages[n].flags = chinese, set()
            done += 1
    _write(catalog, po_path)
    return done, problems


def status(paths: list[Path] | None = None) -> dict[str, tuple[int, int]]:
    sys.path.insert(0, str(ROOT / "_ext"))
    from klbook_i18n import translation_status

    out = {}
    for po_path in sorted(paths or LOCALE_DIR.rglob("*.po")):
        out[str(po_path.relative_to(LOCALE_DIR).with_suffix(""))] = translation_status(po_path)
    return out


def build(warningiserror: bool = True, overrides: dict | None = None, builder: str = "html",
          quiet: bool = False) -> Path:
    """The Chinese edition with Sphinx's ``builder``: ``html`` into ``_build/html/zh``, another
    (``singlehtml`` for the PDF) into ``_build/<builder>-zh``. Returns the output folder."""
    out = ZH_HTML if builder == "html" else ROOT / "_build" / f"{builder}-zh"
    # one set of parsed documents for every builder of the edition (as the English PDF reuses
    # the English HTML build's): the single-page build after the HTML one reads nothing again
    doctrees = ".doctrees-zh"
    _sphinx(out, builder, doctrees, {"language": LANGUAGE, **(overrides or {})},
            warningiserror=warningiserror, keep_going=True, quiet=quiet)
    return out


# ---------------------------------------------------------------- the term table (issue 39)
# locales/zh_CN/terms.tsv: one Chinese term per English concept. A message whose English names
# a concept must not use that concept's rejected variants; ``terms --fix`` rewrites them (the
# contextual rewrites of locales/zh_CN/terms_fixes.tsv first), so that it can be run again after
# merging branches that added translations.
TERMS_TSV = ROOT / "locales" / LANGUAGE / "terms.tsv"
TERMS_FIXES_TSV = ROOT / "locales" / LANGUAGE / "terms_fixes.tsv"
_CJK = "\u3400-\u9fff\uf900-\ufaff"
# what a term fix never touches: math, code, roles that point or glue (a titled role's title and
# a {term}'s title are prose and may be fixed), URLs, and an English gloss in full-width parentheses
_FROZEN = re.compile(
    r"\$\$.*?\$\$|(?<!\\)\$[^$]*\$|``[^`]*``|\{term\}`(?=[^`]*<)|\{(?:doc|ref|prf:ref)\}`(?=[^`<]*<[^`]*>`)"
    r"|\s*<[^<>`]*>`|\{[\w:-]+\}`[^`]*`|`[^`]*`|https?://\S+|（[A-Za-z][A-Za-z ,'/-]*）|</?[A-Za-z][^<>]*>", re.S)


class Term:
    def __init__(self, english, chinese, pinyin, en, rejected, paren, note, defined=""):
        self.english, self.chinese, self.pinyin, self.note, self.defined = english, chinese, pinyin, note, defined
        self.en = re.compile(en, re.I) if en else None
        self.rejected = [v.strip() for v in rejected.split(",") if v.strip()]
        self.paren = paren

    def __repr__(self):
        return f"Term({self.english!r}, {self.chinese!r})"


def read_terms(path: Path = TERMS_TSV) -> list[Term]:
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    header, rows = rows[0], rows[1:]
    if header != ["english", "chinese", "pinyin", "en", "rejected", "paren", "note", "defined"]:
        raise ValueError(f"{path}: the header must be english, chinese, pinyin, en, rejected, paren, note, defined")
    terms = []
    for n, row in enumerate(rows, 2):
        if len(row) != 8 or not row[1]:
            raise ValueError(f"{path}: row {n} must have 8 tab-separated columns and a Chinese term: {row!r}")
        terms.append(Term(*row))
    return terms


def read_term_fixes(path: Path = TERMS_FIXES_TSV) -> list[tuple[str, str, str]]:
    """(page or *, old, new): contextual rewrites, applied before the term-by-term ones."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            page, old, new = line.split("\t")[:3]
            out.append((page, old, new))
    return out


def _english_text(msgid: str) -> str:
    """The English words of a message a reader sees: no math, code or glued values (a {term}'s
    text and a reference's title stay)."""
    text = re.sub(r"\{term\}`([^`<]*)(?:<[^>`]*>)?`", r"\1", msgid)
    text = re.sub(r"\{(?:doc|ref|prf:ref)\}`([^`<]*)<[^>`]*>`", r"\1", text)
    for pattern in _NO_TEXT:
        text = pattern.sub(" ", text)
    return text


def _prose(msgstr: str) -> list[tuple[bool, str]]:
    """The message cut into (editable, piece): prose is editable, _FROZEN pieces are not."""
    out, at = [], 0
    for m in _FROZEN.finditer(msgstr):
        if m.start() > at:
            out.append((True, msgstr[at:m.start()]))
        out.append((False, m.group(0)))
        at = m.end()
    if at < len(msgstr):
        out.append((True, msgstr[at:]))
    return out


def _prose_text(msgstr: str) -> str:
    return " ¶ ".join(piece for editable, piece in _prose(msgstr) if editable)


def _concepts(terms: list[Term], english: str) -> list[Term]:
    return [t for t in terms if t.en and t.en.search(english)]


def term_problems(msgid: str, msgstr: str, terms: list[Term]) -> list[str]:
    """The rejected variants a translation uses. A variant is wrong where the message's English
    names the concept that rejects it and no concept whose term it is (截断 is the term for
    truncation, a rejected variant for clip): there it is right. Where both are named, the
    message must also contain the rejecting concept's own term. A term without an English
    pattern rejects its variants everywhere."""
    if not msgstr or msgstr == msgid:
        return []
    english, prose = _english_text(msgid), _prose_text(msgstr)
    present = _concepts(terms, english)
    problems = []
    for term in terms:
        if term.en is not None and term not in present:
            continue
        masked = not any(term.chinese in v for v in term.rejected)
        rest = prose.replace(term.chinese, "\0") if masked else prose
        for variant in term.rejected:
            if variant in term.chinese and variant != term.chinese:
                continue
            hits = rest.count(variant) if not variant.isascii() else len(
                re.findall(rf"(?<![A-Za-z_]){re.escape(variant)}s?(?![A-Za-z_])", rest))
            if not hits:
                continue
            owners = [t for t in present if t is not term and (t.chinese == variant or variant in t.chinese)]
            longer = [o.chinese for o in owners if o.chinese != variant]
            if longer:                  # 峰 inside 双峰 (bimodal) is that word, not a variant of 模式
                masked_rest = rest
                for word in longer:
                    masked_rest = masked_rest.replace(word, "\1")
                if variant not in masked_rest:
                    continue
                owners = [o for o in owners if o.chinese == variant]
            if owners and term.en is not None:
                if term.chinese not in prose:
                    problems.append(f"{term.english}: uses {variant} ({'/'.join(o.english for o in owners)} "
                                    f"also named) but not {term.chinese}")
            else:
                problems.append(f"{term.english}: {variant} (write {term.chinese})")
    return problems


def _replace_variant(text: str, variant: str, chinese: str) -> str:
    if variant.isascii():                  # an English word left in Chinese prose: spaces go with it
        def sub(m):
            return chinese
        text = re.sub(rf"(?:(?<=[{_CJK}，。；：、）])\s*)?(?<![A-Za-z_]){re.escape(variant)}s?(?![A-Za-z_])"
                      rf"(?:\s*(?=[{_CJK}，。；：、（]))?", sub, text)
        return text
    return text.replace(variant, chinese)


def fix_message(page: str, msgid: str, msgstr: str, terms: list[Term],
                fixes: list[tuple[str, str, str]]) -> str:
    """The translation with its term problems rewritten where the rewrite is certain: the
    contextual fixes of the page, then each rejected variant of a concept that the English names
    alone (no other concept claims the variant). Math, code and references are never touched."""
    if not msgstr or msgstr == msgid:
        return msgstr
    english = _english_text(msgid)
    present = _concepts(terms, english)
    for fix_page, old, new in fixes:        # a rewrite across math, code, a role or a gloss: on the whole message
        if fix_page in ("*", page) and old in msgstr and not any(
                editable and old in piece for editable, piece in _prose(msgstr)):
            msgstr = msgstr.replace(old, new)
    pieces = _prose(msgstr)
    out = []
    for editable, piece in pieces:
        original = piece
        if editable:
            for fix_page, old, new in fixes:
                if fix_page in ("*", page):
                    piece = piece.replace(old, new)
            for term in terms:
                if term.en is not None and term not in present:
                    continue
                for variant in sorted(term.rejected, key=len, reverse=True):     # 来源笔记 before 源笔记
                    if variant in term.chinese:
                        continue
                    owners = [t for t in present if t is not term and (t.chinese == variant or variant in t.chinese)]
                    if any(o.chinese == variant for o in owners) and term.en is not None:
                        continue            # both concepts named: only a contextual fix decides
                    longer = sorted({o.chinese for o in owners}, key=len, reverse=True)
                    for n, word in enumerate(longer):      # 双峰 keeps its 峰
                        piece = piece.replace(word, f"\x00{n}\x00")
                    piece = _replace_variant(piece, variant, term.chinese)
                    for n, word in enumerate(longer):
                        piece = piece.replace(f"\x00{n}\x00", word)
            if piece != original:       # a replaced English word leaves no space between Chinese characters
                piece = re.sub(rf"(?<=[{_CJK}])[ ]+(?=[{_CJK}])", "", piece)
        out.append(piece)
    return _chinese_quotes(out, [editable for editable, _ in pieces])


def _chinese_quotes(pieces: list[str], editable: list[bool]) -> str:
    """ASCII double quotes in the prose of a Chinese message become “ ” (in pairs, across math
    and code between them; quotes inside math, code or HTML stay)."""
    text = "".join(pieces)
    if not re.search(f"[{_CJK}]", text):
        return text
    count = sum(p.count('"') for p, e in zip(pieces, editable) if e)
    if not count or count % 2:
        return text
    opening, out = True, []
    for piece, e in zip(pieces, editable):
        if e and '"' in piece:
            chars = []
            for ch in piece:
                if ch == '"':
                    ch, opening = ("\u201c" if opening else "\u201d"), not opening
                chars.append(ch)
            piece = "".join(chars)
        out.append(piece)
    return "".join(out)


def _first_use_glosses(page_messages: list, terms: list[Term]) -> None:
    """The English term in parentheses after a term's first use on a page (a sentence, not a
    title: the message must end like a sentence); nothing when the page glosses it already."""
    for term in terms:
        if not term.paren or term.en is None:
            continue
        gloss = f"{term.chinese}（{term.paren}）"
        for message in page_messages:
            if not (message.string and message.string != message.id):
                continue
            if gloss in message.string or re.search(rf"（{re.escape(term.paren)}[^）]*）", message.string):
                break
            if not term.en.search(_english_text(message.id)) or term.chinese not in _prose_text(message.string):
                continue
            if not re.search(r"[。；：？！]\s*$|[.?!:]\s*$", message.string.strip()):
                continue
            pieces, done = _prose(message.string), False
            for i, (editable, piece) in enumerate(pieces):
                if i + 1 < len(pieces) and pieces[i + 1][1].lstrip().startswith("<"):
                    continue        # a {term}'s or a reference's title: the glossary glosses it
                if editable and not done:
                    # not inside a compound (裁剪替代目标, 模式寻求): the term ends a word here
                    m = re.search(rf"{re.escape(term.chinese)}(?=$|[^{_CJK}（(]|[的到和与或时后是在把被会也都就])", piece)
                    glossed = i + 1 < len(pieces) and pieces[i + 1][1].lstrip()[:1] in ("（", "(")
                    if m and m.end() == len(piece) and glossed:
                        m = None            # an English gloss follows already: 非对称裁剪（Clip-Higher）
                    if m:
                        pieces[i] = (True, piece[:m.end()] + f"（{term.paren}）" + piece[m.end():])
                        done = True
            if done:
                message.string = "".join(p for _, p in pieces)
                break


def terms_check(fix: bool = False, locale_dir: Path | None = None, verbose: bool = True) -> int:
    """List (and with ``fix`` rewrite) the catalogues' term problems. Returns the number left."""
    terms, fixes = read_terms(), read_term_fixes()
    # a translated table header quoted in Chinese prose (“mean KL”一列) is quoted in Chinese too,
    # so that the sentence names the column the reader sees
    fixes = fixes + [("*", f"\u201c{en}\u201d", f"\u201c{zh}\u201d") for en, zh in header_translations().items()]
    left = 0
    locale_dir = locale_dir or LOCALE_DIR
    for po_path in sorted(locale_dir.rglob("*.po")):
        page = str(po_path.relative_to(locale_dir).with_suffix(""))
        catalog = _read(po_path)
        messages = [m for m in catalog if m.id]
        changed = False
        if fix:
            for message in messages:
                new = fix_message(page, message.id, message.string, terms, fixes)
                if new != message.string and not check_translation(message.id, new):
                    message.string, changed = new, True
            before = [m.string for m in messages]
            _first_use_glosses(messages, terms)
            changed = changed or before != [m.string for m in messages]
            if changed:
                _write(catalog, po_path)
        for message in messages:
            for problem in term_problems(message.id, message.string, terms):
                left += 1
                if verbose:
                    print(f"{page}: {problem}: {message.string[:90]!r}")
    if verbose:
        print(f"{left} term problem(s)")
    return left


# ---------------------------------------------------------------- generated tables' headers (issue 39)
INTERFACE_PO = ROOT / "locales" / LANGUAGE / "interface.po"


def table_headers(html_dir: Path) -> dict[str, list[str]]:
    """The column and row headers of the tables that code cells print (``klbook_lib.display.table``:
    a ``<th>`` inside a cell's output) on the English pages of ``html_dir``: header -> pages."""
    from bs4 import BeautifulSoup

    out: dict[str, list[str]] = {}
    for page in sorted(html_dir.rglob("*.html")):
        rel = page.relative_to(html_dir).as_posix()
        if rel.startswith(("zh/", "_")):
            continue
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        for th in soup.select(".cell_output th"):
            text = th.get_text().strip()
            if text and needs_translation(text) and not re.fullmatch(r"[\d\W_.eE+-]+", text):
                out.setdefault(text, [])
                if rel not in out[text]:
                    out[text].append(rel)
    return out


def header_translations() -> dict[str, str]:
    """English -> Chinese of the generated tables' headers (interface.po's messages marked
    "table header")."""
    if not INTERFACE_PO.is_file():
        return {}
    return {m.id: m.string for m in _read(INTERFACE_PO) if m.id and m.string and not m.fuzzy
            and any(c.startswith("table header") for c in m.auto_comments)}


def update_headers(html_dir: Path) -> int:
    """Add each table header of the English build that ``interface.po`` lacks (empty, to
    translate); returns how many headers have no translation."""
    from babel.messages.catalog import Catalog

    catalog = _read(INTERFACE_PO) if INTERFACE_PO.is_file() else Catalog(locale=LANGUAGE)
    for header, pages in table_headers(html_dir).items():
        if header not in catalog:
            catalog.add(header, "", auto_comments=["table header: " + ", ".join(pages[:3])])
    _write(catalog, INTERFACE_PO)
    return sum(1 for m in catalog if m.id and not m.string)


# ---------------------------------------------------------------- the 中英术语对照表 (issue 39)
GLOSSARY_MD = ROOT / "glossary.md"
TERMS_BEGIN = "<!-- the term table: generated by `tools/i18n.py terms --page` from locales/zh_CN/terms.tsv -->"
TERMS_END = "<!-- end of the term table -->"
_TONES = {"a": "āáǎà", "e": "ēéěè", "i": "īíǐì", "o": "ōóǒò", "u": "ūúǔù", "ü": "ǖǘǚǜ"}


def pinyin_marks(numbered: str) -> str:
    """``cai2 jian3`` -> ``cái jiǎn`` (the tone on a, e or the o of ou, else the last vowel)."""
    out = []
    for syllable in numbered.replace("v", "ü").split():
        m = re.fullmatch(r"([a-zü]+)([1-5])", syllable)
        if not m:
            out.append(syllable)
            continue
        letters, tone = m.group(1), int(m.group(2))
        if tone == 5:
            out.append(letters)
            continue
        at = next((letters.index(v) for v in "ae" if v in letters), None)
        if at is None:
            at = letters.index("o") if "ou" in letters else max(i for i, c in enumerate(letters) if c in _TONES)
        out.append(letters[:at] + _TONES[letters[at]][tone - 1] + letters[at + 1:])
    return " ".join(out).strip()


def terms_page_rows(terms: list[Term] | None = None) -> list[tuple[str, str, str]]:
    """(Chinese, pinyin, English) for every term, ordered by pinyin (tone numbers break ties)."""
    terms = terms or read_terms()
    # syllable by syllable, as a dictionary orders them (分 fen, 分离 fen li, 峰 feng), tones breaking ties
    rows = sorted(terms, key=lambda t: ([re.sub(r"\d", "", s) for s in t.pinyin.lower().split()], t.pinyin))
    return [(t.chinese, pinyin_marks(t.pinyin), t.english) for t in rows]


def terms_page_markdown() -> str:
    lines = [TERMS_BEGIN, "", "(terms-zh)=", "## 中英术语对照表 (Chinese-English terms)", "",
             "The Chinese edition uses one Chinese term per concept; this table (ordered by pinyin) is "
             "the one `tests/test_i18n_terms.py` enforces on every translation.", "",
             "| 中文 | Pinyin | English |", "|---|---|---|"]
    lines += [f"| {zh} | {py} | {en} |" for zh, py, en in terms_page_rows()]
    return "\n".join(lines + ["", TERMS_END]) + "\n"


TERMS_PAGE_ZH = {
    "中英术语对照表 (Chinese-English terms)": "中英术语对照表",
    "The Chinese edition uses one Chinese term per concept; this table (ordered by pinyin) is the one "
    "`tests/test_i18n_terms.py` enforces on every translation.":
        "中文版每个概念只用一个中文术语；下表按拼音排序，`tests/test_i18n_terms.py` 用它检查每一条译文。",
    "中文": "中文", "Pinyin": "拼音", "English": "英文",
}


def write_terms_page() -> None:
    """Put the table at the end of glossary.md (replacing the previous one) and its messages,
    translated, into the glossary's catalogue (the cells are kept as they are)."""
    text = GLOSSARY_MD.read_text(encoding="utf-8")
    if TERMS_BEGIN in text:
        head, rest = text.split(TERMS_BEGIN, 1)
        text = head + terms_page_markdown() + rest.split(TERMS_END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + terms_page_markdown()
    GLOSSARY_MD.write_text(text, encoding="utf-8")
    po = LOCALE_DIR / "glossary.po"
    catalog = _read(po)
    wanted = dict(TERMS_PAGE_ZH)
    for zh, py, en in terms_page_rows():
        wanted.update({zh: zh, py: py, en: en})
    for msgid, msgstr in wanted.items():
        if not needs_translation(msgid):
            continue
        message = catalog.get(msgid)
        if message is None:
            catalog.add(msgid, msgstr, locations=[("../../glossary.md", 0)])
        elif not message.string or message.fuzzy:
            message.string, message.flags = msgstr, set()
    _write(catalog, po)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["extract", "update", "status", "build", "export", "import", "check", "terms", "headers"])
    parser.add_argument("page", nargs="?", help="export/import: the page, e.g. chapters/01_kl_definition")
    parser.add_argument("file", nargs="?", type=Path, help="export/import: the text file of blocks")
    parser.add_argument("--no-W", action="store_true", help="build: warnings are not errors")
    parser.add_argument("--no-execute", action="store_true",
                        help="extract: read the notebooks without executing any (glued figures' "
                             "captions missing where the jupyter-cache has no run)")
    parser.add_argument("--fix", action="store_true", help="terms: rewrite the rejected variants (terms.tsv)")
    parser.add_argument("--page", action="store_true",
                        help="terms: write the 中英术语对照表 at the end of glossary.md (and its messages)")
    args = parser.parse_args(argv)
    if args.command == "headers":
        left = update_headers(ROOT / "_build" / "html")
        print(f"{left} table header(s) in {INTERFACE_PO.relative_to(ROOT)} without a translation")
        return
    if args.command == "terms" and args.page:
        write_terms_page()
        print(f"the term table -> {GLOSSARY_MD.relative_to(ROOT)}")
    if args.command == "terms":
        sys.exit(1 if terms_check(fix=args.fix) else 0)
    if args.command == "check":
        sys.exit(1 if check() else 0)
    if args.command == "extract":
        extract({"nb_execution_mode": "off"} if args.no_execute else None)
    elif args.command == "update":
        update()
        args.command = "status"
    elif args.command in ("export", "import"):
        if not args.page or not args.file:
            raise SystemExit(f"{args.command}: give a PAGE and a FILE")
        if args.command == "export":
            print(f"{export_page(args.page, args.file)} messages -> {args.file}")
        else:
            done, problems = import_page(args.page, args.file)
            print(f"{done} translations written to {_page_po(args.page).relative_to(ROOT)}")
            for problem in problems:
                print("  refused:", problem)
            if problems:
                raise SystemExit(1)
    elif args.command == "build":
        build(not args.no_W)
        print(f"The Chinese edition is built: {ZH_HTML / 'index.html'}")
    if args.command == "status":
        counts = status()
        for page, (done, total) in counts.items():
            print(f"{done:4d} / {total:4d}  {page}")
        done, total = (sum(c[i] for c in counts.values()) for i in (0, 1))
        print(f"{done:4d} / {total:4d}  in all ({100 * done / max(total, 1):.1f} %)")


if __name__ == "__main__":
    main()
