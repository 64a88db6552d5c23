"""Named uncertainty measures of an ensemble's prediction.

Each measure is a pure function `(means, stds) -> (B,)` of the members' Gaussian means and standard
deviations, both shaped (M, B, D) (members, samples, predicted dims). `MEASURES` maps the names used
in configs and in `WorldModel.step(..., uncertainty=NAME)` to the functions.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from mbrl.core.errors import ConfigError


def aleatoric_max(means: jax.Array, stds: jax.Array) -> jax.Array:
    """max over members of ‖σ_m‖₂: MOPO's penalty (Yu et al. 2020, "MOPO: Model-based Offline Policy Optimization")."""
    del means
    return jnp.max(jnp.linalg.norm(stds, axis=-1), axis=0)


def epistemic_std(means: jax.Array, stds: jax.Array) -> jax.Array:
    """sqrt(mean over dims of Var_m[μ_m]): NEUBAY's epistemic measure (Ni et al. 2025, "Long-Horizon
    Model-Based Offline Reinforcement Learning Without Conservatism", `epi_mean`)."""
    del stds
    return jnp.sqrt(jnp.mean(jnp.var(means, axis=0), axis=-1))


def epistemic_sum(means: jax.Array, stds: jax.Array) -> jax.Array:
    """Σ over dims of the std over members of μ_m (Bessel-corrected): RWM-U's epistemic uncertainty (Li et al.
    2025; leggedrobotics/rsl_rl_rwm rsl_rl/modules/system_dynamics.py `epistemic_uncertainty`)."""
    del stds
    return jnp.sum(jnp.std(means, axis=0, ddof=1 if means.shape[0] > 1 else 0), axis=-1)


def pairwise_max(means: jax.Array, stds: jax.Array) -> jax.Array:
    """max over member pairs of ‖μ_i - μ_j‖₂: MOReL's disagreement (Kidambi et al. 2020, "MOReL:
    Model-Based Offline Reinforcement Learning"; "max pairwise diff" in Lu et al. 2022, "Revisiting
    Design Choices in Offline Model-Based Reinforcement Learning")."""
    del stds
    members = means.shape[0]

    def widest(i, best):  # the farthest member from member i, per sample
        gap = jnp.max(jnp.sum(jnp.square(means - means[i]), axis=-1), axis=0)
        return jnp.maximum(best, gap)

    # A loop over i keeps memory at O(M·B·D) (not O(M²·B·D)): it matters for 100+ members.
    sq = jax.lax.fori_loop(0, members, widest, jnp.zeros(means.shape[1], means.dtype), unroll=members <= 16)
    return jnp.sqrt(sq)


def ensemble_std(means: jax.Array, stds: jax.Array) -> jax.Array:
    """‖std of the sampled prediction‖₂, the mixture's per-dim std sqrt(mean_m(σ²) + Var_m(μ)):
    "ensemble standard deviation" of Lu et al. 2022 ("Revisiting Design Choices in Offline
    Model-Based Reinforcement Learning")."""
    variance = jnp.mean(jnp.square(stds), axis=0) + jnp.var(means, axis=0)
    return jnp.sqrt(jnp.sum(variance, axis=-1))


MEASURES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "aleatoric_max": aleatoric_max,
    "epistemic_std": epistemic_std,
    "epistemic_sum": epistemic_sum,
    "pairwise_max": pairwise_max,
    "ensemble_std": ensemble_std,
}


def get_measure(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
    try:
        return MEASURES[name]
    except KeyError:
        raise ConfigError(f"unknown uncertainty measure '{name}'; expected one of: {', '.join(MEASURES)}") from None
