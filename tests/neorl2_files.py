"""Where the released NeoRL-2 files are for the tests, and the skip where they are not.

`$MBRL_NEORL2_TEST_DIR`, else `../shared/data/neorl2/` beside the repository (its README holds md5s,
licence and the published table). Tests that read them skip, saying so, where the folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

NEORL2_DIR = Path(os.environ.get("MBRL_NEORL2_TEST_DIR") or Path(__file__).resolve().parents[2] / "shared" / "data" / "neorl2")


def neorl2_file(name: str) -> Path:
    """The released file `name` (e.g. `DMSD-high-100000-train.npz`); the test skips where it is absent."""
    path = NEORL2_DIR / name
    if not path.is_file():
        pytest.skip(f"the released NeoRL-2 file {name} is not here (looked in {NEORL2_DIR}); "
                    "set MBRL_NEORL2_TEST_DIR to the folder that holds it")
    return path


def neorl2_arrays(name: str) -> dict[str, np.ndarray]:
    """The file's arrays as numpy: obs, next_obs, action, reward, done, truncated."""
    with np.load(neorl2_file(name)) as archive:
        return {key: archive[key] for key in archive.files}
