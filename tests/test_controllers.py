"""Tests for klbook_lib.controllers: each rule against its published formula.

The expected sequences below are computed by hand from the formulas (PPO paper sec. 4;
Ziegler et al. 2019 / TRL <= 0.11.4), written out as literal arithmetic, not produced by
the code under test.
"""
import math

import pytest

from klbook_lib import controllers as C


def test_fixed_never_changes():
    c = C.FixedKL(0.3)
    for kl in [0.0, 1e-6, 5.0, 100.0, -0.01]:
        assert c.update(kl) == 0.3
    assert c.value == 0.3
    assert len(c.history) == 5


def test_fixed_zero_is_allowed():
    assert C.FixedKL(0.0).update(1.0) == 0.0


def test_adaptive_ppo_rule_hand_sequence():
    # target 0.01: band is [0.01/1.5, 0.015] = [0.006667, 0.015]
    c = C.AdaptiveKL(1.0, target=0.01)
    kls = [0.05, 0.05, 0.01, 0.001, 0.0066, 0.0067, 0.015, 0.0151]
    expected = [2.0, 4.0, 4.0, 2.0, 1.0, 1.0, 1.0, 2.0]
    got = [c.update(k) for k in kls]
    assert got == pytest.approx(expected, rel=0, abs=0)
    assert [h["beta"] for h in c.history] == expected


def test_adaptive_custom_tolerance_factor():
    c = C.AdaptiveKL(0.5, target=1.0, tolerance=2.0, factor=3.0)
    assert c.update(2.5) == pytest.approx(1.5)    # > 2 * 1
    assert c.update(0.4) == pytest.approx(0.5)    # < 1 / 2
    assert c.update(1.9) == pytest.approx(0.5)    # inside band


def test_bounded_hand_sequence_and_bounds():
    c = C.BoundedAdaptiveKL(1.0, target=0.02, factor=1.5, beta_min=0.1, beta_max=3.0)
    # > 0.03 -> *1.5 capped at 3: 1.5, 2.25, 3.0 (3.375 capped), 3.0
    for expected in [1.5, 2.25, 3.0, 3.0]:
        assert c.update(0.5) == pytest.approx(expected)
    # inside [0.01, 0.03]: unchanged
    assert c.update(0.02) == pytest.approx(3.0)
    assert c.update(0.0299) == pytest.approx(3.0)
    # < 0.01 -> /1.5 floored at 0.1
    seq = [2.0, 4 / 3, 8 / 9, 16 / 27, 32 / 81, 64 / 243, 128 / 729, 256 / 2187, 0.1, 0.1]
    for expected in seq:
        assert c.update(0.0) == pytest.approx(expected)
    assert all(0.1 <= h["beta"] <= 3.0 for h in c.history)


def test_bounded_floor_lets_beta_recover():
    c = C.BoundedAdaptiveKL(0.01, target=0.02, beta_min=1e-4)
    for _ in range(50):
        c.update(0.0)
    assert c.value == pytest.approx(1e-4)
    c.update(1.0)
    assert c.value == pytest.approx(1.5e-4)


def test_bounded_rejects_zero_floor():
    with pytest.raises(ValueError, match="beta_min"):
        C.BoundedAdaptiveKL(1.0, target=0.02, beta_min=0.0)
    with pytest.raises(ValueError, match="beta"):
        C.BoundedAdaptiveKL(20.0, target=0.02, beta_max=10.0)


def test_proportional_ziegler_formula_hand():
    # TRL 0.11.4 defaults: init 0.2, target 6, horizon 10000
    c = C.ProportionalKL(0.2, target=6.0, horizon=10000)
    # kl = 9: e = 9/6 - 1 = 0.5 -> clipped to 0.2; n_steps = 256
    b1 = 0.2 * (1 + 0.2 * 256 / 10000)
    assert c.update(9.0, n_steps=256) == pytest.approx(b1, rel=1e-12)
    # kl = 6.6: e = 0.1 (inside clip)
    b2 = b1 * (1 + 0.1 * 256 / 10000)
    assert c.update(6.6, n_steps=256) == pytest.approx(b2, rel=1e-12)
    # kl = 0: e = -1 -> clipped to -0.2; n_steps = 1000
    b3 = b2 * (1 - 0.2 * 1000 / 10000)
    assert c.update(0.0, n_steps=1000) == pytest.approx(b3, rel=1e-12)
    # kl = target: unchanged
    assert c.update(6.0, n_steps=5000) == pytest.approx(b3, rel=1e-12)


def test_proportional_converges_to_fixed_point_of_plant():
    # A toy plant where KL = 1 / beta: the controller should settle at KL = target,
    # i.e. beta = 1 / target.
    c = C.ProportionalKL(1.0, target=0.5, horizon=100)
    kl = 1.0
    for _ in range(3000):
        c.update(kl, n_steps=10)
        kl = 1.0 / c.value
    assert c.value == pytest.approx(2.0, rel=1e-3)


def test_ema_wrapper_hand_sequence():
    inner = C.AdaptiveKL(1.0, target=1.0)
    c = C.EMASmoothed(inner, decay=0.5)
    # ema: 3 -> (3+0)/2 = 1.5 -> (1.5+0)/2 = 0.75 -> (0.75 + 0.25)/2 = 0.5
    assert c.update(3.0) == pytest.approx(2.0)      # 3 > 1.5
    assert c.kl_ema == pytest.approx(3.0)
    assert c.update(0.0) == pytest.approx(2.0)      # 1.5 is not > 1.5
    assert c.update(0.0) == pytest.approx(2.0)      # 0.75 in [2/3, 1.5]
    assert c.update(0.25) == pytest.approx(1.0)     # 0.5 < 2/3
    assert c.value == inner.value
    assert [h["kl_ema"] for h in c.history] == pytest.approx([3.0, 1.5, 0.75, 0.5])


