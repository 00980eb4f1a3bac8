"""The term table of the Chinese edition (issue 39): locales/zh_CN/terms.tsv gives one Chinese
term per English concept, and no translated message may use a concept's rejected variant where
its English names that concept (tools/i18n.py terms; ``terms --fix`` rewrites them).

The rule is checked on made-up messages with a known answer (clip 裁剪 against truncation 截断,
where a message naming both keeps 截断 for the truncation), a planted variant is caught, the fixer
leaves math, code and references alone, and then every catalogue of the book is checked.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("klbook_tools_i18n_terms", REPO / "tools" / "i18n.py")
i18n = importlib.util.module_from_spec(spec)
spec.loader.exec_module(i18n)

TERMS = i18n.read_terms()
BY_EN = {t.english.split(" (")[0]: t for t in TERMS}


def test_the_table_gives_one_term_per_concept_and_keeps_clip_and_truncation_apart():
    chinese = [t.chinese for t in TERMS]
    assert len(chinese) == len(set(chinese)), "two concepts share a Chinese term"
    assert BY_EN["clip"].chinese == "裁剪" and "截断" in BY_EN["clip"].rejected
    assert BY_EN["truncation"].chinese == "截断" and "裁剪" in BY_EN["truncation"].rejected
    assert BY_EN["clamp"].chinese not in ("裁剪", "截断")
    for term in TERMS:       # no term rejects itself, and every term is readable pinyin for the page order
        assert term.chinese not in term.rejected and term.pinyin


@pytest.mark.parametrize("msgid, msgstr, bad", [
    ("PPO clips the ratio.", "PPO 对比率进行截断。", True),                     # clip written 截断
    ("PPO clips the ratio.", "PPO 对比率进行裁剪。", False),
    ("Truncated importance sampling caps the weight.", "截断重要性采样给权重设上限。", False),
    ("Truncated importance sampling caps the weight.", "裁剪重要性采样给权重设上限。", True),
    # both named: 截断 is right for the truncation, but the clip needs its own term
    ("Ratio clipping is not truncated importance sampling.", "比率截断不是截断重要性采样。", True),
    ("Ratio clipping is not truncated importance sampling.", "比率裁剪不是截断重要性采样。", False),
    ("Clamp the log-ratio before exp.", "在 exp 之前截断对数比率。", True),
    ("Clamp the log-ratio before exp.", "在 exp 之前钳制对数比率。", False),
    ("It earns two points.", "它得两个学分。", True),                           # rejected everywhere
    ("It earns two points.", "它得 2 分。", False),
    ("Train for three epochs.", "训练三个 epoch。", True),
    ("Train for three epochs.", "训练三轮（epoch）。", False),                   # the gloss is allowed
    ("The mode of the data.", "数据的众数。", True),
    ("The peak of the curve.", "曲线的峰。", False),                           # 峰 is the term for a peak
    ("Write `torch.clamp`.", "写 `torch.clamp`。", False),                     # code is not prose
])
def test_a_rejected_variant_is_found_where_the_english_names_the_concept(msgid, msgstr, bad):
    assert bool(i18n.term_problems(msgid, msgstr, TERMS)) is bad


def test_the_fixer_rewrites_by_concept_and_leaves_math_code_and_targets_alone():
    fix = lambda en, zh: i18n.fix_message("p", en, zh, TERMS, [])       # noqa: E731
    assert fix("PPO clips the ratio.", "PPO 对比率进行截断。") == "PPO 对比率进行裁剪。"
    # both concepts named: the fixer cannot know which 截断 is which and leaves it (the test then flags it)
    both = "比率截断不是截断重要性采样。"
    assert fix("Ratio clipping is not truncated importance sampling.", both) == both
    # a {term} keeps its target, math and code stay
    en = "The {term}`clipped surrogate objective` uses $\\mathrm{clip}$ and `clip_ratio`."
    zh = "{term}`截断替代目标 <clipped surrogate objective>`使用 $\\mathrm{clip}$ 与 `clip_ratio`。"
    fixed = fix(en, zh)
    assert fixed == "{term}`裁剪替代目标 <clipped surrogate objective>`使用 $\\mathrm{clip}$ 与 `clip_ratio`。"
    assert i18n.check_translation(en, fixed) == []
    # an English word leaves no stray space between Chinese characters
    assert fix("It is a detached reward.", "它是一个 detach 的奖励。") == "它是一个分离梯度的奖励。"
    # the measure word goes with the contextual rewrites of terms_fixes.tsv (三个 epoch -> 三轮)
    fixes = i18n.read_term_fixes()
    assert i18n.fix_message("p", "Three epochs per batch.", "每个批次三个 epoch 的更新。", TERMS, fixes) == "每个批次三轮的更新。"


def test_a_variant_planted_in_a_copy_of_the_catalogues_fails_the_check(tmp_path, monkeypatch):
    loc = tmp_path / "LC_MESSAGES"
    shutil.copytree(i18n.LOCALE_DIR, loc)
    assert i18n.terms_check(locale_dir=loc, verbose=False) == 0
    po = loc / "chapters" / "03_trpo_ppo.po"
    catalog = i18n._read(po)
    victim = next(m for m in catalog if m.id and "clipping" in m.id and "裁剪" in m.string
                  and "truncat" not in m.id)
    victim.string = victim.string.replace("裁剪", "截断", 1)
    i18n._write(catalog, po)
    assert i18n.terms_check(locale_dir=loc, verbose=False) >= 1
    assert i18n.terms_check(fix=True, locale_dir=loc, verbose=False) == 0        # and the fixer repairs it


def test_no_catalogue_uses_a_rejected_variant():
    problems = []
    for po in sorted(i18n.LOCALE_DIR.rglob("*.po")):
        for m in i18n._read(po):
            if m.id:
                problems += [f"{po.stem}: {p}: {m.string[:60]!r}" for p in i18n.term_problems(m.id, m.string, TERMS)]
    assert not problems, "\n".join(problems[:30]) + "\n(run `tools/i18n.py terms --fix`)"


def test_each_page_glosses_the_english_of_a_term_at_its_first_use():
    # terms.tsv's paren column: the first sentence of a page using 裁剪 for "clip" adds （clipping）
    page = "chapters/03_trpo_ppo"
    catalog = [m for m in i18n._read(i18n.LOCALE_DIR / f"{page}.po") if m.id]
    clip = BY_EN["clip"]
    uses = [m for m in catalog if m.string and clip.en.search(i18n._english_text(m.id)) and "裁剪" in m.string]
    assert uses and any("裁剪（clipping）" in m.string for m in uses)


def test_chinese_prose_has_chinese_quotes():
    # the editor's pass (issue 39): “ ” in Chinese sentences; quotes inside math, code or HTML stay
    fixed = i18n.fix_message("p", 'Say "no".', '说"不"，而 `a="b"` 与 <a href="x">链接</a> 不变。', TERMS, [])
    assert fixed == '说“不”，而 `a="b"` 与 <a href="x">链接</a> 不变。'
    left = []
    for po in sorted(i18n.LOCALE_DIR.rglob("*.po")):
        for m in i18n._read(po):
            if m.id and m.string and m.string != m.id:
                prose = re.sub(r"</?[A-Za-z][^<>]*>", "", i18n._prose_text(m.string))
                if '"' in prose and re.search(r"[\u4e00-\u9fff]", prose):
                    left.append(f"{po.stem}: {m.string[:60]!r}")
    assert not left, left


def test_pinyin_with_tone_marks():
    assert i18n.pinyin_marks("cai2 jian3") == "cái jiǎn"
    assert i18n.pinyin_marks("ce4 lüe4 ti1 du4") == "cè lüè tī dù"
    assert i18n.pinyin_marks("xiu1 gou3 hui2") == "xiū gǒu huí"


def test_the_glossary_carries_the_term_table_in_pinyin_order():
    # glossary.md ends with the 中英术语对照表 that `tools/i18n.py terms --page` writes from terms.tsv
    text = (REPO / "glossary.md").read_text(encoding="utf-8")
    assert i18n.terms_page_markdown() in text, "run `tools/i18n.py terms --page`"
    rows = i18n.terms_page_rows()
    assert len(rows) == len(TERMS)
    keys = [[s.rstrip("12345") for s in t.pinyin.lower().split()] for t in TERMS]
    assert [r[0] for r in rows] == [t.chinese for _, t in sorted(zip(keys, TERMS), key=lambda kt: (kt[0], kt[1].pinyin))]
    assert rows.index(("分", "fēn", "points (of a grade)")) < [r[0] for r in rows].index("分离梯度") < [r[0] for r in rows].index("峰")
    # and the Chinese glossary translates its messages
    catalog = {m.id: m.string for m in i18n._read(i18n.LOCALE_DIR / "glossary.po") if m.id}
    assert catalog["中英术语对照表 (Chinese-English terms)"] == "中英术语对照表"
    assert all(catalog.get(zh) == zh for zh, _, _ in rows)
