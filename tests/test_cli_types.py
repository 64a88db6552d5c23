"""The options of `mbrl finetune`, `mbrl sweep` and `mbrl deploy` are generated from their config dataclasses
(`mbrl.config.option_fields`): the defaults are the classes' own, the flags users type keep their names, and a
value of the wrong type is one line on stderr and exit 2."""

from __future__ import annotations

import dataclasses

import pytest
import tyro

from mbrl import config as config_io
from mbrl.cli import main
from mbrl.commands.deploy import DeployArgs
from mbrl.commands.finetune import FinetuneArgs
from mbrl.commands.sweep import SweepArgs
from mbrl.envs.robots.connect import SimOptions
from mbrl.envs.robots.safety import SafetyConfig
from mbrl.finetune import FinetuneConfig
from mbrl.sweep.engine import SweepOptions


@pytest.mark.parametrize("argv, flag", [
    (["finetune", "RUN", "--robot", "mujoco:Hopper-v5", "--steps", "abc"], "--steps"),
    (["finetune", "RUN", "--robot", "mujoco:Hopper-v5", "--max-delta", "abc"], "--max-delta"),
    (["sweep", "--space", "mopo", "--trials", "x"], "--trials"),
    (["deploy", "EXPORT", "--robot", "udp://h:1", "--rate", "fast"], "--rate"),
    (["deploy", "EXPORT", "--robot", "udp://h:1", "--max-stale-ticks", "two"], "--max-stale-ticks"),
    (["ope", "POLICY", "--dataset", "hopper-medium", "--starts", "many"], "--starts"),
    (["data", "import", "logs.csv", "--task", "robot.toml", "--out", "out", "--format", "3"], "--format"),
])
def test_a_value_of_the_wrong_type_is_one_line_and_exit_2(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err


def test_finetune_options_are_the_configs_fields_with_its_defaults():
    defaults = tyro.cli(FinetuneArgs, args=["RUN", "--robot", "mujoco:Hopper-v5"])
    assert config_io.from_options(FinetuneConfig, defaults, run="RUN") == FinetuneConfig(run="RUN", robot="mujoco:Hopper-v5")
    given = tyro.cli(FinetuneArgs, args=["RUN", "--robot", "udp://h:1", "--steps", "1000", "--warmup", "100", "--scratch",
                                         "--max-delta", "None", "--max-stale-ticks", "3", "--max-obs-age", "0.2"])
    config = config_io.from_options(FinetuneConfig, given, run="RUN")
    assert (config.steps, config.warmup, config.scratch) == (1000, 100, True)
    assert config.safety == SafetyConfig(max_delta=None, max_stale_ticks=3, max_obs_age=0.2)
    assert config_io.changed_options(given, FinetuneArgs(), skip=("robot",)) == [
        "--run", "--steps", "--warmup", "--scratch", "--max-delta", "--max-stale-ticks", "--max-obs-age"]


def test_deploy_safety_and_sim_options_come_from_their_classes():
    args = tyro.cli(DeployArgs, args=["EXPORT", "--robot", "udp://h:1"])
    assert config_io.from_options(SafetyConfig, args.safety) == SafetyConfig()
    assert config_io.from_options(SimOptions, args.sim, noise_seed=args.seed) == SimOptions()
    args = tyro.cli(DeployArgs, args=["EXPORT", "--robot", "udp://h:1", "--max-delta", "0.1", "--max-obs-age", "0.5",
                                      "--safe-action", "0", "0.5", "--obs-latency", "2", "--seed", "4"])
    assert config_io.from_options(SafetyConfig, args.safety) == SafetyConfig(max_delta=0.1, max_obs_age=0.5,
                                                                             safe_action=(0.0, 0.5))
    assert config_io.from_options(SimOptions, args.sim, noise_seed=args.seed) == SimOptions(obs_latency=2, noise_seed=4)


def test_sweep_options_are_sweep_options_fields_with_their_defaults():
    args = tyro.cli(SweepArgs, args=["--space", "mopo"])
    assert config_io.from_options(SweepOptions, args) == SweepOptions()
    args = tyro.cli(SweepArgs, args=["--space", "mopo", "--trials", "8", "--objective-evals", "2", "--sampler-seed", "1"])
    options = config_io.from_options(SweepOptions, args)
    assert (options.trials, options.objective_evals, options.sampler_seed) == (8, 2, 1)
    assert config_io.given_options(args) == {}  # the sweep's own options are not `mbrl train` options
    assert {f.name for f in dataclasses.fields(SweepOptions)} <= {f.name for f in dataclasses.fields(SweepArgs)}
