"""The training loop on a tiny real dataset: resume equals the uninterrupted run, vmapped seeds equal
single runs, MOPO's model buffer holds r - λ·u, and the run directory and CLI behave.

The dataset (conftest's `hopper_tiny_path`) is in D4RL layout, written with h5py from a real Hopper-v5 run of a random policy;
one small world model is fitted once per module and reused through `--world-model`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mbrl.agents import registry
from mbrl import config as config_io
from mbrl import datasets
from mbrl.checkpoint import Checkpointer
from mbrl.core.errors import ConfigError
from mbrl.cli import main as cli_main
from mbrl.imagination import ExploringPolicy
from mbrl.population import member_config, train_population
from mbrl.train import load_run, run
from mbrl.trainer import LAYOUT_MARGIN, hypers_of, trainer_for, trainer_of_data
from mbrl.world_models.rollout import rollout

EPOCHS = 4
TINY = {
    "sac": {"num_critics": 2, "hidden_sizes": [32, 32], "batch_size": 32},
    "bc": {"hidden_sizes": [32, 32], "batch_size": 32},
    "mopo": {"penalty_coef": 1.0},
    "imagination": {"rollouts_per_epoch": 64, "horizon": 3, "retain_epochs": 2},
    "ensemble": {"num_members": 3, "num_elites": 2, "hidden_dims": [32, 32]},
    "fit": {"max_epochs": 2},
    "schedule": {"epochs": EPOCHS, "updates_per_epoch": 25, "eval_every": 2, "eval_episodes": 2, "checkpoint_every": 1},
    "logging": {"progress": False},
}


def tiny_config(algo="mopo", dataset="hopper-tiny.hdf5", **top):
    """TINY's sections that `algo` reads (another algorithm's options are refused)."""
    own = set(config_io.sections_read(algo)) | set(registry.COMMON_SECTIONS)
    return config_io.build(algo, dataset, "quick", {**{k: v for k, v in TINY.items() if k in own}, **top})


@pytest.fixture(scope="module")
def dataset_path(hopper_tiny_path):
    return hopper_tiny_path


@pytest.fixture(scope="module")
def dataset(dataset_path):
    return datasets.load(dataset_path)


@pytest.fixture(scope="module")
def world_model_dir(dataset, tmp_path_factory):
    from mbrl.envs.tasks import TASKS
    from mbrl.world_models.fit import fit_world_model

    config = tiny_config()
    result = fit_world_model(dataset, config=config.ensemble, fit_config=config.fit,
                             termination_fn=TASKS["hopper"].termination_fn, progress=False)
    return result.model.save(tmp_path_factory.mktemp("model") / "world_model")


@pytest.fixture(scope="module")
def full_run(dataset, dataset_path, world_model_dir, tmp_path_factory):
    config = tiny_config(dataset=str(dataset_path))
    return run(config, tmp_path_factory.mktemp("runs") / "full", world_model_dir=world_model_dir, dataset=dataset)


def comparable(records):
    return [{k: r[k] for k in ("epoch", "updates", "train", "eval") if k in r} for r in records]


def test_a_run_writes_its_directory(full_run, dataset):
    run_dir = full_run.run_dir
    for name in ("config.json", "run.json", "profile.json", "metrics.jsonl", "learning_curve.png"):
        assert (run_dir / name).is_file(), name
    profile = json.loads((run_dir / "profile.json").read_text())  # the data's profile, as `mbrl data profile` gives
    assert profile["transitions"] == len(dataset) and len(profile["actions"]) == dataset.info.act_dim
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())[-1] == EPOCHS
    assert config_io.load(run_dir / "config.json") == full_run.config
    assert [r["epoch"] for r in full_run.records] == list(range(1, EPOCHS + 1))
    evals = [r for r in full_run.records if "eval" in r]
    assert [r["epoch"] for r in evals] == [2, 4]
    last = full_run.records[-1]
    assert np.isfinite(last["score_mean"]) and len(last["eval"]["normalized_score"]) == 1
    assert all(np.isfinite(v[0]) for v in last["train"].values())
    assert last["train"]["model_buffer_size"][0] > 0
    assert full_run.final_eval == last["eval"] and full_run.dataset_score is not None


def test_resume_after_sigterm_matches_the_uninterrupted_run(full_run, dataset, world_model_dir, tmp_path):
    def interrupt_at_epoch_2(report):
        if report.epoch == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # handled between epochs: checkpoint, then stop

    run_dir = tmp_path / "interrupted"
    stopped = run(full_run.config, run_dir, world_model_dir=world_model_dir, dataset=dataset, on_epoch=interrupt_at_epoch_2)
    assert stopped.interrupted == signal.SIGTERM and stopped.epochs_done == 2
    checkpoints = Checkpointer(run_dir / "checkpoints")
    assert checkpoints.latest_epoch() == 2
    checkpoints.close()
    resumed = run(None, run_dir, resume=True, dataset=dataset)
    assert resumed.interrupted is None and resumed.epochs_done == EPOCHS
    assert comparable(resumed.records) == comparable(full_run.records)


def test_a_run_stopped_while_fitting_its_world_model_continues_that_fit_on_resume(dataset, dataset_path,
                                                                                   world_model_dir, tmp_path,
                                                                                   monkeypatch, capsys):
    """A SIGTERM while `mbrl train` fits its world model stops the fit after its running epoch, with a checkpoint, and
    the command exits 128 + 15 with one line; `--resume` continues that fit and ends with the model of a fit never
    stopped."""
    import mbrl.train as train_module
    from mbrl.core.signals import StopSignal
    from mbrl.train import prepare_run
    from mbrl.world_models.fit import CHECKPOINT_DIR
    from mbrl.world_models.registry import load_model

    class SignalledAtOnce(StopSignal):  # the signal arrives during the fit's first epoch
        def __enter__(self):
            super().__enter__()
            self.signum = signal.SIGTERM
            return self

    run_dir = tmp_path / "stopped"
    config_file = tmp_path / "config.json"
    config_io.save(tiny_config(dataset=str(dataset_path)), config_file)
    with monkeypatch.context() as patch:
        patch.setattr(train_module, "StopSignal", SignalledAtOnce)
        code = cli_main(["train", "--config", str(config_file), "--run-dir", str(run_dir)])
    assert code == 128 + signal.SIGTERM
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "stopped by SIGTERM while fitting its world model, after fit epoch 1" in last_line
    assert f"mbrl train --resume {run_dir}" in last_line
    model_dir = run_dir / "world_model"
    assert not (model_dir / "model.json").exists()
    checkpoints = Checkpointer(model_dir / CHECKPOINT_DIR)
    assert checkpoints.latest_epoch() == 1
    checkpoints.close()
    # Another run pointed at that model's directory, with other fit options, does not continue a fit not its own.
    other = tiny_config(dataset=str(dataset_path), fit={"max_epochs": 2, "learning_rate": 5e-4})
    with pytest.raises(ConfigError, match="the checkpoint of another fit"):
        run(other, tmp_path / "other", world_model_dir=model_dir, dataset=dataset)
    resumed = prepare_run(None, run_dir, resume=True, dataset=dataset)  # its fit; the epochs are tested elsewhere
    resumed.logger.close()
    resumed.checkpointer.close()
    assert not (model_dir / CHECKPOINT_DIR).exists()
    fitted, whole = load_model(model_dir), load_model(world_model_dir)
    assert fitted.info.epochs == whole.info.epochs == 2
    for a, b in zip(jax.tree.leaves(fitted.params), jax.tree.leaves(whole.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_three_vmapped_seeds_equal_three_single_runs(full_run, dataset, world_model_dir, tmp_path):
    config = full_run.config
    together = run(config_io.override(config, {"seed": 0, "seeds": 3}), tmp_path / "seeds3",
                   world_model_dir=world_model_dir, dataset=dataset)
    singles = [full_run] + [
        run(config_io.override(config, {"seed": seed}), tmp_path / f"seed{seed}", world_model_dir=world_model_dir, dataset=dataset)
        for seed in (1, 2)
    ]
    for epoch, record in enumerate(together.records):
        for name, values in record["train"].items():
            expected = [single.records[epoch]["train"][name][0] for single in singles]
            np.testing.assert_allclose(values, expected, rtol=2e-3, atol=1e-4, err_msg=f"epoch {epoch + 1} {name}")
    final = together.records[-1]
    expected_scores = [single.records[-1]["eval"]["normalized_score"][0] for single in singles]
    np.testing.assert_allclose(final["eval"]["normalized_score"], expected_scores, rtol=1e-2, atol=0.05)
    assert final["score_stderr"] > 0


def test_mapped_members_equal_single_runs_and_the_probe_records_its_choice(full_run, dataset, world_model_dir,
                                                                          tmp_path, monkeypatch):
    """The other layout of a population (members one after another in the program) trains each member as a single
    run does; with no layout fixed, a CPU run measures both and keeps the choice in run.json for its resume."""
    config = config_io.override(full_run.config, {"seed": 0, "seeds": 2})
    monkeypatch.setenv("MBRL_MEMBER_LAYOUT", "map")
    mapped = run(config, tmp_path / "mapped", world_model_dir=world_model_dir, dataset=dataset)
    assert json.loads((tmp_path / "mapped" / "run.json").read_text())["member_layout"] == "map"
    single = run(config_io.override(full_run.config, {"seed": 1}), tmp_path / "seed1", world_model_dir=world_model_dir,
                 dataset=dataset)
    for epoch, record in enumerate(mapped.records):
        for name, values in record["train"].items():
            expected = [full_run.records[epoch]["train"][name][0], single.records[epoch]["train"][name][0]]
            np.testing.assert_allclose(values, expected, rtol=2e-3, atol=1e-4, err_msg=f"epoch {epoch + 1} {name}")

    monkeypatch.delenv("MBRL_MEMBER_LAYOUT")
    run(config, tmp_path / "probed", world_model_dir=world_model_dir, dataset=dataset)
    facts = json.loads((tmp_path / "probed" / "run.json").read_text())
    rule = facts["member_layout_rule"]
    assert rule["rule"] == "measured" and set(rule["epoch_seconds"]) == {"vmap", "map"}
    seconds = rule["epoch_seconds"]
    expected = "map" if seconds["map"] < (1 - LAYOUT_MARGIN) * seconds["vmap"] else "vmap"
    assert facts["member_layout"] == expected


def test_mopo_model_buffer_holds_the_penalised_reward(full_run, dataset, world_model_dir):
    from mbrl.envs.tasks import TASKS
    from mbrl.world_models.model import WorldModel

    config = full_run.config
    trainer = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim)
    part, hypers = trainer.part, hypers_of(config)
    model = WorldModel.load(world_model_dir, TASKS["hopper"].termination_fn)
    agent_state = trainer.agent.init(jax.random.PRNGKey(0), hypers)
    real = trainer.real_data(dataset)
    key = jax.random.PRNGKey(7)
    buffer, *_ = jax.jit(lambda a, k: part.collect(a, part.empty(), (), real, model, None, hypers, k))(agent_state, key)

    # The same rollout, by hand: same key split, same start states, same policy.
    start_key, rollout_key = jax.random.split(key)
    starts = jax.random.randint(start_key, (config.imagination.rollouts_per_epoch,), 0, real.size)
    imagined = rollout(rollout_key, model, ExploringPolicy(trainer.agent), agent_state.actor_params,
                       real.data.obs[starts], config.imagination.horizon, part.rollout_config)
    valid = np.asarray(imagined.valid).reshape(-1)
    raw = np.asarray(imagined.raw_reward).reshape(-1)[valid]
    u = np.asarray(imagined.uncertainty).reshape(-1)[valid]
    assert int(buffer.size) == valid.sum() > 0 and np.all(u > 0)
    np.testing.assert_allclose(np.asarray(buffer.data.reward[: valid.sum()]), raw - config.mopo.penalty_coef * u, rtol=1e-5, atol=1e-5)


def test_mixed_batches_put_the_real_rows_first(full_run, dataset):
    """The BC anchor imitates the leading `num_real` rows of each batch: they must be the dataset's."""
    from mbrl.core import replay
    from mbrl.core.types import Transitions

    trainer = trainer_for(full_run.config, dataset.info.obs_dim, dataset.info.act_dim)
    part = trainer.part
    real = trainer.real_data(dataset)
    size = part.capacity
    marked = Transitions(obs=np.zeros((size, dataset.info.obs_dim), np.float32),
                         action=np.zeros((size, dataset.info.act_dim), np.float32),
                         reward=np.full(size, -1e6, np.float32), next_obs=np.zeros((size, dataset.info.obs_dim), np.float32),
                         terminal=np.zeros(size, bool), timeout=np.zeros(size, bool))
    store = replay.insert(part.empty(), marked, np.ones(size, bool))
    batches = part.sample(real, store, jax.random.PRNGKey(3), 5)
    reward = np.asarray(batches.reward)
    assert reward.shape == (5, full_run.config.sac.batch_size) and 0 < part.num_real < reward.shape[1]
    assert part.num_real == round(full_run.config.sac.batch_size * full_run.config.imagination.real_ratio)
    assert np.isin(reward[:, : part.num_real], np.asarray(dataset.transitions.reward)).all()
    assert (reward[:, part.num_real :] == -1e6).all()


