"""The end-to-end exercise tasks (klbook_grader.tasks) and the hooks they plug into.

* the pluggable pieces of the book's trainers (``PPOConfig.policy_loss_fn`` in
  ``klbook_lib.ppo``, ``reward_fn``/``advantage_fn`` in ``klbook_lib.rlhf.ppo``, ``loss_fn`` of
  ``klbook_lib.dpo.train_dpo``): an independent re-implementation of the built-in objective,
  plugged in, reproduces the built-in run; bad plug-ins are refused with a ValueError;
* the judges: what an untrained, malformed or fabricated result scores;
* the toy problem of the broken trainer against brute-force enumeration, the micro RLHF
  pipeline's tokenizer, scorer and determinism;
* the derive-then-verify closed forms of the reference against autograd;
* ``klbook start`` and the student-notebook generation fixes of issue 14.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from klbook_lib import ppo, seqkl
from klbook_grader import compare, student
from klbook_grader.hidden import bank
from klbook_grader.hidden import reference as R
from klbook_grader.tasks import cartpole_kl, micro_rlhf, token_trainer as tt

REPO = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)


# ---------------------------------------------------------------- klbook_lib.ppo: policy_loss_fn
def _clip_plus_kl(new_params, old_params, actions, advantages, beta, clip):
    """The built-in 'clip+kl_penalty' policy loss, written independently from the logits."""
    logp_new = torch.log_softmax(new_params[0], -1)
    logp_old = torch.log_softmax(old_params[0], -1)
    a = actions.long().unsqueeze(-1)
    ratio = (logp_new.gather(-1, a) - logp_old.gather(-1, a)).squeeze(-1).exp()
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    kl = (logp_old.exp() * (logp_old - logp_new)).sum(-1)
    return -surrogate.mean() + beta * kl.mean()


def test_policy_loss_hook_reproduces_the_builtin_objective():
    common = dict(objective="clip+kl_penalty", kl_coef=0.5, total_timesteps=2048, stop_at_return=None,
                  monitor_grad_ratio=False, seed=3)
    builtin = ppo.train(ppo.PPOConfig(**common), progress=False).history
    hooked = ppo.train(ppo.PPOConfig(policy_loss_fn=_clip_plus_kl, **common), progress=False).history
    assert len(builtin["update"]) == len(hooked["update"]) == 8
    np.testing.assert_allclose(hooked["kl_exact_mean"], builtin["kl_exact_mean"], rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(hooked["entropy"], builtin["entropy"], rtol=1e-5)
    # the hook is really called: a loss that ignores the policy leaves it where it started
    frozen = ppo.train(ppo.PPOConfig(policy_loss_fn=lambda n, o, a, adv, b, c: 0.0 * n[0].sum(), **common),
                       progress=False).history
    assert max(frozen["kl_exact_mean"]) == 0.0 < min(builtin["kl_exact_mean"])


@pytest.mark.parametrize("fn, match", [
    (3, "policy_loss_fn: must be callable"),
    (lambda n, o, a, adv, b, c: n[0].sum(-1), "scalar"),                  # one loss per state
    (lambda n, o, a, adv, b, c: n[0].detach().sum(), "no gradient"),
])
def test_policy_loss_hook_refuses_bad_plugins(fn, match):
    with pytest.raises(ValueError, match=match):
        ppo.train(ppo.PPOConfig(policy_loss_fn=fn, total_timesteps=256, stop_at_return=None), progress=False)


# ---------------------------------------------------------------- cartpole_kl
def test_rule_controller_calls_the_rule_and_keeps_beta_bounded():
    ctrl = cartpole_kl.RuleController(lambda b, kl, t: b * 10, target=0.01, beta=1.0, beta_min=0.1, beta_max=50)
    assert [ctrl.update(1.0) for _ in range(3)] == [10.0, 50.0, 50.0]
    seen = []
    ctrl = cartpole_kl.RuleController(lambda b, kl, t: seen.append((b, kl, t)) or b / 2, target=0.02)
    ctrl.update(0.005)
    assert seen == [(1.0, 0.005, 0.02)] and ctrl.value == 0.5
    for bad in (lambda *a: float("nan"), lambda *a: -1.0, lambda *a: "2", lambda *a: None):
        with pytest.raises(ValueError, match="beta rule returned"):
            cartpole_kl.RuleController(bad).update(0.01)


def test_actor_vector_round_trip_and_validation():
    agent = cartpole_kl.make_agent()
    vec = cartpole_kl.actor_vector(agent)
    back = cartpole_kl.agent_from_vector(vec)
    obs = torch.randn(5, 4)
    torch.testing.assert_close(back.dist_params(obs)[0], agent.dist_params(obs)[0])
    with pytest.raises(ValueError, match="vector: expected"):
        cartpole_kl.agent_from_vector(vec[:-1])
    with pytest.raises(ValueError, match="not all finite"):
        cartpole_kl.agent_from_vector(np.full_like(vec, np.nan))


def test_cartpole_judge_plays_the_policy_itself():
    untrained = cartpole_kl.actor_vector(cartpole_kl.make_agent())
    # a history that claims a solved run with the KL on target: the judge plays the policy itself
    fake_history = np.column_stack([np.arange(1, 51) * 256.0, np.full(50, 0.01), np.ones(50),
                                    np.full(50, 0.1), np.full(50, 500.0)])
    # (with a correct probe of the loss's KL term, so that only the played return decides)
    probe = cartpole_kl.expected_kl_probe()
    credit, msg = cartpole_kl.judge([untrained, fake_history, np.array([1.0, 12800.0]), probe], eval_seed=1)
    assert credit == 0.0 and "not solved" in msg and "counted only for a solved run" in msg
    for junk in ([untrained], "solved", [untrained[:10], fake_history, []], [untrained, np.ones(3)]):
        credit, msg = cartpole_kl.judge(junk, eval_seed=1)
        assert credit == 0.0 and "not a training result" in msg


# ---------------------------------------------------------------- token_trainer (exercise 5)
def _brute_force_objective(theta: torch.Tensor) -> tuple[float, float]:
    """E[score] and KL(pi || pi_ref) by walking every response token by token (no seqkl)."""
    sp = tt.space()
    row_of = {p: i for i, p in enumerate(sp.prefixes)}
    scores = {sp.tokens(n): float(tt.score_table()[n]) for n in range(sp.n_sequences)}
    logp = torch.log_softmax(theta / tt.TEMPERATURE, -1)
    logq = torch.log_softmax(tt.reference_logits() / tt.TEMPERATURE, -1)
    reward = kl = 0.0
    for length in range(1, tt.T + 1):
        for seq in itertools.product(range(tt.V), repeat=length):
            if any(v == tt.EOS for v in seq[:-1]) or (length < tt.T and seq[-1] != tt.EOS):
                continue                    # not a complete response
            lp = sum(float(logp[row_of[seq[:t]], v]) for t, v in enumerate(seq))
            lq = sum(float(logq[row_of[seq[:t]], v]) for t, v in enumerate(seq))
            reward += math.exp(lp) * scores[seq]
            kl += math.exp(lp) * (lp - lq)
    return reward, kl


def test_toy_problem_objective_matches_brute_force():
    theta = tt.reference_logits() + seqkl.random_logits(tt.space(), scale=0.7, seed=9)
    got = tt.objective(theta)
    reward, kl = _brute_force_objective(theta)
    assert got["reward"] == pytest.approx(reward, rel=1e-10)
    assert got["kl"] == pytest.approx(kl, rel=1e-10)
    assert got["J"] == pytest.approx(reward - tt.BETA * kl, rel=1e-10)
    assert tt.objective(tt.reference_logits())["kl"] == pytest.approx(0.0, abs=1e-12)


def test_toy_problem_optimum_is_the_maximum():
    best = tt.optimum()
    ref_logp = seqkl.sequence_logprobs(tt.space(), tt.reference_logits() / tt.TEMPERATURE)
    closed_form = tt.BETA * math.log(float((ref_logp.exp() * (tt.score_table() / tt.BETA).exp()).sum()))
    assert best["J"] == pytest.approx(closed_form, rel=1e-12)
    assert best["reward"] - tt.BETA * best["kl"] == pytest.approx(best["J"], rel=1e-10)
    for seed in range(20):          # no policy beats it
        theta = tt.reference_logits() + seqkl.random_logits(tt.space(), scale=2.0, seed=seed)
        assert tt.objective(theta)["J"] < best["J"]


def test_toy_problem_sampler_draws_from_the_tempered_policy():
    theta = tt.reference_logits()
    n = 40_000
    tokens, rows, mask = tt.sample(theta, n, torch.Generator().manual_seed(0))
    assert bool((rows[mask] == tt.space().prefix_index[tt._index(tokens, mask)][mask]).all())
    p = seqkl.sequence_logprobs(tt.space(), theta / tt.TEMPERATURE).exp().numpy()
    counts = np.bincount(tt._index(tokens, mask).numpy(), minlength=len(p))
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(counts / n - p) <= 5 * se + 1e-12)     # 5 standard errors per response


def test_token_trainer_judges_refuse_fabricated_and_frozen_runs():
    ref = tt.reference_logits()
    frozen = [torch.stack([ref] * 31), torch.full((30,), 0.05)]     # never moves, claims clipping
    assert tt.judge_trust_region(frozen)[0] == 0.0
    assert tt.judge_objective(frozen)[0] == 0.0
    for junk in ([ref], [torch.stack([ref] * 3), torch.zeros(5)], [torch.zeros(3, 4, 4), torch.zeros(2)],
                 [torch.stack([ref * np.nan] * 3), torch.zeros(2)]):
        for judge in (tt.judge_trust_region, tt.judge_objective):
            credit, msg = judge(junk)
            assert credit == 0.0 and "not a training run" in msg


def test_prepare_converts_the_graders_floats():
    args = tt.prepare("token_logprobs", [torch.zeros(40, 4), torch.ones(2, 4, dtype=torch.float64),
                                         torch.zeros(2, 4, dtype=torch.float64),
                                         torch.ones(2, 4, dtype=torch.float64), 0.7])
    assert args[1].dtype == args[2].dtype == torch.long and args[3].dtype == torch.bool


# ---------------------------------------------------------------- micro_rlhf (exercises 7 and 8)
def test_word_tokenizer_round_trips_the_corpus_and_pairs():
    from klbook_lib.rlhf import data

    tok = micro_rlhf.WordTokenizer()
    assert len(tok) < 100 and tok.words[:3] == ["<pad>", "<bos>", "<eos>"]
    for review in data.make_corpus(300, seed=4):
        assert tok.decode(tok.encode(review.response)) == review.response
        assert tok.decode(tok.encode(review.prompt)).strip() == review.prompt
    for pair in data.make_preference_pairs(100, seed=4):
        assert tok.decode(tok.encode(pair.chosen)) == pair.chosen
    with pytest.raises(ValueError, match="unknown word"):
        tok.encode("the spaceship was great")


def test_true_reward_scorer_scores_the_response_only():
    from klbook_lib.rlhf import data
    from klbook_lib.rlhf.models import encode_texts

    tok = micro_rlhf.WordTokenizer()
    scorer = micro_rlhf.TrueRewardScorer(tok)
    reviews = data.make_corpus(50, seed=8)
    ids, mask = encode_texts(tok, [r.text for r in reviews])
    want = [data.true_reward(r.response) for r in reviews]
    np.testing.assert_allclose(scorer.score(ids, mask).numpy(), want, rtol=1e-12)


def test_rlhf_hooks_with_the_library_functions_reproduce_the_default_run():
    from klbook_lib.rlhf import ppo as rppo
    from klbook_lib.rlhf import rewards as R_lib
    from klbook_lib.rlhf.models import ScalarHeadModel

    pipe = micro_rlhf.build(0)

    def run(cfg):
        policy = pipe.new_policy()
        torch.manual_seed(0)                            # the value head's initialisation
        value = ScalarHeadModel.from_policy(pipe.ref_model)
        return rppo.train_ppo(policy, pipe.ref_model, pipe.reward_model, value, pipe.tokenizer, pipe.prompts,
                              iterations=2, beta=0.3, config=cfg, seed=5, progress=False)

    plain = run(micro_rlhf.rlhf_config())
    hooked = run(micro_rlhf.rlhf_config(
        reward_fn=lambda lp, ref, s, m, b: R_lib.per_token_rewards(lp, ref, s, m, b),
        advantage_fn=rppo.gae))
    for a, b in zip(plain, hooked):
        assert a["kl_exact_seq"] == pytest.approx(b["kl_exact_seq"], rel=1e-6, abs=1e-9)
        assert a["pg_loss"] == pytest.approx(b["pg_loss"], rel=1e-6, abs=1e-9)
    zero = run(micro_rlhf.rlhf_config(reward_fn=lambda lp, ref, s, m, b: torch.zeros_like(lp)))
    assert zero[1]["pg_loss"] != pytest.approx(plain[1]["pg_loss"], rel=1e-3)
    with pytest.raises(ValueError, match="reward_fn: must be callable"):
        micro_rlhf.rlhf_config(reward_fn=3).check()


def test_dpo_loss_hook_reproduces_the_default_and_refuses_detached_losses():
    from klbook_lib import dpo

    pipe = micro_rlhf.build(0)
    cfg = dpo.DPOConfig(batch_size=16, lr=1e-3)

    def own(pc, pr, rc, rr, beta):
        return torch.nn.functional.softplus(-beta * ((pc - rc) - (pr - rr)))

    a = dpo.train_dpo(pipe, beta=0.3, steps=3, seed=2, config=cfg, progress=False, evaluate=False)
    b = dpo.train_dpo(pipe, beta=0.3, steps=3, seed=2, config=cfg, progress=False, evaluate=False, loss_fn=own)
    np.testing.assert_allclose([r["loss"] for r in b.history], [r["loss"] for r in a.history], rtol=1e-5)
    with pytest.raises(ValueError, match="no gradient"):
        dpo.train_dpo(pipe, beta=0.3, steps=1, seed=2, config=cfg, progress=False, evaluate=False,
                      loss_fn=lambda pc, pr, rc, rr, beta: own(pc, pr, rc, rr, beta).detach())


def test_micro_judges_measure_the_returned_policy():
    pipe = micro_rlhf.build(0)
    untrained = [micro_rlhf.policy_vector(pipe.ref_model), np.zeros((30, 5)),
                 np.array([micro_rlhf.fingerprint(pipe)])]
    credit, msg = micro_rlhf.judge_rlhf(untrained, eval_seed=3)
    assert credit == 0.0 and "gain" in msg
    credit, msg = micro_rlhf.judge_dpo(untrained, eval_seed=3)
    assert credit == 0.0
    wrong_ref = [untrained[0], untrained[1], np.array([1.0])]
    assert "differs from the grader's" in micro_rlhf.judge_rlhf(wrong_ref, eval_seed=3)[1]
    for junk in ([np.zeros(5)], [], "policy", [np.full_like(untrained[0], np.inf)]):
        for judge in (micro_rlhf.judge_rlhf, micro_rlhf.judge_dpo):
            credit, msg = judge(junk, eval_seed=3)
            assert credit == 0.0 and "not a training result" in msg


@pytest.mark.slow
def test_micro_pipeline_build_is_deterministic_across_processes():
    """The grader judges the sandbox's run against its own build of the reference: both must be
    the same weights. A fresh process with one OpenMP thread (as in the sandbox) rebuilds it."""
    code = ("from klbook_grader.tasks import micro_rlhf as m; "
            "print(repr(m.fingerprint(m.build(0))))")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=300, check=True)
    # equal to rounding (the sum behind the fingerprint may use more threads here); the grader
    # accepts a relative difference of 1e-9
    theirs = float(out.stdout.strip().splitlines()[-1])
    assert math.isclose(theirs, micro_rlhf.fingerprint(micro_rlhf.build(0)), rel_tol=1e-12, abs_tol=0)


# ---------------------------------------------------------------- derive-then-verify references
@pytest.mark.parametrize("seed", range(5))
def test_closed_forms_of_the_reference_match_autograd(seed):
    rng = np.random.default_rng(seed)
    v = int(rng.integers(2, 9))
    z, zr = rng.normal(0, 2, v), rng.normal(0, 2, v)
    np.testing.assert_allclose(R.kl_hessian_logits(z), R.kl_hessian_autograd(z), atol=1e-12)
    np.testing.assert_allclose(R.kl_gradients(z, zr), R.kl_gradients_autograd(z, zr), atol=1e-12)
    pairs = rng.integers(0, v, (2, 6))
    np.testing.assert_allclose(R.dpo_logit_gradient(z, zr, pairs[0], pairs[1], 0.3),
                               R.dpo_logit_gradient_autograd(z, zr, pairs[0], pairs[1], 0.3), atol=1e-12)


@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_the_autograd_reference_is_seqkls_expected_gradient(scale):
    rng = np.random.default_rng(int(scale * 10))
    z, zr = rng.normal(0, scale, 7), rng.normal(0, scale, 7)
    sp = seqkl.sequence_space(7, 1)
    want = [seqkl.expected_gradient(sp, torch.tensor(z)[None], torch.tensor(zr)[None], k, placement)[0].numpy()
            for placement in ("reward", "loss") for k in ("k1", "k2", "k3")]
    np.testing.assert_allclose(R.kl_gradients_autograd(z, zr), want, atol=1e-12)
    # where seqkl's k3 overflows (p tiny), the reference stays finite and agrees with the closed form
    big = [1000.0, 1001.0, 0.0], [0.0, 0.0, 0.0]
    assert np.all(np.isfinite(R.kl_gradients_autograd(*big)))
    np.testing.assert_allclose(R.kl_gradients_autograd(*big), R.kl_gradients(*big), atol=1e-12)


def test_what_the_kl_gradient_rows_mean():
    """k1 in the reward and k2 in the loss are the gradient of the reverse KL, k3 in the loss
    that of the forward KL, k1 in the loss is zero (one token: seqkl's exact gradients)."""
    rng = np.random.default_rng(11)
    z, zr = rng.normal(0, 1.5, 6), rng.normal(0, 1.5, 6)
    rows = R.kl_gradients(z, zr)
    sp = seqkl.sequence_space(6, 1)
    zt, zrt = torch.tensor(z)[None], torch.tensor(zr)[None]
    reverse = seqkl.exact_kl_gradient(sp, zt, zrt, "reverse")[0].numpy()
    forward = seqkl.exact_kl_gradient(sp, zt, zrt, "forward")[0].numpy()
    np.testing.assert_allclose(rows[0], reverse, atol=1e-12)
    np.testing.assert_allclose(rows[4], reverse, atol=1e-12)
    np.testing.assert_allclose(rows[5], forward, atol=1e-12)
    assert np.all(rows[3] == 0) and not np.allclose(rows[2], reverse, atol=1e-3)


def test_fisher_is_singular_along_the_constant_shift():
    f = R.kl_hessian_logits([0.3, -1.0, 2.0, 0.0])
    np.testing.assert_allclose(f @ np.ones(4), 0.0, atol=1e-15)
    assert np.linalg.matrix_rank(f) == 3


# ---------------------------------------------------------------- student generation (issue 14, item 5)
def test_top_level_blocks_keep_only_the_answer_variables():
    src = "# BEGIN SOLUTION\npi = np.array([0.5])\nmargin = 2.0\nanswer_q3 = float(pi @ pi)\n# END SOLUTION"
    out = student.strip_solutions(src)
    assert out == "answer_q3 = None  # YOUR ANSWER HERE"
    assert student.strip_solutions(src, answers={"answer_q3", "margin"}).splitlines() == [
        "margin = None  # YOUR ANSWER HERE", "answer_q3 = None  # YOUR ANSWER HERE"]
    with pytest.raises(ValueError, match="must assign an answer"):
        student.strip_solutions("# BEGIN SOLUTION\npi = 1\n# END SOLUTION")


def test_student_blocks_replace_a_solution_with_the_given_code():
    src = ("def f(x):\n    # BEGIN SOLUTION\n    y = x + 1\n    # END SOLUTION\n"
           "    # BEGIN STUDENT\n    # y = x - 1   # the bug\n    #\n    # END STUDENT\n    return y")
    assert student.strip_solutions(src) == "def f(x):\n    y = x - 1   # the bug\n\n    return y"
    for bad in ("# BEGIN STUDENT\n# x = 1\n# END STUDENT",                        # no solution before it
                "# BEGIN SOLUTION\nanswer_q1 = 1\n# END SOLUTION\n# BEGIN STUDENT\nx = 1\n# END STUDENT",
                "# BEGIN SOLUTION\nanswer_q1 = 1\n# END SOLUTION\n# BEGIN STUDENT\n# x = 1"):
        with pytest.raises(ValueError):
            student.strip_solutions(bad)


def test_no_answer_like_variable_is_left_in_a_student_notebook():
    stub = "= None  # YOUR ANSWER HERE"
    for ex in bank.exercise_names():
        answers = {q.name for q in bank.questions(ex) if q.kind != "function"}
        nb = nbformat.read(REPO / "exercises" / f"{ex}.ipynb", as_version=4)
        for cell in nb.cells:
            for line in cell.source.splitlines():
                if stub in line:
                    assert line.split("=")[0].strip() in answers, (ex, line)
        text = "\n".join(c.source for c in nb.cells)
        assert "BEGIN STUDENT" not in text and "END SOLUTION" not in text


# ---------------------------------------------------------------- exact answers, klbook start
def test_exact_answers_get_no_tolerance_formula():
    ok, why = compare.compare_numeric(np.asarray(3.0), compare.encode(4), 0.0, 0.0, reveal=False)
    assert not ok and "must be exact" in why and "0 +" not in why
    assert compare.tolerance_text(1e-3, 0.0) == "tolerance: relative error <= 0.001"


def test_klbook_start_writes_a_copy_outside_the_repository(tmp_path, capsys):
    from klbook_grader.cli import main
    from klbook_grader.start import StartError, resolve, start

    assert resolve("4") == resolve("ex04") == resolve("ex04_estimating_kl") == "ex04_estimating_kl"
    path = start("ex04", tmp_path / "work")
    assert path == tmp_path / "work" / "ex04_estimating_kl.ipynb"
    assert path.read_text() == (REPO / "exercises" / "ex04_estimating_kl.ipynb").read_text()
    path.write_text("my answers")
    with pytest.raises(StartError, match="already exists"):
        start("ex04", tmp_path / "work")
    assert path.read_text() == "my answers"                      # never overwritten silently
    assert start("ex04", tmp_path / "work", force=True).read_text() != "my answers"
    for bad_dir in (REPO, REPO / "exercises"):
        with pytest.raises(StartError, match="inside the book's repository"):
            start("ex04", bad_dir)
    with pytest.raises(StartError, match="unknown exercise"):
        resolve("ex99")
    assert main(["start", "ex07", str(tmp_path / "cli")]) == 0
    assert (tmp_path / "cli" / "ex07_token_level_kl.ipynb").is_file()
    assert main(["start", "ex07", str(tmp_path / "cli")]) == 2     # exists: refused
    assert main(["start", "nonsense", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "unknown exercise" in err


def _cjk_and_latin(text: str) -> tuple[int, int]:
    import re
    return len(re.findall(r"[\u4e00-\u9fff]", text)), len(re.findall(r"[A-Za-z]", text))


def test_klbook_start_in_chinese_translates_the_text_and_keeps_the_code(tmp_path):
    from klbook_grader.cli import main
    from klbook_grader.start import StartError, available, catalogue, start, translate_markdown

    en = json.loads(start("ex04", tmp_path / "en").read_text())
    zh_path = start("ex04", tmp_path / "zh", lang="zh")
    zh = json.loads(zh_path.read_text())
    code = lambda nb: [(c["source"], c.get("metadata")) for c in nb["cells"] if c["cell_type"] == "code"]
    assert code(zh) == code(en) and len(zh["cells"]) == len(en["cells"])
    assert zh["metadata"]["klbook"]["exercise"] == "ex04_estimating_kl"
    text = "".join("".join(c["source"]) for c in zh["cells"] if c["cell_type"] == "markdown")
    cjk, latin = _cjk_and_latin(text)
    assert cjk > 500 and cjk > latin, (cjk, latin)
    assert "$k_1, k_2, k_3$" in text and "{doc}`../chapters/04_estimating_kl`" in text   # math, roles kept
    # every text block of every exercise has its translation (a changed paragraph would show here)
    for name in available():
        messages = catalogue(name)
        nb = json.loads((REPO / "exercises" / f"{name}.ipynb").read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                _, done, total = translate_markdown("".join(cell["source"]), messages)
                assert done == total, (name, "".join(cell["source"])[:120])
    # the parsing: headings, list items, paragraphs over several lines; fences and math kept
    src = "## Question 1: A (2 points)\n\nOne line\nand two.\n\n- item one\n  goes on\n\n$$x$$\n\n```\ncode\n```"
    msgs = {"Question 1: A (2 points)": "第 1 题：A（2 分）", "One line and two.": "一行与两行。",
            "item one goes on": "第一项"}
    out, done, total = translate_markdown(src, msgs)
    assert (done, total) == (3, 3)
    assert out == "## 第 1 题：A（2 分）\n\n一行与两行。\n\n- 第一项\n\n$$x$$\n\n```\ncode\n```"
    with pytest.raises(StartError, match="lang"):
        start("ex04", tmp_path / "x", lang="fr")
    assert main(["start", "ex07", str(tmp_path / "cli"), "--lang", "zh"]) == 0


def test_a_chinese_exercise_notebook_grades_as_the_english_one(tmp_path):
    from klbook_grader.grader import grade
    from klbook_grader.start import catalogue, translate_markdown

    name = "ex04_estimating_kl"
    messages = catalogue(name)
    results = {}
    for kind, folder in (("master", REPO / "exercises" / "masters"), ("stub", REPO / "exercises")):
        nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = translate_markdown(cell.source, messages)[0]
        path = tmp_path / kind / f"{name}.ipynb"
        path.parent.mkdir()
        nbformat.write(nb, path)
        assert "第 1 题" in path.read_text()
        results[kind] = (grade(path), grade(folder / f"{name}.ipynb"))
    for kind, (zh, en) in results.items():
        assert [(q["id"], q["points"]) for q in zh["questions"]] == [(q["id"], q["points"]) for q in en["questions"]]
        assert zh["score"] == en["score"], kind
    assert results["master"][0]["score"] == results["master"][0]["max_score"] > 0
    assert results["stub"][0]["score"] == 0


def test_outcome_checks_skip_training_while_grading(monkeypatch, capsys):
    from klbook_grader import checker

    calls = []

    def train_cartpole(seed):
        calls.append(seed)
        raise NotImplementedError

    check = checker.checker_for("ex03_trpo_ppo")
    monkeypatch.setenv("KLBOOK_GRADING", "1")
    check("q8", _ns={"train_cartpole": train_cartpole})
    assert "the grader runs this training itself" in capsys.readouterr().out and calls == []
    monkeypatch.delenv("KLBOOK_GRADING")
    check("q8", _ns={"train_cartpole": train_cartpole})
    assert "not implemented yet" in capsys.readouterr().out and calls == [100]


def test_public_cases_describe_the_outcome_checks():
    data = json.loads(student.PUBLIC_CASES.read_text())
    for ex, qid in (("ex03_trpo_ppo", "q8"), ("ex05_kl_in_practice", "q5"), ("ex07_token_level_kl", "q6"),
                    ("ex08_vi_elbo_dpo", "q6")):
        entry = data[ex][qid]
        assert entry["cases"] == [] and entry["n_hidden"] >= 4 and entry["outcome_checks"]
    # nothing of the broken trainer's fixed behaviour is public
    assert "token_logprobs" not in json.dumps(data["ex05_kl_in_practice"]["q5"]["outcome_checks"])
