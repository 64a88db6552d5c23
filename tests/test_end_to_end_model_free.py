"""The end-to-end path of `test_end_to_end.py` for every algorithm that trains on the data alone (no world model);
a file of its own so that it runs beside the model-based half."""

from __future__ import annotations

import pytest

from mbrl.agents import registry
from test_end_to_end import train_resume_eval_export_deploy


@pytest.mark.parametrize("algo", [name for name, entry in registry.ALGORITHMS.items() if not entry.uses_model])
def test_train_resume_eval_export_deploy(algo, hopper_tiny_path, tmp_path, capsys):
    train_resume_eval_export_deploy(algo, hopper_tiny_path, None, tmp_path, capsys)