def test_ema_reduces_beta_noise_on_random_kl():
    import numpy as np

    rng = np.random.default_rng(0)
    kls = 0.01 * rng.exponential(size=400)          # noisy around the target
    raw = C.AdaptiveKL(1.0, target=0.01)
    smooth = C.EMASmoothed(C.AdaptiveKL(1.0, target=0.01), decay=0.95)
    for k in kls:
        raw.update(k)
        smooth.update(k)
    n_raw = sum(a["beta"] != b["beta"] for a, b in zip(raw.history, raw.history[1:]))
    n_smooth = sum(a["beta"] != b["beta"] for a, b in zip(smooth.history, smooth.history[1:]))
    assert n_smooth < n_raw / 4, (n_raw, n_smooth)


@pytest.mark.parametrize("make", [
    lambda: C.FixedKL(1.0),
    lambda: C.AdaptiveKL(1.0, 0.01),
    lambda: C.BoundedAdaptiveKL(1.0, 0.01),
    lambda: C.ProportionalKL(1.0, 0.01, 1000),
    lambda: C.EMASmoothed(C.AdaptiveKL(1.0, 0.01)),
])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "x", None])
def test_nonfinite_kl_rejected(make, bad):
    c = make()
    with pytest.raises(ValueError, match="kl"):
        c.update(bad)
    assert c.value == 1.0 and c.history == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_n_steps_rejected(bad):
    with pytest.raises(ValueError, match="n_steps"):
        C.ProportionalKL(1.0, 1.0, 100).update(0.5, n_steps=bad)


@pytest.mark.parametrize("call, name", [
    (lambda: C.FixedKL(-0.1), "beta"),
    (lambda: C.FixedKL(math.nan), "beta"),
    (lambda: C.AdaptiveKL(0.0, 0.01), "beta"),
    (lambda: C.AdaptiveKL(1.0, 0.0), "target"),
    (lambda: C.AdaptiveKL(1.0, -0.01), "target"),
    (lambda: C.AdaptiveKL(1.0, 0.01, tolerance=1.0), "tolerance"),
    (lambda: C.AdaptiveKL(1.0, 0.01, factor=0.5), "factor"),
    (lambda: C.BoundedAdaptiveKL(1.0, 0.0), "target"),
    (lambda: C.BoundedAdaptiveKL(1.0, 0.01, beta_min=2.0, beta_max=1.0), "beta_max"),
    (lambda: C.BoundedAdaptiveKL(1.0, 0.01, low=2.0), "low"),
    (lambda: C.ProportionalKL(1.0, 0.0, 100), "target"),
    (lambda: C.ProportionalKL(1.0, 1.0, 0), "horizon"),
    (lambda: C.ProportionalKL(-1.0, 1.0, 100), "beta"),
    (lambda: C.ProportionalKL(1.0, 1.0, 100, clip=0.0), "clip"),
    (lambda: C.EMASmoothed(C.FixedKL(1.0), decay=1.0), "decay"),
    (lambda: C.EMASmoothed("nope"), "inner"),
])
def test_bad_arguments_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_proportional_rejects_step_that_would_flip_sign():
    c = C.ProportionalKL(1.0, target=1.0, horizon=10, clip=0.2)
    with pytest.raises(ValueError, match="n_steps"):
        c.update(0.0, n_steps=100)       # 1 - 0.2 * 10 < 0


# ---------------------------------------------------------------- chapter 13: the entropy band

def test_entropy_band_controller_rule_by_hand():
    c = C.EntropyBandController(0.01, low=0.1, high=0.4, factor=2.0, coef_min=0.004, coef_max=0.05)
    expected = []
    # above the band: more bonus (0.02, 0.04, then the ceiling 0.05)
    for kl, coef in [(0.5, 0.02), (0.6, 0.04), (0.69, 0.05), (0.3, 0.05),
                     # below: less bonus (0.025, 0.0125, 0.00625, then the floor 0.004)
                     (0.05, 0.025), (0.0, 0.0125), (0.01, 0.00625), (0.02, 0.004), (0.2, 0.004)]:
        assert c.update(kl) == pytest.approx(coef)
        expected.append({"kl_uniform": kl, "coef": pytest.approx(coef)})
    assert c.history == expected
    assert c.value == pytest.approx(0.004)


@pytest.mark.parametrize("kwargs, match", [
    (dict(coef=0.01, low=0.3, high=0.1), "high"), (dict(coef=0.01, low=0.0, high=0.1), "low"),
    (dict(coef=0.01, low=0.1, high=0.3, factor=1.0), "factor"),
    (dict(coef=0.01, low=0.1, high=0.3, coef_min=0.0), "coef_min"),
    (dict(coef=0.01, low=0.1, high=0.3, coef_min=0.1, coef_max=0.05), "coef_max"),
    (dict(coef=2.0, low=0.1, high=0.3), "coef"), (dict(coef=float("nan"), low=0.1, high=0.3), "coef"),
])
def test_entropy_band_controller_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        C.EntropyBandController(**kwargs)


def test_entropy_band_controller_bad_updates():
    c = C.EntropyBandController(0.01, low=0.1, high=0.3)
    with pytest.raises(ValueError, match="kl"):
        c.update(-0.5)
    with pytest.raises(ValueError, match="kl"):
        c.update(float("inf"))
    with pytest.raises(ValueError, match="n_steps"):
        c.update(0.2, n_steps=0)
