"""mbrl.config: each algorithm has only the sections it reads (refused from the command line and from config
files alike), bad values name their field, and `mbrl model fit` shares `mbrl train`'s --ensemble/--fit options.

No training happens here: every refusal comes before a dataset is loaded.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import tyro

from mbrl.agents import registry
from mbrl.agents.mopo import HORIZON_PENALTY as MOPO_DATASETS, NEORL2_HORIZON_PENALTY as MOPO_NEORL2
from mbrl.agents.neubay_presets import PER_DATASET as NEUBAY_DATASETS
from mbrl.agents.sac_n import SACNConfig
from mbrl import config as config_io
from mbrl.cli import main
from mbrl.commands.model import FitArgs
from mbrl.core.errors import ConfigError
from mbrl.world_models.ensemble import EnsembleConfig
from mbrl.world_models.fit import FitConfig


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def all_sections(config) -> dict:
    """`config` as an old-style config.json held it: every section, read or not."""

    def convert(value):
        if dataclasses.is_dataclass(value):
            return {f.name: convert(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return list(value) if isinstance(value, tuple) else value

    return {"version": config_io.CONFIG_VERSION, **convert(config)}


# -------------------------------------------------------------------------------------------------
# Refusals on the command line


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algo", "bc", "--sac.num-critics", "5"],
         "--sac.num-critics: not read by algorithm bc, which reads --bc.*, --schedule.*, --select.*, --logging.*"),
        (["--algo", "neubay", "--imagination.horizon", "3"],
         "--imagination.horizon: not read by algorithm neubay, which reads --neubay.*, --imagination.per-seed-model, "
         "--ensemble.*, --fit.*, --schedule.*, --select.*, --logging.*"),
        (["--algo", "bc", "--ensemble.num-members", "3", "--fit.max-epochs", "2"],
         "--ensemble.num-members, --fit.max-epochs: not read by algorithm bc"),
        (["--algo", "ravl", "--mopo.penalty-coef", "2"], "--mopo.penalty-coef: not read by algorithm ravl"),
        (["--algo", "mopo", "--neubay.utd", "0.1"], "--neubay.utd: not read by algorithm mopo"),
    ],
)
def test_train_refuses_options_the_algorithm_does_not_read(argv, message, capsys):
    assert main(["train", *argv]) == 2
    assert one_line_error(capsys).startswith(f"mbrl: error: {message}")


def test_train_accepts_exactly_the_fields_the_algorithm_reads():
    def resolve(*argv):
        return config_io.resolve(tyro.cli(config_io.TrainArgs, args=list(argv)))

    neubay = resolve("--algo", "neubay", "--imagination.per-seed-model", "True", "--neubay.utd", "0.02")
    assert neubay.imagination.per_seed_model and neubay.neubay.utd == 0.02
    bc = resolve("--algo", "bc", "--bc.batch-size", "64", "--schedule.epochs", "3", "--seeds", "2")
    assert (bc.bc.batch_size, bc.schedule.epochs, bc.seeds) == (64, 3, 2)
    mopo = resolve("--algo", "mopo", "--mopo.penalty-coef", "2.5", "--imagination.horizon", "3")
    assert (mopo.mopo.penalty_coef, mopo.imagination.horizon) == (2.5, 3)


def test_mopo_takes_neorl2s_per_task_settings_and_drops_the_anchor_only_where_measured():
    # polixir/NeoRL2 benchmark/results/<Task>-mopo/log.csv, the (horizon, penalty) of report_result.py's choice.
    dmsd = config_io.build("mopo", "neorl2:DMSD", "quick")
    assert (dmsd.mopo.penalty_coef, dmsd.mopo.uncertainty) == (0.5, "aleatoric_max")
    assert dmsd.imagination.horizon == 20  # NeoRL-2's 1 was chosen for sampled steps; DMSD's are the mean (measured)
    assert (dmsd.sac.actor_bc_coef, dmsd.imagination.real_ratio) == (0.0, 0.05)
    glucose = config_io.build("mopo", "neorl2:Simglucose", "quick")
    assert (glucose.imagination.horizon, glucose.mopo.penalty_coef) == (1, 5.0)
    assert (glucose.sac.actor_bc_coef, glucose.imagination.real_ratio) == (2.5, 0.5)  # the quick anchor kept
    cheetah = config_io.build("mopo", "neorl2:SafetyHalfCheetah", "paper")
    assert (cheetah.mopo.penalty_coef, cheetah.sac.actor_bc_coef) == (5.0, 0.0)
    # NeoRL-2's h 5 gave way to a measured one step with 80% of each batch real (agents/mopo.py: MEASURED)
    assert (cheetah.imagination.horizon, cheetah.imagination.real_ratio) == (1, 0.8)



def test_ravl_drops_its_anchor_on_dmsd_only():
    dmsd = config_io.build("ravl", "neorl2:DMSD", "quick")
    assert (dmsd.sac.actor_bc_coef, dmsd.imagination.real_ratio) == (0.0, 0.05)
    hopper = config_io.build("ravl", "hopper-medium", "quick")
    assert (hopper.sac.actor_bc_coef, hopper.imagination.real_ratio) == (1.0, 0.5)


def test_neubay_imagines_dmsd_with_the_members_mean_and_no_anchor():
    for preset in ("quick", "paper"):
        dmsd = config_io.build("neubay", "neorl2:DMSD", preset)
        assert (dmsd.neubay.model_noise, dmsd.neubay.actor_bc_coef, dmsd.neubay.max_episode_steps) == (False, 0.0, 100)
    hopper = config_io.build("neubay", "hopper-medium", "quick")
    assert (hopper.neubay.model_noise, hopper.neubay.actor_bc_coef) == (True, 2.5)


@pytest.mark.parametrize("algo", [n for n, e in registry.ALGORITHMS.items() if "model_noise" in e.imagination_fields])
def test_every_flat_rollout_algorithm_imagines_dmsd_with_the_members_mean(algo):
    for preset in ("quick", "paper"):
        assert config_io.build(algo, "neorl2:DMSD", preset).imagination.model_noise is False
        assert config_io.build(algo, "hopper-medium", preset).imagination.model_noise is True
        assert config_io.build(algo, "neorl2:Simglucose", preset).imagination.model_noise is True


@pytest.mark.parametrize("algo", [n for n, e in registry.ALGORITHMS.items() if e.sections.get("sac") is SACNConfig])
def test_every_sac_based_algorithm_lowers_its_target_entropy_on_simglucose_only(algo):
    # Simglucose's insulin sits against the action's lower bound, where -|A| pulls the actor off the data.
    for preset in ("quick", "paper"):
        assert config_io.build(algo, "neorl2:Simglucose", preset).sac.target_entropy == -5.0
        assert config_io.build(algo, "neorl2:DMSD", preset).sac.target_entropy is None
        assert config_io.build(algo, "hopper-medium", preset).sac.target_entropy is None
        # RAVL's 8,000 quick updates need a faster temperature to get there; the others keep their own pace.
        elsewhere = config_io.build(algo, "neorl2:DMSD", preset).sac.alpha_lr
        expected = 1e-3 if algo == "ravl" else elsewhere
        assert config_io.build(algo, "neorl2:Simglucose", preset).sac.alpha_lr == expected

# -------------------------------------------------------------------------------------------------
# config.json: written with the algorithm's sections only; old files load; foreign values are refused


@pytest.mark.parametrize("algo", list(registry.ALGORITHMS))
def test_config_json_holds_only_the_sections_the_algorithm_reads(algo, tmp_path):
    config = config_io.build(algo, "hopper-medium", "quick")
    config_io.save(config, tmp_path / "config.json")
    data = json.loads((tmp_path / "config.json").read_text())
    sections = {k for k, v in data.items() if isinstance(v, dict)}
    assert sections == {*config_io.sections_read(algo), *registry.COMMON_SECTIONS}
    if "imagination" in data:
        assert set(data["imagination"]) == set(registry.entry(algo).imagination_fields)
    assert config_io.load(tmp_path / "config.json") == config
    # A config.json written before: every section, the unread ones at their defaults.
    (tmp_path / "old.json").write_text(json.dumps(all_sections(config)))
    assert config_io.load(tmp_path / "old.json") == config


def test_a_config_file_setting_what_the_algorithm_does_not_read_is_refused(tmp_path, capsys):
    old = all_sections(config_io.build("bc", "hopper-medium", "quick"))
    old["sac"]["num_critics"] = 5
    old["imagination"]["horizon"] = 3
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    with pytest.raises(ConfigError) as info:
        config_io.load(path)
    assert str(info.value) == (f"{path}: sac.num_critics, imagination.horizon: not read by algorithm bc, "
                               "which reads bc.*, schedule.*, select.*, logging.*")
    assert main(["train", "--config", str(path)]) == 2
    assert one_line_error(capsys) == f"mbrl: error: {info.value}"

    neubay = all_sections(config_io.build("neubay", "hopper-medium", "quick"))
    neubay["imagination"]["real_ratio"] = 0.5
    path.write_text(json.dumps(neubay))
    with pytest.raises(ConfigError, match=r"imagination\.real_ratio: not read by algorithm neubay, which reads "
                                          r"neubay\.\*, imagination\.per_seed_model,"):
        config_io.load(path)


def test_options_on_top_of_a_config_file_are_checked_against_its_algorithm(tmp_path, capsys):
    path = tmp_path / "config.json"
    config_io.save(config_io.build("bc", "hopper-medium", "quick"), path)
    assert main(["train", "--config", str(path), "--sac.eta", "1.0"]) == 2
    assert one_line_error(capsys).startswith("mbrl: error: --sac.eta: not read by algorithm bc")
    resolved = config_io.resolve(tyro.cli(config_io.TrainArgs, args=["--config", str(path), "--bc.batch-size", "32"]))
    assert resolved.bc.batch_size == 32 and resolved.algo == "bc"


def test_a_train_config_holds_defaults_in_the_sections_its_algorithm_does_not_read():
    with pytest.raises(ConfigError, match=r"^sac\.num_critics: not read by algorithm bc"):
        config_io.TrainConfig(algo="bc", sac=SACNConfig(num_critics=5))
    config_io.TrainConfig(algo="bc", sac=SACNConfig())  # the default is what an unread section holds
    with pytest.raises(ConfigError, match=r"^imagination\.horizon: not read by algorithm neubay"):
        config_io.build("neubay", "hopper-medium", "quick", {"imagination": {"horizon": 2, "per_seed_model": True}})
    assert config_io.build("neubay", "hopper-medium", "quick", {"imagination": {"per_seed_model": True}}).imagination.per_seed_model


# -------------------------------------------------------------------------------------------------
# Presets and the registry


def test_every_preset_sets_only_what_its_algorithm_reads():
    datasets = [None, "hopper-medium", *MOPO_DATASETS, *MOPO_NEORL2, *NEUBAY_DATASETS]
    for algo in registry.ALGORITHMS:
        for name in registry.PRESETS:
            for dataset in datasets:
                preset = registry.entry(algo).preset(name, dataset)
                assert config_io.unread(algo, preset) == [], (algo, name, dataset)
                assert set(preset) <= {*config_io.sections_read(algo), *registry.COMMON_SECTIONS, *config_io.TOP_LEVEL}
                if algo == "mopo-ppo":  # its own normaliser refuses the run's observation scale
                    assert "ignore_obs_dims" not in preset and "normalize_obs" not in preset, (algo, name, dataset)


def test_td3_bc_and_mopo_alone_ignore_safetyhalfcheetahs_absolute_position():
    # rootx is observation 0 of NeoRL-2's SafetyHalfCheetah (qpos first, rootx first); hiding it was measured to
    # raise TD3+BC's and MOPO's scores only (agents/presets.py: POSITION_DIMS; MOPO's world model too).
    for algo in registry.ALGORITHMS:
        config = config_io.build(algo, "neorl2:SafetyHalfCheetah", "quick")
        assert config.ignore_obs_dims == ((0,) if algo in ("td3-bc", "mopo") else ()), algo
        assert config.ensemble.invariant_obs_dims == ((0,) if algo == "mopo" else ()), algo
        assert config_io.build(algo, "neorl2:DMSD", "quick").ignore_obs_dims == (), algo
        assert config_io.build(algo, "neorl2:DMSD", "quick").ensemble.invariant_obs_dims == (), algo
    assert config_io.build("td3-bc", "neorl2:SafetyHalfCheetah", "quick", {"ignore_obs_dims": []}).ignore_obs_dims == ()
    assert config_io.build("mopo", "neorl2:SafetyHalfCheetah", "quick").normalize_obs  # as its 75.7 was measured
    assert not config_io.build("mopo", "neorl2:DMSD", "quick").normalize_obs


# -------------------------------------------------------------------------------------------------
# Bad values: one field named, from its section's __post_init__


@pytest.mark.parametrize(
    "algo, overrides, message",
    [
        ("ravl", {"sac": {"num_critics": 0}}, "sac.num_critics: expected a positive int, found 0"),
        ("ravl", {"sac": {"eta": 1.0, "num_critics": 1}}, "sac.eta: the EDAC term (eta=1.0) needs sac.num_critics >= 2"),
        ("ravl", {"sac": {"hidden_sizes": "big"}}, "sac.hidden_sizes: expected a list, found 'big'"),
        ("ravl", {"schedule": {"epochs": -3}}, "schedule.epochs: expected a positive int, found -3"),
        ("ravl", {"imagination": {"real_ratio": 1.5}}, "imagination.real_ratio: expected a value in [0, 1], found 1.5"),
        ("ravl", {"sac": {"critic_learning_rate": 1e-3}}, "sac.critic_learning_rate: unknown field"),
        ("ravl", {"seeds": 0}, "seeds: expected a positive int, found 0"),
        ("ravl", {"sac": {"actor_bc_coef": -0.1}}, "sac.actor_bc_coef: expected a value >= 0, found -0.1"),
        ("ravl", {"sac": {"actor_bc_coef": 0.4}, "imagination": {"real_ratio": 0.0}},
         "sac.actor_bc_coef: the BC term imitates the real rows of each batch"),
        ("bc", {"bc": {"learning_rate": 0.0}}, "bc.learning_rate: expected a value > 0, found 0.0"),
        ("mopo", {"mopo": {"penalty_coef": -1.0}}, "mopo.penalty_coef: expected a value >= 0, found -1.0"),
        ("neubay", {"neubay": {"sampled_critics": 20}}, "neubay.sampled_critics: expected at most num_critics=10"),
        ("ravl", {"ensemble": {"num_elites": 9}}, "ensemble.num_elites: expected a value in [1, num_members=7], found 9"),
        ("ravl", {"fit": {"max_epochs": 0}}, "fit.max_epochs: expected a positive int or None, found 0"),
    ],
)
def test_bad_values_raise_one_config_error_naming_the_field(algo, overrides, message):
    with pytest.raises(ConfigError) as info:
        config_io.build(algo, "hopper-medium", "quick", overrides)
    assert str(info.value).startswith(message), str(info.value)


# -------------------------------------------------------------------------------------------------
# `mbrl model fit`: the same --ensemble.* / --fit.* options as `mbrl train`


def test_model_fit_and_train_read_ensemble_and_fit_options_alike():
    argv = ["--ensemble.num-members", "3", "--ensemble.num-elites", "2", "--ensemble.hidden-dims", "16", "16",
            "--ensemble.layer-norm", "True", "--fit.max-epochs", "4", "--fit.learning-rate", "0.002",
            "--fit.sampling", "permutation"]
    train = config_io.resolve(tyro.cli(config_io.TrainArgs, args=["--algo", "ravl", "--preset", "paper", *argv]))
    given = config_io.given_options(tyro.cli(FitArgs, args=["--dataset", "unused", *argv]))
    assert config_io.override(EnsembleConfig(), given["ensemble"], "ensemble") == train.ensemble
    assert config_io.override(FitConfig(), given["fit"], "fit") == train.fit
    assert train.ensemble == EnsembleConfig(num_members=3, num_elites=2, hidden_dims=(16, 16), layer_norm=True)

    def names(cls, section):
        nested = next(f for f in dataclasses.fields(cls) if f.name == section).default_factory
        return [f.name for f in dataclasses.fields(nested)]

    for section, cls in (("ensemble", EnsembleConfig), ("fit", FitConfig)):
        assert names(FitArgs, section) == names(config_io.TrainArgs, section) == [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ensemble.num-members", "3", "--ensemble.num-elites", "4"], "ensemble.num_elites: expected a value in [1, num_members=3], found 4"),
        (["--fit.max-epochs", "0"], "fit.max_epochs: expected a positive int or None, found 0"),
        (["--ensemble.hidden-dims", "0"], "ensemble.hidden_dims: expected positive widths, found (0,)"),
    ],
)
def test_model_fit_refuses_bad_options_before_loading_anything(argv, message, tmp_path, capsys):
    missing = tmp_path / "missing.hdf5"  # never opened: the options are checked first
    assert main(["model", "fit", "--dataset", str(missing), *argv]) == 2
    assert one_line_error(capsys) == f"mbrl: error: {message}"


def test_the_readme_sections_table_says_what_each_algorithm_reads():
    """README's table of `mbrl train` sections: each row is what the registry says its algorithm reads."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = text[text.index("| algorithm | sections |"):].split("\n\n")[0].splitlines()[2:]
    rows = {cells[0].strip(" `"): [c.strip(" `") for c in cells[1].split(",")]
            for cells in (line.strip("|").split("|") for line in table)}
    assert set(rows) == set(registry.ALGORITHMS)  # every algorithm has its row
    for algo, sections in rows.items():
        assert sections == [name for name in config_io.reads(algo) if name not in registry.COMMON_SECTIONS], algo


def test_a_config_file_that_is_missing_or_not_json_is_one_line_naming_the_file(tmp_path, capsys):
    path = tmp_path / "config.json"
    with pytest.raises(ConfigError, match=r"config\.json: no such config file$"):
        config_io.load(path)
    path.write_text('{"algo": "ravl",\n')
    with pytest.raises(ConfigError, match=r"config\.json: not a valid JSON file \("):
        config_io.load(path)
    assert main(["train", "--config", str(path)]) == 2
    assert "not a valid JSON file" in one_line_error(capsys)
