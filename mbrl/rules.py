"""The rules that turn a dataset's profile (`mbrl.datasets.profile`) into settings, each with the fact it read and
its source. They name fields, never tasks: a choice goes to every config section that has its field.

- target entropy: no higher than the entropy of the data's own actions where most of a dimension's rows sit at a
  bound (SAC's -|A|, Haarnoja et al. 2018, is out of reach there);
- the temperature's pace: fast enough for the temperature to fall, within half the update budget, to where the
  entropy bonus is a tenth of the reward per step;
- standardised observations where their scales differ by two orders of magnitude or more;
- observations hidden from the networks where they track the time step and the dynamics ignore them;
- from a fitted model's profile (`mbrl.model_profile`): imagined steps at the members' mean where its variance stands
  for jumps, and the horizon up to which its k-step error stays within a tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from mbrl.datasets.profile import DataProfile

GAUSSIAN_ENTROPY_CONSTANT = 0.5 * math.log(2 * math.pi * math.e)  # h(N(0, s²)) = log s + this
BONUS_SHARE_OF_REWARD = 0.1  # the entropy bonus the temperature must be able to shrink to, against the reward
PACE_WITHIN = 0.5  # the share of the update budget in which the temperature must be able to get there
MIN_SPREAD = 1e-3  # of the action's range: a dimension the data never moves still has a finite entropy


@dataclasses.dataclass(frozen=True)
class Choice:
    field: str  # "target_entropy", "alpha_lr", "normalize_obs", "ignore_obs_dims" (a section's or the run's)
    value: Any
    fact: str  # what of the profile it read
    source: str  # why the rule holds


def data_entropy(profile: DataProfile) -> float:
    """The entropy of a Gaussian of the data's own per-dimension spread, summed over the action's dimensions."""
    total = 0.0
    for action in profile.actions:
        width = (action.high - action.low) if action.low is not None else 2.0
        total += math.log(max(action.std, MIN_SPREAD * width)) + GAUSSIAN_ENTROPY_CONSTANT
    return total


def target_entropy(profile: DataProfile) -> Choice | None:
    pressed = profile.pressed_actions
    default = -float(len(profile.actions))
    if not pressed or data_entropy(profile) >= default:
        return None
    value = round(data_entropy(profile), 2)
    return Choice("target_entropy", value,
                  f"action dims {pressed} sit at a bound in most rows; the data's actions have entropy {value:.2f}, "
                  f"below SAC's target {default:g}",
                  "a target the data's actions do not reach raises the temperature until the policy leaves the "
                  "bound and the data (docs/findings.md, Simglucose)")


def alpha_pace(profile: DataProfile, updates: int, init_alpha: float, target: float, current_lr: float) -> Choice | None:
    """Adam moves log α by about its learning rate an update whatever the entropy's gap, so falling from
    `init_alpha` to α_min takes log(init_alpha / α_min) / lr updates."""
    alpha_min = BONUS_SHARE_OF_REWARD * profile.reward_abs_mean / max(1.0, abs(target))
    if alpha_min <= 0 or alpha_min >= init_alpha:
        return None
    needed = math.log(init_alpha / alpha_min) / (PACE_WITHIN * updates)
    if needed <= current_lr:
        return None
    value = float(f"{needed:.2g}")
    return Choice("alpha_lr", value,
                  f"reward per step {profile.reward_abs_mean:.3g}: the temperature must fall from {init_alpha:g} to "
                  f"{alpha_min:.2g} within {int(PACE_WITHIN * updates):,} of {updates:,} updates",
                  "at a slower pace the entropy bonus outweighs the reward all run (docs/neorl2.md, RAVL and NEUBAY "
                  "on Simglucose: the temperature's pace)")


def standardise(profile: DataProfile) -> Choice | None:
    if not profile.unequal_scales:
        return None
    return Choice("normalize_obs", True,
                  f"observation scales differ {profile.obs_scale_ratio:.3g}-fold",
                  "unstandardised, the networks see the widest observations and hardly the rest")


def hide_time(profile: DataProfile) -> Choice | None:
    dims = tuple(profile.time_tied_observations)
    if not dims:
        return None
    return Choice("ignore_obs_dims", dims,
                  f"observation dims {list(dims)} track the time step and the dynamics ignore them",
                  "a policy that sees them learns where along an episode the logging policy changed, not how to act "
                  "(docs/findings.md, SafetyHalfCheetah)")


def placed_table(placed: list[tuple[str | None, Choice]]) -> list[dict]:
    """`choices_for`'s choices as JSON rows: section (None: the run's own field), field, value, fact, source."""
    return [{"section": section, "field": c.field, "value": list(c.value) if isinstance(c.value, tuple) else c.value,
             "fact": c.fact, "source": c.source} for section, c in placed]



def model_choices(profile) -> list[Choice]:
    """The choices read from a fitted model's profile (`mbrl.model_profile.ModelProfile`)."""
    choices = []
    if profile.variance_is_jumps:
        dims = [d for d in profile.jumping_targets if d < len(profile.spread_over_error) - 1]
        ratio = max(profile.spread_over_error[d] for d in dims)
        choices.append(Choice(
            "model_noise", False,
            f"observation dims {dims} jump; on held-out rows without a jump the model's predicted spread of their "
            f"change is up to {ratio:.3g} times its error",
            "its variance stands for the jumps, not for its error: sampling it makes every imagined step wander "
            "(docs/neorl2.md, Mean imagined steps on DMSD)"))
    if profile.trusted_horizon is not None:
        choices.append(Choice(
            "horizon", profile.trusted_horizon,
            f"the k-step error stays within {profile.thresholds['k_step_tolerance']:g} of the observations' variance "
            f"up to {profile.trusted_horizon} steps",
            "imagined steps beyond it are the model's drift, not the task (MOPO's horizon trades the same)"))
    return choices


def choices_for(profile: DataProfile, updates: int, sections: Mapping[str, Any]) -> list[tuple[str | None, Choice]]:
    """Each data rule's choice for an agent of `updates` updates whose own config sections are `sections` (name ->
    section), with where it goes: the name of each section that has the field, or None for a field of the run
    itself. The temperature's pace is sized for each section's own start and rate."""
    target = target_entropy(profile)
    goal = target.value if target is not None else -float(len(profile.actions))
    out: list[tuple[str | None, Choice]] = [(None, c) for c in (standardise(profile), hide_time(profile)) if c]
    for name, section in sections.items():
        if target is not None and hasattr(section, "target_entropy"):
            out.append((name, target))
        if hasattr(section, "alpha_lr") and hasattr(section, "init_alpha"):
            pace = alpha_pace(profile, updates, section.init_alpha, goal, section.alpha_lr)
            if pace is not None:
                out.append((name, pace))
    return out


def as_overrides(placed: list[tuple[str | None, Choice]], scales_observations: bool,
                 model_section: str | None = None, model_fields: tuple[str, ...] = ()) -> dict:
    """The nested overrides that put `choices_for`'s choices in place. A run-level observation choice is dropped
    for an algorithm that scales its observations itself (`scales_observations` False); hidden observations are
    also the world model's invariant inputs where its section (`model_section`) has `invariant_obs_dims`."""
    out: dict = {}
    for section, choice in placed:
        if section is not None:
            out.setdefault(section, {})[choice.field] = choice.value
            continue
        if scales_observations:
            out[choice.field] = choice.value
        if choice.field == "ignore_obs_dims" and model_section and "invariant_obs_dims" in model_fields:
            out.setdefault(model_section, {})["invariant_obs_dims"] = choice.value
    return out