def test_a_population_of_configurations_equals_the_separate_runs(full_run, dataset, world_model_dir):
    """Three MOPO members with different lambda and learning rates in one program: each member's metrics are
    those of its own run, to float tolerance (a vmapped matmul may round differently)."""
    config = config_io.override(full_run.config, {"schedule": {"epochs": 2, "eval_every": 2}})
    hypers = [{"mopo": {"penalty_coef": 0.5}, "sac": {"actor_lr": 1e-4}},
              {"mopo": {"penalty_coef": 2.0}, "sac": {"critic_lr": 1e-3}},
              {"mopo": {"penalty_coef": 1.0}, "sac": {"actor_lr": 3e-3, "alpha_lr": 1e-3}}]
    seeds = [0, 0, 1]
    together = train_population(config, hypers, seeds, dataset=dataset, world_model=world_model_dir)
    assert [c.mopo.penalty_coef for c in together.configs] == [0.5, 2.0, 1.0]
    apart = [train_population(config, [h], [s], dataset=dataset, world_model=world_model_dir) for h, s in zip(hypers, seeds)]
    for epoch, record in enumerate(together.records):
        for name, values in record["train"].items():
            expected = [single.records[epoch]["train"][name][0] for single in apart]
            np.testing.assert_allclose(values, expected, rtol=2e-3, atol=1e-4, err_msg=f"epoch {epoch + 1} {name}")
    alone = [single.records[-1]["eval"]["return_mean"][0] for single in apart]
    np.testing.assert_allclose(together.records[-1]["eval"]["return_mean"], alone, rtol=1e-2, atol=0.05)
    # The members really differ: lambda changes the stored model rewards.
    rewards = together.records[-1]["train"]["model_reward"]
    assert len(set(np.round(rewards, 6))) == 3 or len(set(together.records[-1]["train"]["critic_loss"])) == 3
    from mbrl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="sac.num_critics"):
        member_config(config, {"sac": {"num_critics": 4}})
    with pytest.raises(ConfigError, match="term"):
        member_config(config, {"sac": {"actor_bc_coef": 0.0}})


