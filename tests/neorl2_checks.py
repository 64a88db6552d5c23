"""Checks every NeoRL-2 task's test file makes against its released files: the arrays fixture (one per file, module
scope), the twin of the jitted reward, and the reward and termination functions on any batch axes."""

from __future__ import annotations

import numpy as np
import pytest

from neorl2_files import neorl2_arrays


def arrays_fixture(files):
    """A module-scoped fixture `arrays`, parametrised over `files` (names of NeoRL-2 .npz files)."""

    @pytest.fixture(scope="module", params=files)
    def arrays(request):
        return neorl2_arrays(request.param)

    return arrays


def assert_numpy_twin_reproduces_file(task, arrays):
    """The env's numpy twin `task._reward_np` computes as NeoRL-2 does and agrees exactly on a sample of rows."""
    rows = np.arange(0, len(arrays["reward"]), 97)
    twin = np.array([task._reward_np(arrays["next_obs"][i]) for i in rows], np.float32)
    np.testing.assert_array_equal(twin, arrays["reward"][rows])


def assert_any_batch_axes(task, arrays):
    """`task.reward` and `task.terminated` take (3, 20) leading axes and keep them; termination is bool."""
    obs, act, nxt = (arrays[k][:60].reshape(3, 20, -1) for k in ("obs", "action", "next_obs"))
    assert task.reward(obs, act, nxt).shape == (3, 20)
    assert task.terminated(obs, act, nxt).shape == (3, 20)
    assert task.terminated(obs, act, nxt).dtype == bool
