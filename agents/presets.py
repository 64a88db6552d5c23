"""The parts that several algorithms' presets share, as data; each algorithm's presets live in its own module.

A preset is a nested dict of overrides keyed like the sections of `mbrl.config.TrainConfig` (`sac`, `bc`, `mopo`,
`imagination`, `schedule`, `ensemble`, `fit`). `mbrl.config` applies them in order: the algorithm's preset, then
its per-dataset entry (`mbrl.agents.base.AlgorithmEntry.preset`). No code path depends on a name here.

`paper`: the published settings. `quick`: sized for `mbrl train` with no options (dataset make, model fit,
training, evaluation) on a 2-core CPU machine with no GPU: fewer updates, smaller rollout batches, a fit time
budget. How long that takes and what the presets score, as measured: docs/results.md.
"""

from __future__ import annotations

from mbrl.agents.base import PRESET_NAMES, merge_sections

PRESETS: tuple[str, ...] = PRESET_NAMES

# The settings every model-based agent shares in the papers: 7 members / 5 elites (MOPO base.py
# `num_networks`, `num_elites`), 50,000 rollouts per 1,000 updates, 5 epochs of model data retained,
# 5% real data in each batch (MOPO base.py `rollout_batch_size`, `model_retain_epochs`, `real_ratio`;
# RAVL anyasims/edge-of-reach train_ravl_agent.py `rollouts_per_epoch`, `buffer_retain_epochs`,
# `dataset_ratio`).
IMAGINATION_PAPER = {"rollouts_per_epoch": 50_000, "retain_epochs": 5, "real_ratio": 0.05, "horizon": 5}

# The quick versions: a model fit capped at a time budget, 5x fewer rollouts per epoch, evaluation on the
# real env every few epochs.
IMAGINATION_QUICK = {"rollouts_per_epoch": 10_000, "retain_epochs": 5, "real_ratio": 0.05, "horizon": 5}
FIT_QUICK = {"max_seconds": 150.0, "max_epochs": 60}

# The quick presets' anchor (MOPO, RAVL): a TD3+BC-style BC term on the actor's deterministic action (a weight of
# the batch's mean |Q|; see `mbrl.agents.sac_n.SACNConfig.actor_bc_coef`) over the real half of each batch, as in
# Unifloral's model-based ReBRAC (Jackson et al. 2025, "A Clean Slate for Offline RL"), because the critics are
# far from converged after the 8k to 20k updates a CPU affords. `--sac.actor-bc-coef 0
# --imagination.real-ratio 0.05` gives the pure algorithms at the quick budget.
ANCHOR_REAL_RATIO = 0.5

# The smallest sizes every model-based algorithm's smoke run shares (tests, `AlgorithmEntry.smoke`).
SMOKE_IMAGINATION = {"rollouts_per_epoch": 32, "horizon": 2, "retain_epochs": 2}

# What a task's imagination needs beyond the defaults, for every algorithm that rolls out an MLP ensemble (their
# per-dataset presets add it). DMSD (`mbrl.envs.neorl2.dmsd`) is a linear system without process noise, but its targets
# jump once, unpredictably, in most episodes: each member's variance mostly stands for those jumps (its predicted std
# of a target's change is 18 times or more its error on the rows without a jump), and sampling it makes the imagined
# targets wander, so the imagined reward, which pays for the distance to the target down to 0.01, is mostly noise.
# Imagined steps take each member's mean there. Measured (docs/neorl2.md, "Mean imagined steps on DMSD"): MOPO at
# NeoRL-2's DMSD setting, one world model, seed 0, 63.6 sampled and 83.6 with the mean.
DETERMINISTIC_IMAGINATION = {"dmsd": "docs/neorl2.md, Mean imagined steps on DMSD"}