def test_cli_rejects_bad_options_with_one_line(capsys, tmp_path):
    assert cli_main(["train", "--algo", "sarsa"]) == 2
    assert cli_main(["train", "--preset", "huge"]) == 2
    assert cli_main(["train", "--resume", str(tmp_path)]) == 2
    assert cli_main(["train", "--resume", str(tmp_path), "--seeds", "2"]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"algo": "mopo", "sac": {"num_critics": "ten"}}))
    assert cli_main(["train", "--config", str(bad)]) == 2
    # tyro's own parse errors too: a wrongly typed value, an unknown option
    assert cli_main(["train", "--algo", "neubay", "--neubay.actor-bc-coef", "abc"]) == 2
    assert cli_main(["train", "--nosuch-option", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 7 and all(line.startswith("mbrl: error: ") for line in err), err
    assert "sarsa" in err[0] and "huge" in err[1] and "config.json" in err[2] and "--seeds" in err[3]
    assert "sac.num_critics" in err[4] and "bad.json" in err[4]
    assert "--neubay.actor-bc-coef" in err[5] and "'abc'" in err[5] and "--nosuch-option" in err[6]


def test_cli_eval_and_config_reload(full_run, capsys):
    assert cli_main(["eval", str(full_run.run_dir), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    expected = full_run.final_eval["normalized_score"][0]
    assert f"normalized score {expected:.1f}" in out  # the same episodes as the run's last evaluation
    args = config_io.TrainArgs(config=full_run.run_dir / "config.json")
    assert config_io.resolve(args) == full_run.config
    overridden = config_io.resolve(config_io.TrainArgs(config=full_run.run_dir / "config.json", seeds=3))
    assert overridden.seeds == 3 and overridden.sac == full_run.config.sac


def test_bc_trains_on_real_data_only(dataset, dataset_path, tmp_path):
    config = tiny_config("bc", dataset=str(dataset_path), schedule={**TINY["schedule"], "epochs": 2})
    result = run(config, tmp_path / "bc", dataset=dataset)
    assert not (tmp_path / "bc" / "world_model").exists()
    first, last = result.records[0]["train"]["bc_loss"][0], result.records[-1]["train"]["bc_loss"][0]
    assert np.isfinite(last) and last < first
    # Nothing imagined: the state holds no store of model data, and every metric is the BC loss's.
    assert load_run(tmp_path / "bc").state.store is None
    assert set(result.records[-1]["train"]) == {"bc_loss"}
    assert json.loads((tmp_path / "bc" / "run.json").read_text())["world_models"] == []
    assert result.final_eval is not None


def _affine_copy(dataset, scale, shift):
    """The dataset with every observation x replaced by x * scale + shift (rewards, actions unchanged)."""
    import dataclasses

    t = dataset.transitions
    moved = t.replace(obs=(t.obs * scale + shift).astype(np.float32), next_obs=(t.next_obs * scale + shift).astype(np.float32))
    return dataclasses.replace(dataset, transitions=moved)


def test_normalize_obs_makes_the_agent_blind_to_the_observations_units(dataset, tmp_path):
    # Per-dimension units and offsets (a sensor in mm beside one in km, a constant of 300): with the
    # standardisation, the agent trained on them acts exactly as the one trained on the original data.
    rng = np.random.default_rng(0)
    scale = rng.choice([1e-2, 1.0, 50.0], dataset.info.obs_dim).astype(np.float32)
    # (no large offset on the shrunk dimensions: float32 would round away their information)
    shift = (rng.choice([0.0, 300.0], dataset.info.obs_dim) * (scale >= 1)).astype(np.float32)
    moved = _affine_copy(dataset, scale, shift)
    probe = dataset.transitions.obs[:64]
    actions = {}
    for normalize in (True, False):
        config = tiny_config("bc", schedule={**TINY["schedule"], "epochs": 1}, normalize_obs=normalize)
        for name, data, obs in (("original", dataset, probe), ("moved", moved, probe * scale + shift)):
            actions[normalize, name] = _actions_after_one_epoch(config, data, obs)
    np.testing.assert_allclose(actions[True, "moved"], actions[True, "original"], atol=2e-3)
    assert np.abs(actions[False, "moved"] - actions[False, "original"]).max() > 0.1


def _actions_after_one_epoch(config, data, obs):
    """The deterministic actions at `obs` of seed 0's agent after one epoch of `config` on `data`."""
    trainer = trainer_of_data(config, data)
    state = trainer.initial_state([0], [hypers_of(config)])
    state, _ = trainer.run_epoch(state, trainer.real_data(data), None)
    actor = jax.tree.map(lambda x: x[0], trainer.agent.actor_params(state.agent))
    return np.asarray(trainer.agent.act(actor, (), _inputs(obs), None, True)[0])


def _inputs(obs):
    from mbrl.core.types import PolicyInput

    n = obs.shape[0]
    return PolicyInput(obs, np.zeros((n, 3), np.float32), np.zeros(n, np.float32), np.ones(n, bool))


def test_a_run_keeps_its_observation_scale_for_eval_and_export(dataset, dataset_path, tmp_path):
    from mbrl.export_run import load_policy_from_run

    config = tiny_config("bc", dataset=str(dataset_path), schedule={**TINY["schedule"], "epochs": 1}, normalize_obs=True)
    result = run(config, tmp_path / "bc", dataset=dataset)
    facts = json.loads((result.run_dir / "run.json").read_text())
    np.testing.assert_allclose(facts["obs_scale"]["mean"], dataset.transitions.obs.mean(0), rtol=1e-5, atol=1e-6)
    loaded = load_run(result.run_dir)
    assert loaded.trainer.obs_scale is not None
    obs = dataset.transitions.obs[:16]
    trained = np.asarray(loaded.trainer.agent.act(loaded.actor_params(0), (), _inputs(obs), None, True)[0])
    spec = load_policy_from_run(result.run_dir)
    exported = np.stack([np.asarray(spec.apply_fn(spec.params, o)) for o in obs])
    np.testing.assert_allclose(exported, trained, atol=1e-6)
    # The same weights without the scale act differently: the scale is in the loaded agent, not a no-op.
    bare = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim)
    assert np.abs(np.asarray(bare.agent.act(loaded.actor_params(0), (), _inputs(obs), None, True)[0]) - trained).max() > 1e-3


def test_ignored_observation_dims_never_reach_the_networks(dataset, dataset_path, tmp_path):
    # A dimension the agent ignores (a robot's absolute position) may hold anything: the agent trained on data where
    # it is noise acts exactly as the one trained on the original data (standardised), and a run's export (not
    # standardised) ignores it too.
    from mbrl.core.errors import ConfigError
    from mbrl.export_run import load_policy_from_run

    rng = np.random.default_rng(3)
    t = dataset.transitions
    noisy_obs, noisy_next = t.obs.copy(), t.next_obs.copy()
    noisy_obs[:, 0], noisy_next[:, 0] = rng.normal(0, 1e3, len(t.obs)), rng.normal(0, 1e3, len(t.obs))
    noisy = dataclasses.replace(dataset, transitions=t.replace(obs=noisy_obs, next_obs=noisy_next))
    probe = t.obs[:64]
    actions = {}
    for ignore in ((0,), ()):
        config = tiny_config("bc", schedule={**TINY["schedule"], "epochs": 1}, normalize_obs=True, ignore_obs_dims=ignore)
        for name, data in (("original", dataset), ("noisy", noisy)):
            actions[ignore, name] = _actions_after_one_epoch(config, data, probe)
    np.testing.assert_allclose(actions[(0,), "noisy"], actions[(0,), "original"], atol=1e-6)
    assert np.abs(actions[(), "noisy"] - actions[(), "original"]).max() > 0.1
    config = tiny_config("bc", dataset=str(dataset_path), schedule={**TINY["schedule"], "epochs": 1}, ignore_obs_dims=(0,))
    result = run(config, tmp_path / "bc", dataset=dataset)
    assert json.loads((result.run_dir / "run.json").read_text())["obs_scale"]["ignored"] == [0]
    spec = load_policy_from_run(result.run_dir)
    moved = probe[:8].copy()
    moved[:, 0] += 123.0
    for o, m in zip(probe[:8], moved):
        np.testing.assert_array_equal(np.asarray(spec.apply_fn(spec.params, o)), np.asarray(spec.apply_fn(spec.params, m)))
    with pytest.raises(ConfigError, match=r"ignore_obs_dims: \(99,\) names a dimension outside the"):
        trainer_of_data(tiny_config("bc", ignore_obs_dims=(99,)), dataset)
    with pytest.raises(ConfigError, match=r"ignore_obs_dims: \(99,\) names a dimension outside the"):
        run(dataclasses.replace(config, ignore_obs_dims=(99,)), tmp_path / "refused", dataset=dataset)
    assert not (tmp_path / "refused").exists()  # nothing written
    with pytest.raises(ConfigError, match=r"ignore_obs_dims: expected distinct observation indices >= 0, found \(-1,\)"):
        tiny_config("bc", ignore_obs_dims=(-1,))


def test_mopo_ppo_refuses_normalize_obs(dataset):
    from mbrl.core.errors import ConfigError

    config = config_io.build("mopo-ppo", "hopper-tiny.hdf5", "quick", {"normalize_obs": True})
    with pytest.raises(ConfigError, match="ppo.normalize_obs"):
        trainer_of_data(config, dataset)


def test_a_run_without_a_simulator_records_the_model_estimate(robot_only_dataset, tmp_path, capsys):
    from mbrl.commands.train import print_summary

    config = tiny_config("mopo", dataset=str(robot_only_dataset), schedule={**TINY["schedule"], "epochs": 2, "eval_every": 1})
    result = run(config, tmp_path / "robot", dataset=datasets.load(robot_only_dataset))
    evals = [r for r in result.records if r.get("eval")]
    assert len(evals) == 2  # every evaluation, none blank
    for record in evals:
        e = record["eval"]
        assert e["estimate"] == "model" and e["normalized_score"] is None  # no reference scores: returns
        assert len(e["return_mean"]) == len(e["return_std"]) == 1 and np.isfinite(record["score_mean"])
        assert e["return_mean"][0] < 0  # the system's rewards are -|x|², so is any return of it
    print_summary(result)
    out = capsys.readouterr().out
    assert "final estimated return" in out and "in the world model" in out
    assert (tmp_path / "robot" / "learning_curve.png").is_file()


def test_existing_run_dir_is_refused(full_run):
    from mbrl.core.errors import ConfigError

    with pytest.raises(ConfigError, match="already holds a run"):
        run(full_run.config, full_run.run_dir)


def test_a_missing_tracking_sink_is_a_user_error(tmp_path):
    import importlib.util

    from mbrl.core.errors import MissingDependencyError
    from mbrl.logging import RunLogger

    if importlib.util.find_spec("tensorboardX") or importlib.util.find_spec("torch"):
        pytest.skip("a TensorBoard writer is installed")
    with pytest.raises(MissingDependencyError, match="tracking"):
        RunLogger(tmp_path, tensorboard=True)


def test_per_seed_world_models_are_fitted_and_stacked(dataset, dataset_path, tmp_path):
    config = tiny_config(dataset=str(dataset_path), seeds=2,
                         imagination={**TINY["imagination"], "per_seed_model": True},
                         schedule={**TINY["schedule"], "epochs": 1, "eval_every": 1})
    result = run(config, tmp_path / "per-seed", dataset=dataset)
    facts = json.loads((tmp_path / "per-seed" / "run.json").read_text())
    assert facts["world_models"] == ["world_model_seed0", "world_model_seed1"]
    seeds = [json.loads((tmp_path / "per-seed" / name / "model.json").read_text())["info"]["seed"] for name in facts["world_models"]]
    assert seeds == [0, 1]
    sizes = result.records[-1]["train"]["model_buffer_size"]
    assert len(sizes) == 2 and all(s > 0 for s in sizes)
    # Member 1 imagined in model 1: it equals a single run of seed 1 on that model (a shared model 0 would not).
    single = run(config_io.override(config, {"seed": 1, "seeds": 1, "imagination": {"per_seed_model": False}}),
                 tmp_path / "seed1", world_model_dir=tmp_path / "per-seed" / "world_model_seed1", dataset=dataset)
    for name, values in result.records[-1]["train"].items():
        np.testing.assert_allclose(values[1], single.records[-1]["train"][name][0], rtol=2e-3, atol=1e-4, err_msg=name)


def test_diagnose_agent_probes_the_model_along_the_policys_real_episodes(dataset_path, world_model_dir, capsys,
                                                                         load_script):
    """scripts/experiments/diagnose_agent.py: one JSON line for the data, one per probe; a missing model exits 2."""
    diagnose = load_script("experiments/diagnose_agent")
    np.testing.assert_allclose(diagnose.discounted_to_go(np.array([1.0, 1.0, 1.0]), 0.5), [1.75, 1.5, 1.0])
    tiny = ["sac.num_critics=2", "sac.hidden_sizes=[32,32]", "sac.batch_size=32", "schedule.updates_per_epoch=10",
            "imagination.rollouts_per_epoch=64", "imagination.horizon=3", "imagination.retain_epochs=2"]
    diagnose.main(["--dataset", str(dataset_path), "--world-model", str(world_model_dir), "--epochs", "2",
                   "--probe-every", "2", "--probe-episodes", "2", "--model-starts", "8", "--model-horizon", "12",
                   "--set", *tiny])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["probe"] == "data" and 0 < lines[0]["mean"] <= lines[0]["p99"] <= lines[0]["max"]
    (probe,) = lines[1:]
    assert probe["epoch"] == 2 and probe["updates"] == 20
    episodes = probe["model_on_policy"]
    assert len(episodes) == 2
    assert probe["real"]["length"] == pytest.approx(np.mean([e["length"] for e in episodes]))
    for e in episodes:
        assert 1 <= e["length"] <= 1000 and e["error_median"] >= 0 and e["uncertainty_mean"] > 0
        assert np.isfinite(e["q_mean"]) and e["discounted_return_to_go_mean"] != 0
    assert 1 <= probe["model_from_reset"]["length"] <= 12
    assert 0.0 <= probe["model_from_reset"]["terminated"] <= 1.0
    with pytest.raises(diagnose.ConfigError, match="no fitted model"):
        diagnose.main(["--dataset", str(dataset_path), "--world-model", str(world_model_dir / "missing")])


def test_reproduce_writes_the_table_reuses_a_placed_model_and_skips_finished_runs(dataset_path, world_model_dir,
                                                                                    tmp_path, capsys, load_script):
    """scripts/reproduce.py on a tiny budget: BC and MOPO, 2 vmapped seeds, the model placed in OUT/models."""
    import shutil

    reproduce = load_script("reproduce")
    out = tmp_path / "repro"
    shutil.copytree(world_model_dir, out / "models" / "hopper-tiny")
    argv = ["--datasets", str(dataset_path), "--algos", "bc,mopo", "--seeds", "2", "--epochs", "2",
            "--updates-per-epoch", "10", "--eval-every", "1", "--out", str(out)]
    assert reproduce.main(argv) == 0
    printed = capsys.readouterr().out
    assert "fitting the world model" not in printed  # the placed model was used
    summaries = json.loads((out / "results.json").read_text())
    assert [(s["algo"], s["updates"], s["complete"], len(s["scores"])) for s in summaries] == [
        ("bc", 20, True, 2), ("mopo", 20, True, 2)]
    assert all(len(s["curve"]) == 2 and s["dataset_score"] is not None for s in summaries)
    (row,) = [line for line in (out / "results.md").read_text().splitlines() if line.startswith(f"| {dataset_path}")]
    assert row.count("±") == 2 and "partial" not in row
    assert (out / "results.png").stat().st_size > 0
    assert json.loads((out / "runs" / "mopo-hopper-tiny" / "config.json").read_text())["seeds"] == 2

    assert reproduce.main(argv) == 0  # finished runs are read back, not trained again
    assert capsys.readouterr().out.count("done before") == 2
    assert json.loads((out / "results.json").read_text()) == summaries

    assert reproduce.main(["--datasets", "hopper-nonsense", "--algos", "bc", "--out", str(out)]) == 2
    assert "hopper-nonsense" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        reproduce.main(["--algos", "bc,sarsa"])
    assert exc.value.code == 2


def test_imagined_horizon_compares_a_shipped_policy_in_mujoco_and_in_the_model(dataset_path, world_model_dir, capsys,
                                                                               load_script):
    """scripts/experiments/imagined_horizon.py: NEUBAY's starts, the real env set to each start, and the model's cases."""
    probe = load_script("experiments/imagined_horizon")
    probe.main(["--dataset", str(dataset_path), "--world-model", str(world_model_dir), "--policy", "expert",
                "--trajectories", "6", "--horizon", "40", "--threshold-rows", "300"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    cases = {line["case"]: line for line in lines if "case" in line}
    assert len(cases) == 2 + 8
    horizons = {line["mean_remaining_horizon"] for line in cases.values()}
    assert len(horizons) == 1 and 0 < horizons.pop() <= 40  # every case runs from the same starts
    for name, line in cases.items():
        assert 0 <= line["mean_length"] <= line["max_length"] <= 40, name
        if name.startswith("real") or name.endswith("no_cut"):
            assert line["cut_by_uncertainty"] == 0.0, name
        # Every trajectory ends by a fall, a cut or its horizon.
        assert line["terminated"] + line["cut_by_uncertainty"] + line["full_horizon"] >= 1.0 - 1e-9, name


def test_onpolicy_cut_profiles_the_cut_along_replayed_and_policy_rollouts(dataset_path, world_model_dir, capsys,
                                                                          load_script):
    """scripts/experiments/onpolicy_cut.py: the data's thresholds, then the replay's and the initial policy's cut
    profiles, each share of trajectories cut growing with the step and shrinking with the quantile."""
    probe = load_script("experiments/onpolicy_cut")
    probe.main(["--dataset", str(dataset_path), "--world-model", str(world_model_dir), "--starts", "8",
                "--horizon", "5"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["case"] for line in lines] == ["data_one_step", "replay", "initial_policy_sampled",
                                                "initial_policy_mean"]
    thresholds = list(lines[0]["thresholds"].values())
    assert thresholds == sorted(thresholds) and 0 < lines[0]["median_u"] <= thresholds[-1]
    for line in lines[1:]:
        shares = [list(line[f"cut_by_step_at_q{q}"].values()) for q in ("0.9", "0.99", "0.999", "1.0")]
        for by_step in shares:
            assert by_step == sorted(by_step) and all(0.0 <= x <= 1.0 for x in by_step), line["case"]
        for looser, tighter in zip(shares[1:], shares[:-1]):
            assert all(a <= b for a, b in zip(looser, tighter)), line["case"]
        assert 0.0 <= line["mean_length_at_q1.0"] <= 5.0
    assert lines[1]["trajectories"] == 8 and all(v >= 0 for v in lines[1]["median_rms_error_std_units"].values())
    with pytest.raises(probe.ConfigError, match="no fitted model"):
        probe.main(["--dataset", str(dataset_path), "--world-model", str(world_model_dir / "missing")])


def test_without_model_noise_every_imagined_step_is_one_elites_mean(full_run, dataset, world_model_dir):
    from mbrl.envs.tasks import TASKS
    from mbrl.world_models.model import WorldModel

    model = WorldModel.load(world_model_dir, TASKS["hopper"].termination_fn)
    real_steps = None
    for noise in (False, True):
        config = config_io.override(full_run.config, {"imagination": {"model_noise": noise}})
        trainer = trainer_for(config, dataset.info.obs_dim, dataset.info.act_dim)
        part, hypers = trainer.part, hypers_of(config)
        agent_state = trainer.agent.init(jax.random.PRNGKey(0), hypers)
        buffer, *_ = part.collect(agent_state, part.empty(), (), trainer.real_data(dataset), model, None, hypers,
                                  jax.random.PRNGKey(7))
        rows = jax.tree.map(lambda x: np.asarray(x[: int(buffer.size)], np.float64), buffer.data)
        means, _ = model.member_predictions(jnp.asarray(rows.obs, jnp.float32), jnp.asarray(rows.action, jnp.float32))
        elite_next = rows.obs[None] + np.asarray(means, np.float64)[np.asarray(model.elites), :, : dataset.info.obs_dim]
        # The distance of each stored next observation to the nearest elite's mean prediction.
        nearest = np.min(np.max(np.abs(elite_next - rows.next_obs[None]), axis=-1), axis=0)
        if noise:
            real_steps = nearest
        else:
            assert len(nearest) > 0 and np.all(nearest < 1e-4)
    assert np.median(real_steps) > 1e-3  # with noise, the steps are draws around the means
