"""Each observation followed by its change since the step before: the task `<task>+change`, the dataset
`<dataset>+change`.

Where an observation leaves out a rate of change that the last step shows, the change gives it back to the world
model and the policy alike: NeoRL-2's Simglucose observes the glucose reading but not its trend, which the last
step's change carries (docs/findings.md). The change itself, not the previous observation, is appended: fed
[o_t, o_{t-1}], an MLP has to amplify the small difference of two standardised inputs, and a fitted ensemble did
not.

The observation becomes [o_t, o_t - o_{t-1}], the change 0 at an episode's first step. A dataset's rows take it from
the row before within the same episode; the simulator's env is wrapped to append it (`mbrl.envs.change`); the
task's reward and termination functions read the first half. Everything downstream (fitting, imagination,
training, evaluation, export, `deploy --robot sim:...`, fine-tuning) sees a task whose observation is twice as
wide. `mbrl deploy` computes the change for a robot that sends o_t alone (`mbrl.envs.robots.runner.ChangeFeed`);
`mbrl finetune` takes `sim:TASK+change` but not a networked robot's bare observations.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mbrl.core.errors import DatasetError
from mbrl.core.types import CHANGE_SUFFIX, OfflineDataset


def base_name(name: str) -> str | None:
    """`name` without its `+change` (any case), or None when it has none."""
    return name[: -len(CHANGE_SUFFIX)] if name.lower().endswith(CHANGE_SUFFIX) else None


def changes(obs: np.ndarray, episode_starts: np.ndarray) -> np.ndarray:
    """Each row's observation minus the row before's; 0 on an episode's first row."""
    out = np.zeros_like(obs)
    out[1:] = obs[1:] - obs[:-1]
    out[np.asarray(episode_starts, np.int64)] = 0.0
    return out


def with_change(dataset: OfflineDataset) -> OfflineDataset:
    """The dataset observed as [o_t, o_t - o_{t-1}], its next observation as [o_{t+1}, o_{t+1} - o_t]; its held-out
    data too. The rows of an episode must follow each other (a row's next observation is the next row's
    observation)."""
    t, starts = dataset.transitions, np.asarray(dataset.episode_starts, np.int64)
    inside = np.setdiff1d(np.arange(1, len(t)), starts)  # rows that continue the row before them
    if len(inside):
        gap = ~np.all(t.next_obs[inside - 1] == t.obs[inside], axis=1)
        if gap.any():
            row = int(inside[np.argmax(gap)])
            raise DatasetError(f"{dataset.info.source}: row {row}'s obs differs from row {row - 1}'s next_obs inside an "
                               f"episode; `{CHANGE_SUFFIX}` needs each episode's rows in order")
    transitions = t.replace(obs=np.concatenate([t.obs, changes(t.obs, starts)], axis=1),
                            next_obs=np.concatenate([t.next_obs, t.next_obs - t.obs], axis=1))
    info = dataclasses.replace(dataset.info, name=f"{dataset.info.name}{CHANGE_SUFFIX}",
                               source=f"{dataset.info.source}{CHANGE_SUFFIX}", obs_dim=2 * dataset.info.obs_dim,
                               task=None if dataset.info.task is None else f"{dataset.info.task}{CHANGE_SUFFIX}")
    heldout = None if dataset.heldout is None else with_change(dataset.heldout)
    return dataclasses.replace(dataset, transitions=transitions, info=info, heldout=heldout)
