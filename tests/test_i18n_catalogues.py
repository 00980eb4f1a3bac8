"""The Chinese edition's catalogues (issue 27): tools/i18n.py and _ext/klbook_i18n.py.

What a translation must keep (math, glued numbers, references, code) is checked on made-up
messages with a known answer, and then on every translated message of locales/zh_CN; the
language switch's links are checked against the pages' real relative depth.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "_ext"))
import klbook_i18n  # noqa: E402

spec = importlib.util.spec_from_file_location("klbook_tools_i18n", REPO / "tools" / "i18n.py")
i18n = importlib.util.module_from_spec(spec)
spec.loader.exec_module(i18n)

CATALOGUES = sorted((REPO / "locales" / "zh_CN" / "LC_MESSAGES").rglob("*.po"))


@pytest.mark.parametrize("msgid, expected", [
    ("\nD_{\\mathrm{KL}}(P\\|Q) = \\sum_x P(x)\\log\\frac{P(x)}{Q(x)}\n", False),   # a display equation
    ("$k_3=\\rho-1-\\log\\rho$", False),
    ("{glue:text}`kl_example:.4f`", False),
    ("`kb.divergences.kl`", False),
    ("What KL divergence is", True),
    ("The KL is {glue:text}`klv:.3f` nats.", True),
    ("\n\\begin{gathered}\n\\pi(y)=1,\\\\\n\\text{with } \\lambda>0\n\\end{gathered}\n", False),
])
def test_what_needs_translation(msgid, expected):
    assert i18n.needs_translation(msgid) is expected


def test_a_translation_must_keep_math_numbers_references_and_code():
    en = ("The KL is {glue:text}`klv:.3f` nats for $P$, see {numref}`fig-01-a` and `kb.kl`; "
          "the {term}`reverse KL` of {cite}`x2020`.")
    good = ("对 $P$ 而言 KL 是 {glue:text}`klv:.3f` 奈特，见 {numref}`fig-01-a` 与 `kb.kl`；"
            "{cite}`x2020` 的{term}`反向 KL <reverse KL>`。")
    assert i18n.check_translation(en, good) == []
    assert i18n.check_translation(en, "") == []                       # not translated yet: no problem
    lost_number = good.replace("{glue:text}`klv:.3f`", "0.123")
    assert any("klv" in p for p in i18n.check_translation(en, lost_number))
    changed_math = good.replace("$P$", "$Q$")
    problems = i18n.check_translation(en, changed_math)
    assert any("'$P$'" in p for p in problems) and any("'$Q$'" in p for p in problems)
    wrong_term = good.replace("<reverse KL>", "<forward KL>")
    assert any("reverse KL" in p for p in i18n.check_translation(en, wrong_term))


def test_a_term_role_before_a_code_span_is_not_read_as_code():
    # the role's closing backtick once opened a "code span" that ran to the next backtick
    en = "Write `f(p)` for the {term}`Jensen-Shannon divergence` with $p$. Note that `g` differs."
    zh = "编写 `f(p)`，计算 $p$ 的{term}`JS 散度 <Jensen-Shannon divergence>`。注意 `g` 不同。"
    assert i18n.check_translation(en, zh) == []
    assert any("'`g`'" in p for p in i18n.check_translation(en, zh.replace("`g`", "g")))


def test_the_catalogues_exist_for_every_page_of_the_book():
    pages = {p.relative_to(REPO).with_suffix("").as_posix() for p in REPO.glob("chapters/*.ipynb")}
    have = {p.relative_to(REPO / "locales" / "zh_CN" / "LC_MESSAGES").with_suffix("").as_posix() for p in CATALOGUES}
    assert CATALOGUES and pages - {"chapters/source_notes"} <= have | {"chapters/source_notes"}, pages - have


@pytest.mark.parametrize("po", CATALOGUES, ids=lambda p: p.stem)
def test_every_translated_message_keeps_what_it_must(po):
    catalog = i18n._read(po)
    bad = [f"{m.id[:60]!r}: {problems}" for m in catalog if m.id and m.string
           for problems in [i18n.check_translation(m.id, m.string)] if problems]
    assert not bad, "\n".join(bad)


def test_translation_status_counts_fuzzy_and_empty_as_untranslated(tmp_path):
    po = tmp_path / "page.po"
    po.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                  'msgid "One"\nmsgstr "一"\n\n#, fuzzy\nmsgid "Two"\nmsgstr "二"\n\nmsgid "Three"\nmsgstr ""\n',
                  encoding="utf-8")
    assert klbook_i18n.translation_status(po) == (1, 3)
    assert klbook_i18n.translation_status(tmp_path / "missing.po") == (0, 0)


@pytest.mark.parametrize("page", ["intro", "chapters/01_kl_definition", "exercises/ex01_kl_definition"])
def test_the_switch_links_a_page_to_its_counterpart(page):
    en_dir = Path("/site")
    en_file, zh_file = en_dir / f"{page}.html", en_dir / "zh" / f"{page}.html"
    from posixpath import normpath
    to_zh = normpath((en_file.parent / klbook_i18n.counterpart(page, "en")).as_posix())
    to_en = normpath((zh_file.parent / klbook_i18n.counterpart(page, "zh_CN")).as_posix())
    assert to_zh == zh_file.as_posix() and to_en == en_file.as_posix()


def test_export_and_import_round_trip(tmp_path, monkeypatch):
    loc = tmp_path / "LC_MESSAGES"
    (loc / "chapters").mkdir(parents=True)
    po = loc / "chapters" / "p.po"
    po.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                  'msgid "What $P$ is"\nmsgstr ""\n\nmsgid "It is {glue:text}`v:.2f`."\nmsgstr ""\n',
                  encoding="utf-8")
    monkeypatch.setattr(i18n, "LOCALE_DIR", loc)
    monkeypatch.setattr(i18n, "ROOT", tmp_path)
    txt = tmp_path / "p.txt"
    assert i18n.export_page("chapters/p", txt) == 2
    text = txt.read_text(encoding="utf-8")
    text = text.replace("What $P$ is\n----- zh\n", "What $P$ is\n----- zh\n$P$ 是什么")
    text = text.replace("`v:.2f`.\n----- zh\n", "`v:.2f`.\n----- zh\n它是 0.12。")     # loses the glued number
    txt.write_text(text, encoding="utf-8")
    done, problems = i18n.import_page("chapters/p", txt)
    assert done == 1 and len(problems) == 1 and "v:.2f" in problems[0]
    assert klbook_i18n.translation_status(po) == (1, 2)


def test_a_titled_cross_reference_keeps_its_target_and_may_translate_its_title():
    en = "The KL is {prf:ref}`never negative <thm-01-gibbs>`, see {doc}`02_forward_reverse`."
    assert i18n.check_translation(en, "KL {prf:ref}`永不为负 <thm-01-gibbs>`，见 {doc}`02_forward_reverse`。") == []
    wrong = i18n.check_translation(en, "KL {prf:ref}`永不为负 <thm-01-other>`，见 {doc}`02_forward_reverse`。")
    assert any("thm-01-gibbs" in p for p in wrong)


@pytest.mark.parametrize("po", sorted(i18n.LOCALE_DIR.rglob("*.po")), ids=lambda p: p.stem)
def test_display_equations_are_kept_byte_for_byte(po):
    # Sphinx re-parses a changed math node as reStructuredText ("::" and an indented block),
    # which MyST does not read: the page would print "::" where the equation was
    changed = [m.id[:60] for m in i18n._read(po)
               if m.id and i18n.is_math_block(m.id) and m.string and m.string != m.id]
    assert not changed, changed


def test_what_counts_as_a_display_equation():
    assert i18n.is_math_block("\nD = \\sum_x p\n")                       # Sphinx's math block
    assert not i18n.is_math_block("The $x$ is small.")                       # prose with math
    assert not i18n.is_math_block("\n$$x$$ and more")                       # not a bare block
