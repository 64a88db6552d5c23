"""`mbrl data profile`: each fact against an independent oracle (scipy's Spearman, a numpy loop, a dataset built
with known properties), and its refusals of bad input (one line, exit 2)."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
from scipy import stats

from mbrl.cli import main as cli_main
from mbrl.core.types import DatasetInfo, OfflineDataset, Transitions
from mbrl.datasets.profile import histogram_entropy, profile_data, rank_correlation, step_index

EPISODES, LENGTH = 30, 60
PRESSED_SHARE = 0.95  # of action 1's rows, at its upper bound by construction (the rest at 1.95)


def _known_dataset(seed: int = 0) -> OfflineDataset:
    """Observation 0 is a clock (0.1 per step) that nothing depends on; observation 1 follows s' = 0.8 s + a0;
    observation 2 is noise 1,000 times wider than the rest. Action 0 is uniform on [-1, 1]; action 1 sits at its
    upper bound 2 in exactly 95% of the rows and at 1.95 in the rest. The reward is -|s1|."""
    rng = np.random.default_rng(seed)
    rows = EPISODES * LENGTH
    a0 = rng.uniform(-1.0, 1.0, rows)
    a1 = np.where(np.arange(rows) % 20 < 19, 2.0, 1.95)
    obs = np.zeros((rows, 3))
    next_obs = np.zeros((rows, 3))
    for e in range(EPISODES):
        s1 = rng.normal()
        for t in range(LENGTH):
            i = e * LENGTH + t
            obs[i] = (0.1 * t, s1, 1000.0 * rng.normal())
            s1 = 0.8 * s1 + a0[i]
            next_obs[i] = (0.1 * (t + 1), s1, 1000.0 * rng.normal())
    timeout = np.zeros(rows, bool)
    timeout[LENGTH - 1::LENGTH] = True
    transitions = Transitions(obs.astype(np.float32), np.stack([a0, a1], 1).astype(np.float32),
                              (-np.abs(obs[:, 1])).astype(np.float32), next_obs.astype(np.float32),
                              np.zeros(rows, bool), timeout)
    info = DatasetInfo(name="known", source="known.hdf5", format="d4rl-hdf5", task=None, obs_dim=3, act_dim=2,
                       action_low=(-1.0, -2.0), action_high=(1.0, 2.0))
    return OfflineDataset(transitions, np.arange(0, rows, LENGTH), info)


@pytest.fixture(scope="module")
def known():
    dataset = _known_dataset()
    return dataset, profile_data(dataset)


def test_rank_correlation_is_spearmans_with_ties():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 5, 200).astype(float)  # many ties
    y = x + rng.normal(size=200)
    assert rank_correlation(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert rank_correlation(np.ones(10), np.arange(10.0)) == 0.0


def test_step_index_counts_within_each_episode():
    starts, rows = np.array([0, 3, 4, 9]), 12
    expected = []
    for begin, end in zip(starts, [*starts[1:], rows]):
        expected += list(range(end - begin))
    assert step_index(starts, rows).tolist() == expected


def test_histogram_entropy_closed_forms():
    centres = np.repeat(-1 + 0.1 * (np.arange(20) + 0.5), 10)  # ten values in each of the 20 bins
    assert histogram_entropy(centres, -1, 1) == pytest.approx(1.0)
    assert histogram_entropy(np.full(50, 0.3), -1, 1) == 0.0
    two = np.r_[np.full(50, -0.99), np.full(50, 0.99)]  # two bins, equal counts: log 2 / log 20
    assert histogram_entropy(two, -1, 1) == pytest.approx(math.log(2) / math.log(20))


def test_profile_finds_the_built_in_facts(known):
    dataset, found = known
    rewards = dataset.transitions.reward.astype(np.float64)
    assert found.reward_abs_mean == pytest.approx(np.abs(rewards).mean())
    assert found.return_mean == pytest.approx(rewards.reshape(EPISODES, LENGTH).sum(1).mean())
    assert found.actions[1].at_high == pytest.approx(PRESSED_SHARE)
    assert found.pressed_actions == [1]
    assert found.actions[0].entropy > 0.95  # uniform over its whole range
    assert found.observations[0].time_correlation == pytest.approx(1.0)
    assert found.time_tied_observations == [0]
    # In standardised targets (the clock's constant step drops out): with every input, half of obs 2's change
    # (n' - n, n known) and the part of the reward -|s1| that s1 and s1² miss (1 - 0.937², s1 about Gaussian: 0.12)
    # are missed, (0 + 0 + 0.5 + 0.12) / 4; without s1 the reward (1) and s1's own share of its change (0.04 var s1
    # against var a0 = 1/3: about 0.1) are missed too, (0.1 + 0.5 + 1) / 4: an increase of about 1.6, checked at
    # half of that.
    assert found.observations[1].dynamics_error_increase > 0.8
    assert abs(found.observations[0].dynamics_error_increase) < 0.01
    assert found.unequal_scales and found.obs_scale_ratio > 100


def _write_hdf5(path, obs, timeouts):
    n = len(obs)
    with h5py.File(path, "w") as f:
        f["observations"] = obs.astype(np.float32)
        f["next_observations"] = obs.astype(np.float32)
        f["actions"] = np.zeros((n, 1), np.float32)
        f["rewards"] = np.ones(n, np.float32)
        f["terminals"] = np.zeros(n, bool)
        f["timeouts"] = timeouts
    return path


def test_cli_writes_the_profile_as_json(tmp_path, capsys):
    rng = np.random.default_rng(0)
    timeouts = np.zeros(40, bool)
    timeouts[19::20] = True
    path = _write_hdf5(tmp_path / "two.hdf5", rng.normal(size=(40, 2)), timeouts)
    out = tmp_path / "profile.json"
    assert cli_main(["data", "profile", str(path), "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["episodes"] == 2 and printed["transitions"] == 40 and printed["reward_abs_mean"] == 1.0


@pytest.mark.parametrize("case", ["one_episode", "nan_row", "missing"])
def test_cli_refuses_bad_input_in_one_line(case, tmp_path, capsys):
    timeouts = np.zeros(30, bool)
    timeouts[-1] = True
    obs = np.zeros((30, 2))
    if case == "nan_row":
        timeouts[14] = True
        obs[7, 1] = np.nan
    path = tmp_path / "data.hdf5"
    if case != "missing":
        _write_hdf5(path, obs, timeouts)
    out = tmp_path / "profile.json"
    assert cli_main(["data", "profile", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err, err
    assert {"one_episode": "1 episode", "nan_row": "7", "missing": "data.hdf5"}[case] in err
    assert not out.exists()


def _sac_section():
    from mbrl.agents.sac_n import SACNConfig

    return SACNConfig()  # SAC's defaults: the temperature from 1.0 at 3e-4


def _with(profile, **changes):
    import dataclasses

    return dataclasses.replace(profile, **changes)


def test_rules_read_the_facts_they_name(known):
    from mbrl import rules

    _, found = known
    choices = {c.field: c for _, c in rules.choices_for(found, 8000, {"sac": _sac_section()})}
    # Action 1 (std s1 over [-2, 2]) is pressed; action 0 is uniform on [-1, 1] (std 1/sqrt(3)): a Gaussian of each
    # spread has entropy log s + log(2 pi e)/2, summed over both.
    s0, s1 = found.actions[0].std, found.actions[1].std
    expected = math.log(s0) + math.log(s1) + math.log(2 * math.pi * math.e)
    assert expected < -2 and choices["target_entropy"].value == pytest.approx(expected, abs=0.005)
    assert choices["normalize_obs"].value is True
    assert choices["ignore_obs_dims"].value == (0,)
    # The temperature falls from 1 to a tenth of the reward per step over |target| within 4,000 updates.
    alpha_min = 0.1 * found.reward_abs_mean / abs(choices["target_entropy"].value)
    assert choices["alpha_lr"].value == pytest.approx(math.log(1 / alpha_min) / 4000, rel=0.05)


def test_rules_keep_the_defaults_where_nothing_calls_for_a_change(known):
    from mbrl import rules

    _, found = known
    plain = _with(found, actions=(found.actions[0],), unequal_scales=False,
                  observations=tuple(_with(o, tracks_time=False) for o in found.observations), reward_abs_mean=100.0)
    assert rules.choices_for(plain, 8000, {"sac": _sac_section()}) == []


def test_jump_rows_are_the_changes_far_outside_their_spread():
    from mbrl.model_profile import jump_rows

    rng = np.random.default_rng(3)
    targets = np.stack([rng.normal(size=10_000), np.zeros(10_000)], axis=1)
    targets[[10, 500, 9000], 0] += 50.0  # 50 standard deviations out
    targets[[20, 30], 1] = 1.0  # a change that never moves but twice
    # A Gaussian beyond 6 of its standard deviations: odds 2e-9 a row, so none of the 10,000 ordinary rows.
    assert np.flatnonzero(jump_rows(targets)).tolist() == [10, 20, 30, 500, 9000]


def test_the_trusted_horizon_is_the_last_before_the_error_passes_the_tolerance():
    from mbrl.model_profile import HORIZONS, K_STEP_TOLERANCE, _trusted

    errors = {str(k): K_STEP_TOLERANCE * k / 10 for k in HORIZONS}  # passes the tolerance after 10 steps
    assert _trusted(errors) == 10
    assert _trusted({**errors, "1": 2 * K_STEP_TOLERANCE}) is None
    assert _trusted({**errors, "5": None}) == 2  # no start long enough: nothing beyond is trusted


@pytest.fixture(scope="module")
def known_file_and_model(tmp_path_factory):
    """The known dataset as a D4RL file, with observation 2 jumping by 50,000 once in each episode (its row known),
    and a tiny MLP ensemble fitted on it by `mbrl model fit`."""
    dataset = _known_dataset()
    t = dataset.transitions
    next_obs = t.next_obs.copy()
    jumps = np.arange(EPISODES) * LENGTH + 17
    next_obs[jumps, 2] += 50_000.0
    folder = tmp_path_factory.mktemp("profile")
    path = folder / "known.hdf5"
    with h5py.File(path, "w") as f:
        for key, values in (("observations", t.obs), ("actions", t.action), ("rewards", t.reward),
                            ("next_observations", next_obs), ("terminals", t.terminal), ("timeouts", t.timeout)):
            f[key] = values
    model_dir = folder / "model"
    assert cli_main(["model", "fit", "--dataset", str(path), "--out", str(model_dir), "--ensemble.num-members", "3",
                     "--ensemble.num-elites", "2", "--ensemble.hidden-dims", "16", "--fit.max-epochs", "2"]) == 0
    return path, model_dir, jumps


def test_cli_profiles_the_model_and_finds_its_jumps(known_file_and_model, capsys):
    from mbrl.model_profile import HORIZONS

    path, model_dir, jumps = known_file_and_model
    capsys.readouterr()
    assert cli_main(["data", "profile", str(path), "--world-model", str(model_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    model = report["world_model"]
    holdout = json.loads((model_dir / "model.json").read_text())["info"]["holdout_rows"]
    # Every injected jump in the holdout is a jump row and nothing else: obs 2's Gaussian change stays inside 6 robust
    # deviations but for odds of 2e-9 a row, s1's change is mostly the uniform a0, and the reward -|s1| reaches 6
    # robust deviations of a half-normal (1.4826 MAD = 0.59 std, median 0.67 std) only beyond 4.2 std.
    assert model["jump_rows"] == len(np.intersect1d(holdout, jumps))
    assert model["holdout_rows"] == len(holdout)
    assert list(model["k_step_error"]) == [str(k) for k in HORIZONS]
    assert len(model["spread_over_error"]) == 3 + 1  # the observations' changes, then the reward


@pytest.mark.parametrize("argv, expected", [
    (["--world-model", "{missing}"], "model.json"),
    (["--compare", "{missing}"], "--world-model"),
    (["--algo", "nope"], "unknown algorithm 'nope'"),
])
def test_cli_refuses_a_bad_model_option_in_one_line(argv, expected, known_file_and_model, tmp_path, capsys):
    path, _, _ = known_file_and_model
    argv = [a.format(missing=tmp_path / "nothing") for a in argv]
    assert cli_main(["data", "profile", str(path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


@pytest.mark.parametrize("task, pressed, tied, unequal", [
    ("Simglucose", [0], [], True),  # the insulin sits at its lower bound; glucose dwarfs the other readings
    ("SafetyHalfCheetah", [], [0], True),  # the cheetah's absolute x grows with time; the plane is flat
    ("DMSD", [], [], False),  # its special case is its model's (variance for jumps), not its data's
])
def test_the_profile_finds_the_special_cases_of_the_released_files(task, pressed, tied, unequal, monkeypatch):
    """What was found by hand on NeoRL-2's released files (agents/presets.py's TARGET_ENTROPY, POSITION_DIMS and
    their standardised observations), found by the data's profile alone."""
    from neorl2_files import NEORL2_DIR, neorl2_file

    from mbrl import datasets

    neorl2_file(f"{task}-high-100000-train.npz")  # skips where absent
    if NEORL2_DIR.name != "neorl2":
        pytest.skip(f"{NEORL2_DIR} is not a folder named neorl2, which neorl2:TASK reads")
    monkeypatch.setenv("MBRL_DATA_DIR", str(NEORL2_DIR.parent))
    found = profile_data(datasets.load(f"neorl2:{task}"))
    assert (found.pressed_actions, found.time_tied_observations, found.unequal_scales) == (pressed, tied, unequal)