# Where the data's actions sit against a bound of the action space, SAC's default target entropy (-|A|) cannot be met
# near them: the temperature grows until the entropy term moves the actor's actions off the bound, away from the data.
# Simglucose's insulin is -0.9915 ± 0.03 on [-1, 1] (a Gaussian of that spread has entropy -2.1); at a target of -1,
# MOPO's temperature rose from 1 to 6.1 over 20,000 updates and its dose went to -0.965 on the data's states, four
# times the data's insulin, and the patients' glucose left [40, 600] early. Every SAC-based agent takes the lower target
# there (`mbrl train` notes a dataset whose actions have less entropy than the target). Measured (docs/findings.md,
# "Simglucose"): MOPO's quick preset, 3 seeds, 21.1 at -1, 72.9 at -3, 82.4 at -5.
TARGET_ENTROPY = {"simglucose": -5.0}

# How fast the temperature must fall there for an agent of few updates. Adam moves log alpha by about its learning rate
# an update whatever the entropy's gap, so at SAC-N's 3e-4 (from 1.0) or NEUBAY's 1e-4 (from 0.2) an agent of 8,000
# updates ends with alpha near 0.1, large beside its critics' values (about 30 on Simglucose), and the entropy term
# kept its dose off the data's. At 1e-3 alpha fell to 0.001 (RAVL) and 0.004 (NEUBAY) and the dose stayed at the
# data's. Measured (docs/neorl2.md, "RAVL and NEUBAY on Simglucose: the temperature's pace"; 3 seeds, target -5):
# RAVL 18.0 -> 85.6, NEUBAY 25.3 -> 62.7. MOPO (20,000 updates) scores 82.4 at SAC-N's pace and keeps it.
LOW_TARGET_ALPHA_LR = 1e-3


# NeoRL-2 SafetyHalfCheetah observes the cheetah's absolute x (rootx, dimension 0; NeoRL2 neorl2/envs/
# safetyhalfcheetah.py keeps it for the reward), on which the dynamics do not depend (a flat plane) and which the data
# ties to the time step: its behaviour policy runs at 2.59 m/s on average over steps 100 to 200 of every episode and
# slows to 1.52 over the last 100 (each of the 18 train episodes alike), so an agent that sees x learns where along the
# track to slow down. A preset hides it (`ignore_obs_dims`) where that was measured to raise the score. Measured
# (docs/findings.md, "SafetyHalfCheetah"; 100 episodes a seed): TD3+BC 72.0 seeing x, 76.2 without (3 seeds each),
# so its preset hides it; BC 71.8 and 69.2, so its preset does not. MOPO's hides it with its own measured settings
# (`mbrl.agents.mopo.MEASURED`).
POSITION_DIMS = {"safetyhalfcheetah": (0,)}


def sac_per_dataset(dataset: str | None) -> dict:
    """The `sac` overrides every SAC-based algorithm shares on `dataset` (may be empty)."""
    return {"target_entropy": TARGET_ENTROPY[dataset]} if dataset in TARGET_ENTROPY else {}


def with_sac_per_dataset(overrides: dict, dataset: str | None) -> dict:
    """`overrides` with `sac_per_dataset(dataset)` added to its `sac` section (unchanged where that is empty)."""
    shared = sac_per_dataset(dataset)
    return merge_sections(overrides, {"sac": shared}) if shared else overrides


def imagination_per_dataset(dataset: str | None) -> dict:
    """The `imagination` overrides of `dataset` every flat-rollout algorithm shares (may be empty)."""
    return {"model_noise": False} if dataset in DETERMINISTIC_IMAGINATION else {}


def without_anchor(overrides: dict) -> dict:
    """`overrides` with the pure algorithm's values in place of the quick presets' anchor: no BC term, the papers'
    share of real data (for the datasets where a measurement found the pure one better)."""
    return merge_sections(overrides, {"sac": {"actor_bc_coef": 0.0},
                                      "imagination": {"real_ratio": IMAGINATION_PAPER["real_ratio"]}})
