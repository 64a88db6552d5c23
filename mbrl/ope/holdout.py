"""FQE checked on episodes held out from its fit: the split of a dataset into the episodes a fit sees and those
it is checked on, and FQE's value of each member of a population (the sweep's `fqe` objective, `--select.by fqe`,
`mbrl ope`)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from mbrl.core.errors import ConfigError
from mbrl.core.types import OfflineDataset, Transitions
from mbrl.ope.judged import agent_policy, fqe_of


def split_holdout(dataset: OfflineDataset, fraction: float, seed: int = 0) -> tuple[OfflineDataset, Transitions | None]:
    """The dataset without a random `fraction` of its episodes, and those episodes' transitions; a dataset with
    held-out data of its own (a NeoRL-2 `-val` file) keeps every episode and is checked on that data instead."""
    if dataset.heldout is not None:
        return dataset, dataset.heldout.transitions
    count = int(round(fraction * dataset.num_episodes))
    if count == 0 or dataset.num_episodes < 2:
        return dataset, None
    count = min(count, dataset.num_episodes - 1)
    held = np.zeros(dataset.num_episodes, bool)
    held[np.random.default_rng(seed).choice(dataset.num_episodes, count, replace=False)] = True
    lengths = dataset.episode_lengths()
    row_held = np.repeat(held, lengths)
    kept_lengths = lengths[~held]
    starts = np.concatenate([[0], np.cumsum(kept_lengths)[:-1]]).astype(dataset.episode_starts.dtype)
    train = dataclasses.replace(dataset, transitions=dataset.transitions.slice(np.flatnonzero(~row_held)),
                                episode_starts=starts)
    return train, dataset.transitions.slice(np.flatnonzero(row_held))


def fqe_values(trainer, state, train: OfflineDataset, heldout: Transitions | None, config) -> list[tuple[float, float]]:
    """Per member of the population: FQE's discounted value (`mbrl.ope.fqe`, settings `config`) of its greedy policy
    and the low end of its interval, fitted on `train` and checked on `heldout`, at `train`'s initial states. A
    recurrent policy acts on each logged episode's history (`mbrl.ope.judged.JudgedPolicy`)."""
    if heldout is None or len(heldout) == 0:
        raise ConfigError("--objective fqe: no held-out episodes to check FQE's fit on; give --holdout (or a -val file)")
    agent = trainer.agent
    initial = train.transitions.obs[train.episode_starts]
    members = jax.tree.leaves(state.agent)[0].shape[0]
    values = []
    for i in range(members):
        params = jax.tree.map(lambda x, i=i: x[i], agent.actor_params(state.agent))
        result = fqe_of(agent_policy(agent, params, f"member {i}"), train.transitions, heldout, initial, config)
        values.append((result.value, result.interval[0]))
    return values
