"""KL coefficient controllers: how ``beta`` in ``L = L_PG - beta * KL`` changes during training.

Every controller has the same small interface:

``value``
    the current coefficient ``beta`` (a float >= 0);
``update(kl, n_steps=1) -> float``
    feed the KL measured after an update (the state-averaged ``E_s[KL(pi_old || pi_theta)]``,
    or whatever KL the caller uses), return the new ``beta``.

Four rules are implemented:

* :class:`FixedKL` -- ``beta`` never changes.
* :class:`AdaptiveKL` -- the rule of the PPO paper (Schulman et al. 2017, sec. 4): halve ``beta``
  when ``d < target / 1.5``, double it when ``d > 1.5 * target``.
* :class:`BoundedAdaptiveKL` -- the same multiplicative rule with its own thresholds and factor,
  and ``beta`` clamped to ``[beta_min, beta_max]`` (the variant practitioners use).
* :class:`ProportionalKL` -- the proportional controller of Ziegler et al. (2019), used by TRL up
  to 0.11.4: ``e = clip(KL / target - 1, -clip, clip)``, ``beta *= 1 + e * n_steps / horizon``.

:class:`EMASmoothed` wraps any of them and feeds it an exponential moving average of the
measured KL instead of the raw, noisy batch estimate.

A measured KL may be slightly negative (a sampled ``k1`` estimate can be), so negative values
are accepted; NaN and infinite values are rejected with a ``ValueError``.
"""
from __future__ import annotations

import math
import operator

__all__ = [
    "KLController", "FixedKL", "AdaptiveKL", "BoundedAdaptiveKL", "ProportionalKL",
    "EMASmoothed", "EntropyBandController",
]


def _check_finite(name: str, x: float) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be a real number, got {x!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"{name}: must be finite, got {x}")
    return x


def _check_positive(name: str, x: float) -> float:
    x = _check_finite(name, x)
    if x <= 0:
        raise ValueError(f"{name}: must be > 0, got {x}")
    return x


def _check_nonneg(name: str, x: float) -> float:
    x = _check_finite(name, x)
    if x < 0:
        raise ValueError(f"{name}: must be >= 0, got {x}")
    return x


def _check_n_steps(n_steps: int) -> int:
    try:
        n = operator.index(n_steps)
    except TypeError:
        raise ValueError(f"n_steps: must be a positive integer, got {n_steps!r}") from None
    if isinstance(n_steps, bool) or n < 1:
        raise ValueError(f"n_steps: must be a positive integer, got {n_steps!r}")
    return n