def test_preset_auto_puts_the_rules_choices_in_each_section_that_has_the_field(known_file_and_model):
    """`--preset auto` on the known data: quick's sizes without a dataset's own entry, and the rules' values where
    the algorithm has the field; an algorithm that scales its observations itself keeps the run's scale off."""
    from mbrl import config as config_io
    from mbrl.datasets.profile import cached_profile

    path = str(known_file_and_model[0])
    found = cached_profile(path)  # the file has no declared bounds: the pressed-action rule has nothing to read
    ravl = config_io.build("ravl", path, "auto")
    assert ravl.preset == "auto" and ravl.normalize_obs and ravl.ignore_obs_dims == (0,)
    quick = config_io.quick_base("ravl", path)
    alpha_min = 0.1 * found.reward_abs_mean / len(found.actions)  # the target stays SAC's -|A| = -2
    expected = math.log(quick.sac.init_alpha / alpha_min) / (0.5 * quick.schedule.epochs * quick.schedule.updates_per_epoch)
    assert ravl.sac.alpha_lr == pytest.approx(max(expected, quick.sac.alpha_lr), rel=0.05)
    mopo = config_io.build("mopo", path, "auto")
    assert mopo.ensemble.invariant_obs_dims == (0,)  # the clock is also the world model's invariant input
    ppo = config_io.build("mopo-ppo", path, "auto")
    assert not ppo.normalize_obs and ppo.ignore_obs_dims == ()
    given = config_io.build("ravl", path, "auto", {"normalize_obs": False, "sac": {"alpha_lr": 1e-3}})
    assert not given.normalize_obs and given.sac.alpha_lr == 1e-3  # what the user gives wins over a rule
