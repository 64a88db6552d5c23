"""Checkpoints of a training run with orbax: the whole training state plus a small JSON record.

The state is any pytree of arrays (agent, buffers, RNG keys, step; with a leading seed axis when
seeds are vmapped). The record names what is not an array: the epoch, the updates done and where the
world model lives. orbax writes each step into a temporary directory and renames it into place, so a
checkpoint is either complete or absent; the newest `max_to_keep` are kept (None: all).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from mbrl.core.errors import UserError


class Checkpointer:
    """Save and restore `(state, record)` pairs under `directory/<epoch>/`."""

    def __init__(self, directory: str | Path, max_to_keep: int | None = 2):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, epoch: int, state: Any, record: dict) -> None:
        if epoch in self._manager.all_steps():  # a re-save at the same epoch (e.g. a signal right after one)
            return
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), record=ocp.args.JsonSave(record))
        self._manager.save(epoch, args=args, force=True)
        self._manager.wait_until_finished()

    def all_epochs(self) -> list[int]:
        return sorted(int(step) for step in self._manager.all_steps())

    def latest_epoch(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, like: Any, epoch: int | None = None) -> tuple[Any, dict]:
        """The state (shaped like the pytree `like`, arrays or ShapeDtypeStructs) and record at `epoch` (default: latest)."""
        epoch = self.latest_epoch() if epoch is None else epoch
        if epoch is None:
            raise UserError(f"{self.directory}: no checkpoint to resume from")
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), like)
        try:
            restored = self._manager.restore(
                epoch, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), record=ocp.args.JsonRestore())
            )
        except Exception as exc:  # orbax raises many kinds for a damaged or mismatched checkpoint
            raise UserError(
                f"{self.directory / str(epoch)}: cannot restore the checkpoint ({type(exc).__name__}: {exc})"
            ) from None
        # Restored arrays are committed to a device; fresh ones are not. jit keys its cache on that, so
        # hand back uncommitted copies: a resumed run reuses the programs compiled for a fresh one.
        state = jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), restored["state"])
        return state, dict(restored["record"])

    def close(self) -> None:
        self._manager.close()