class KLController:
    """Base class: holds ``beta`` and a history of (kl, beta) pairs."""

    def __init__(self, beta: float):
        self._beta = _check_nonneg("beta", beta)
        self.history: list[dict] = []

    @property
    def value(self) -> float:
        """The current coefficient ``beta``."""
        return self._beta

    def _new_beta(self, kl: float, n_steps: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def update(self, kl: float, n_steps: int = 1) -> float:
        """Feed the measured KL, return the new ``beta``.

        ``n_steps`` is the number of samples (or environment steps) behind the measurement;
        only :class:`ProportionalKL` uses it.
        """
        kl = _check_finite("kl", kl)
        n_steps = _check_n_steps(n_steps)
        self._beta = self._new_beta(kl, n_steps)
        self.history.append({"kl": kl, "beta": self._beta})
        return self._beta

    def __repr__(self) -> str:
        return f"{type(self).__name__}(beta={self._beta:.6g})"


class FixedKL(KLController):
    """A constant coefficient: ``update`` ignores the KL and returns ``beta``."""

    def _new_beta(self, kl: float, n_steps: int) -> float:
        return self._beta


class AdaptiveKL(KLController):
    """The adaptive KL penalty of the PPO paper (Schulman et al. 2017, section 4).

    After each policy update, with ``d`` the measured ``E_s[KL(pi_old || pi_theta)]``::

        d < target / tolerance  ->  beta <- beta / factor
        d > target * tolerance  ->  beta <- beta * factor
        otherwise               ->  beta unchanged

    The paper uses ``tolerance = 1.5`` and ``factor = 2`` and calls both heuristic choices.
    ``beta`` must start > 0: a multiplicative rule started at 0 stays at 0.
    """

    def __init__(self, beta: float, target: float, tolerance: float = 1.5, factor: float = 2.0):
        _check_positive("beta", beta)
        super().__init__(beta)
        self.target = _check_positive("target", target)
        self.tolerance = _check_finite("tolerance", tolerance)
        if self.tolerance <= 1:
            raise ValueError(f"tolerance: must be > 1, got {tolerance}")
        self.factor = _check_finite("factor", factor)
        if self.factor <= 1:
            raise ValueError(f"factor: must be > 1, got {factor}")

    def _new_beta(self, kl: float, n_steps: int) -> float:
        if kl < self.target / self.tolerance:
            return self._beta / self.factor
        if kl > self.target * self.tolerance:
            return self._beta * self.factor
        return self._beta


class BoundedAdaptiveKL(KLController):
    """A multiplicative adaptive rule with a dead band and bounds on ``beta``::

        d > high * target  ->  beta <- min(beta * factor, beta_max)
        d < low  * target  ->  beta <- max(beta / factor, beta_min)
        otherwise          ->  beta unchanged

    Defaults ``low=0.5, high=1.5, factor=1.5, beta_min=1e-4, beta_max=10`` are a common
    practitioner's choice. Note the dead band is ``[0.5, 1.5] * target``, asymmetric in log
    scale, unlike the PPO paper's ``[target/1.5, 1.5*target]``.

    Why ``beta_min`` must be strictly positive: every change to ``beta`` is a multiplication
    (by ``factor`` or ``1/factor``). If ``beta`` ever reached 0, ``0 * factor = 0`` and the
    penalty could never come back however large the KL grows. A floor above 0 keeps the rule
    able to react. The ceiling ``beta_max`` stops one KL spike from pushing ``beta`` so high
    that the policy stays frozen for many updates while the rule halves its way back down.
    """

    def __init__(self, beta: float, target: float, factor: float = 1.5, low: float = 0.5,
                 high: float = 1.5, beta_min: float = 1e-4, beta_max: float = 10.0):
        self.beta_min = _check_finite("beta_min", beta_min)
        if self.beta_min <= 0:
            raise ValueError(
                f"beta_min: must be > 0 (a multiplicative rule can never leave beta = 0), "
                f"got {beta_min}")
        self.beta_max = _check_finite("beta_max", beta_max)
        if self.beta_max < self.beta_min:
            raise ValueError(f"beta_max: must be >= beta_min = {self.beta_min}, got {beta_max}")
        beta = _check_positive("beta", beta)
        if not self.beta_min <= beta <= self.beta_max:
            raise ValueError(
                f"beta: must lie in [beta_min, beta_max] = [{self.beta_min}, {self.beta_max}], "
                f"got {beta}")
        super().__init__(beta)
        self.target = _check_positive("target", target)
        self.factor = _check_finite("factor", factor)
        if self.factor <= 1:
            raise ValueError(f"factor: must be > 1, got {factor}")
        self.low = _check_positive("low", low)
        self.high = _check_positive("high", high)
        if not self.low <= 1 <= self.high:
            raise ValueError(f"low, high: need low <= 1 <= high, got low={low}, high={high}")

    def _new_beta(self, kl: float, n_steps: int) -> float:
        if kl > self.high * self.target:
            return min(self._beta * self.factor, self.beta_max)
        if kl < self.low * self.target:
            return max(self._beta / self.factor, self.beta_min)
        return self._beta


class ProportionalKL(KLController):
    """The proportional controller of Ziegler et al. (2019), as in TRL <= 0.11.4.

    With ``n_steps`` samples behind the measured KL::

        e    = clip(kl / target - 1, -clip, +clip)
        beta = beta * (1 + e * n_steps / horizon)

    ``beta`` moves by at most a fraction ``clip * n_steps / horizon`` per update, so it
    changes smoothly. TRL 0.11.4's defaults are ``beta=0.2, target=6, horizon=10000``, with the
    KL summed over the tokens of a response (a per-sequence KL, hence the large target).
    """

    def __init__(self, beta: float, target: float, horizon: float, clip: float = 0.2):
        _check_positive("beta", beta)
        super().__init__(beta)
        self.target = _check_positive("target", target)
        self.horizon = _check_positive("horizon", horizon)
        self.clip = _check_positive("clip", clip)

    def _new_beta(self, kl: float, n_steps: int) -> float:
        e = min(max(kl / self.target - 1.0, -self.clip), self.clip)
        mult = 1.0 + e * n_steps / self.horizon
        if mult <= 0:
            raise ValueError(
                f"n_steps: n_steps / horizon = {n_steps / self.horizon:.3g} is so large that "
                f"beta would become <= 0; use n_steps < horizon / clip")
        return self._beta * mult


class EMASmoothed(KLController):
    """Feed a controller an exponential moving average of the KL instead of the raw value.

    ``kl_ema <- decay * kl_ema + (1 - decay) * kl`` (the first measurement initialises it),
    then ``inner.update(kl_ema, n_steps)``. With a small batch the per-update KL estimate is
    noisy and an :class:`AdaptiveKL` rule reacts to the noise; averaging over roughly
    ``1 / (1 - decay)`` updates trades a little lag for a much steadier ``beta``.
    """

    def __init__(self, inner: KLController, decay: float = 0.9):
        if not isinstance(inner, KLController):
            raise ValueError(f"inner: must be a KLController, got {type(inner).__name__}")
        decay = _check_finite("decay", decay)
        if not 0 <= decay < 1:
            raise ValueError(f"decay: must lie in [0, 1), got {decay}")
        from .monitor import EMA  # the same average the training dashboard logs

        super().__init__(inner.value)
        self.inner = inner
        self.decay = decay
        self._ema = EMA(decay)

    @property
    def value(self) -> float:
        return self.inner.value

    @property
    def kl_ema(self) -> float | None:
        """The smoothed KL fed to ``inner`` (``None`` before the first update)."""
        return self._ema.value

    def _new_beta(self, kl: float, n_steps: int) -> float:
        return self.inner.update(self._ema.update(kl), n_steps)

    def update(self, kl: float, n_steps: int = 1) -> float:
        beta = super().update(kl, n_steps)
        self.history[-1]["kl_ema"] = self.kl_ema
        return beta


class EntropyBandController:
    """Keep a categorical policy's KL to the uniform policy inside a band ``[low, high]``.

    For ``|A|`` actions ``KL(pi(.|s) || uniform) = log|A| - H(pi(.|s))``: 0 for the uniform
    policy, ``log|A|`` for a deterministic one. Used as an *exploration gauge*, a large value
    means the policy has (nearly) stopped exploring, a small one that it is still close to
    random. The controller adjusts the entropy-bonus coefficient ``c`` (the loss gets
    ``- c * H``) after each update, from the measured KL (e.g. its mean over the batch's states)::

        kl > high  ->  c <- min(c * factor, coef_max)     too sharp: more entropy bonus
        kl < low   ->  c <- max(c / factor, coef_min)     too flat: less entropy bonus
        otherwise  ->  c unchanged

    The same interface as the KL controllers (``value``, ``update(kl, n_steps=1)``), so
    ``PPOConfig(ent_controller=...)`` can use it. ``coef_min`` must be > 0 for the same reason
    as in :class:`BoundedAdaptiveKL`: a multiplicative rule cannot leave 0. ``history`` records
    ``{"kl_uniform": kl, "coef": c}`` after every update.
    """

    def __init__(self, coef: float, low: float, high: float, factor: float = 1.5,
                 coef_min: float = 1e-4, coef_max: float = 1.0):
        self.low = _check_positive("low", low)
        self.high = _check_positive("high", high)
        if not self.low < self.high:
            raise ValueError(f"high: must be > low = {low}, got {high}")
        self.factor = _check_finite("factor", factor)
        if self.factor <= 1:
            raise ValueError(f"factor: must be > 1, got {factor}")
        self.coef_min = _check_positive("coef_min", coef_min)
        self.coef_max = _check_finite("coef_max", coef_max)
        if self.coef_max < self.coef_min:
            raise ValueError(f"coef_max: must be >= coef_min = {coef_min}, got {coef_max}")
        coef = _check_finite("coef", coef)
        if not self.coef_min <= coef <= self.coef_max:
            raise ValueError(f"coef: must lie in [coef_min, coef_max] = [{self.coef_min}, "
                             f"{self.coef_max}], got {coef}")
        self._coef = coef
        self.history: list[dict] = []

    @property
    def value(self) -> float:
        """The current entropy coefficient."""
        return self._coef

    def update(self, kl: float, n_steps: int = 1) -> float:
        """Feed the measured ``KL(pi || uniform)`` (nats, >= 0), return the new coefficient."""
        kl = _check_finite("kl", kl)
        if kl < -1e-9:
            raise ValueError(f"kl: a KL to the uniform policy cannot be negative, got {kl}")
        _check_n_steps(n_steps)
        if kl > self.high:
            self._coef = min(self._coef * self.factor, self.coef_max)
        elif kl < self.low:
            self._coef = max(self._coef / self.factor, self.coef_min)
        self.history.append({"kl_uniform": kl, "coef": self._coef})
        return self._coef

    def __repr__(self) -> str:
        return (f"EntropyBandController(coef={self._coef:.6g}, band=[{self.low:g}, {self.high:g}])")
