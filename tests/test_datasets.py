"""mbrl.datasets: three formats written by their real writers from the same MuJoCo episodes, and validation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gymnasium as gym
import h5py
import minari
import numpy as np
import pytest
from minari import DataCollector
from minari.data_collector import EpisodeBuffer

from mbrl.core import dataset_registry as registry
from mbrl.datasets import SAMPLE_PATH, load
from mbrl.core.errors import ConfigError, DatasetError
from mbrl.core.types import TASK_SPECS, Transitions

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

MAX_STEPS = 30  # short episodes: the zero-action one is cut by this time limit
MINARI_REF = (-20.0, 3000.0)  # distinct from D4RL's, to see which one a loader used


def _policies():
    """(name, action function of an rng): falls (terminal), stands until the time limit, random."""
    return [
        ("push", lambda rng: np.ones(3, np.float32)),
        ("still", lambda rng: np.zeros(3, np.float32)),
        ("random", lambda rng: rng.uniform(-1, 1, 3).astype(np.float32)),
    ]


def record_hopper_episodes(root: Path, dataset_id: str) -> list[dict[str, np.ndarray]]:
    """Step the real Hopper-v5 through Minari's DataCollector; also return the episodes as arrays."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        env = DataCollector(gym.make("Hopper-v5", max_episode_steps=MAX_STEPS), record_infos=False)
        episodes = []
        for seed, (_, policy) in enumerate(_policies()):
            rng = np.random.default_rng(seed)
            obs, _ = env.reset(seed=seed)
            ep = {"observations": [obs], "actions": [], "rewards": [], "terminations": [], "truncations": []}
            while True:
                action = policy(rng)
                obs, reward, terminated, truncated, _ = env.step(action)
                for key, value in zip(list(ep)[1:], (action, reward, terminated, truncated)):
                    ep[key].append(value)
                ep["observations"].append(obs)
                if terminated or truncated:
                    break
            episodes.append({key: np.asarray(value) for key, value in ep.items()})
        env.create_dataset(
            dataset_id,
            algorithm_name="fixed test policies",
            author="tests",
            author_email="tests@example.invalid",
            code_permalink="tests/test_datasets.py",
            description="three short Hopper-v5 episodes",
            ref_min_score=MINARI_REF[0],
            ref_max_score=MINARI_REF[1],
        )
        env.close()
    return episodes


def expected_transitions(episodes) -> tuple[Transitions, np.ndarray]:
    cat = lambda key, part=slice(None): np.concatenate([e[key][part] for e in episodes])  # noqa: E731
    transitions = Transitions.from_arrays(
        cat("observations", slice(None, -1)),
        cat("actions"),
        cat("rewards"),
        cat("observations", slice(1, None)),
        cat("terminations"),
        cat("truncations"),
    )
    lengths = [len(e["actions"]) for e in episodes]
    return transitions, np.concatenate([[0], np.cumsum(lengths)[:-1]])


def d4rl_arrays(episodes) -> dict[str, np.ndarray]:
    t, _ = expected_transitions(episodes)
    return {
        "observations": np.concatenate([e["observations"][:-1] for e in episodes]),
        "actions": t.action,
        "rewards": np.concatenate([e["rewards"] for e in episodes]),
        "next_observations": np.concatenate([e["observations"][1:] for e in episodes]),
        "terminals": t.terminal,
        "timeouts": t.timeout,
    }


def neorl_arrays(episodes) -> dict[str, np.ndarray]:
    d = d4rl_arrays(episodes)
    _, starts = expected_transitions(episodes)
    return {
        "obs": d["observations"],
        "next_obs": d["next_observations"],
        "action": d["actions"],
        "reward": d["rewards"][:, None],  # NeoRL keeps rewards and dones as (N, 1)
        "done": d["terminals"].astype(np.float32)[:, None],
        "index": starts,
    }


def neorl2_arrays(episodes) -> dict[str, np.ndarray]:
    """NeoRL-2's released layout: flat float32 arrays, episodes ended by `done` or `truncated`, no `index`."""
    d = d4rl_arrays(episodes)
    return {
        "obs": d["observations"],
        "next_obs": d["next_observations"],
        "action": d["actions"],
        "reward": d["rewards"].astype(np.float32),
        "done": d["terminals"].astype(np.float32),
        "truncated": d["timeouts"].astype(np.float32),
    }


def write_hdf5(path: Path, arrays: dict, attrs: dict | None = None) -> Path:
    with h5py.File(path, "w") as file:
        for key, array in arrays.items():
            file.create_dataset(key, data=array)
        file.create_dataset("infos/qpos", data=np.zeros((3, 2)))  # ignored, as in D4RL files
        file.attrs.update(attrs or {})
    return path


def write_npz(path: Path, arrays: dict) -> Path:
    np.savez(path, **arrays)
    return path


def assert_same_transitions(a: Transitions, b: Transitions) -> None:
    for field in dataclasses.fields(Transitions):
        x, y = getattr(a, field.name), getattr(b, field.name)
        assert x.dtype == y.dtype, field.name
        np.testing.assert_array_equal(x, y, err_msg=field.name)


@pytest.fixture(scope="module")
def hopper(tmp_path_factory):
    """The same episodes in all three formats, plus a made dataset `hopper-medium`."""
    folder = tmp_path_factory.mktemp("three-formats")
    minari_root, made_root = folder / "minari", folder / "made"
    episodes = record_hopper_episodes(minari_root, "test/hopper/mixed-v0")
    # The made dataset is recorded again: MuJoCo is deterministic, so it must be the same data.
    made_episodes = record_hopper_episodes(made_root, registry.minari_id("hopper", "medium"))
    for a, b in zip(episodes, made_episodes):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    return {
        "episodes": episodes,
        "minari_root": minari_root,
        "made_root": made_root,
        "hdf5": write_hdf5(folder / "hopper-episodes.hdf5", d4rl_arrays(episodes)),
        "npz": write_npz(folder / "hopper-episodes.npz", neorl_arrays(episodes)),
        "npz2": write_npz(folder / "hopper-episodes-v2.npz", neorl2_arrays(episodes)),
        "folder": folder,
    }


def test_episodes_cover_a_terminal_and_a_timeout(hopper):
    ends = [(bool(e["terminations"][-1]), bool(e["truncations"][-1])) for e in hopper["episodes"]]
    assert ends[0] == (True, False) and ends[1] == (False, True), ends
    assert all(len(e["observations"]) == len(e["actions"]) + 1 for e in hopper["episodes"])


def test_three_formats_load_identical_transitions(hopper, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(hopper["minari_root"]))
    expected, starts = expected_transitions(hopper["episodes"])
    loaded = {
        "d4rl-hdf5": load(hopper["hdf5"]),
        "neorl-npz": load(str(hopper["npz"])),
        "neorl2-npz": load(str(hopper["npz2"])),
        "minari": load("minari:test/hopper/mixed-v0"),
    }
    for fmt, dataset in loaded.items():
        assert dataset.info.format == fmt
        assert dataset.info.task == "hopper", fmt
        assert_same_transitions(dataset.transitions, expected)
        np.testing.assert_array_equal(dataset.episode_starts, starts)
    assert loaded["minari"].info.source == "minari:test/hopper/mixed-v0"
    # Reference scores: the dataset's own metadata, else D4RL's for a D4RL file of a known task.
    assert (loaded["minari"].info.ref_min_score, loaded["minari"].info.ref_max_score) == MINARI_REF
    spec = TASK_SPECS["hopper"]
    assert loaded["d4rl-hdf5"].info.ref_max_score == spec.ref_max_score
    assert loaded["minari"].info.action_low == (-1.0, -1.0, -1.0)


def test_made_name_resolves_under_mbrl_data_dir(hopper, monkeypatch):
    monkeypatch.setenv("MBRL_DATA_DIR", str(hopper["made_root"]))
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(hopper["folder"] / "elsewhere"))
    dataset = load("hopper-medium")
    expected, starts = expected_transitions(hopper["episodes"])
    assert_same_transitions(dataset.transitions, expected)
    np.testing.assert_array_equal(dataset.episode_starts, starts)
    assert (dataset.info.name, dataset.info.task, dataset.info.format) == ("hopper-medium", "hopper", "minari")
    # Its folder is a valid SOURCE too, so info.source reloads the same data.
    assert_same_transitions(load(dataset.info.source).transitions, expected)


def test_name_not_made_tells_how_to_make_it():
    with pytest.raises(DatasetError, match=r"mbrl data make walker2d-medium-replay"):
        load("walker2d-medium-replay")
    with pytest.raises(DatasetError, match=r"hopper-mediocre: .*not a known dataset name"):
        load("hopper-mediocre")


def test_dataset_names_parse_one_way_and_anything_else_is_refused_by_name():
    assert registry.parse_name("hopper-medium-replay") == ("hopper", "medium-replay")
    assert [registry.parse_name(name) for name in registry.all_names()] == [
        (task, level) for task in registry.TASKS for level in registry.LEVELS]
    for other in ("hopper", "hopper-medium.hdf5", "minari:mujoco/hopper/expert-v0", "humanoid-medium", "hopper-great"):
        assert registry.parse_name(other) is None  # a path or a Minari id: not a name, no error
        with pytest.raises(ConfigError) as error:
            registry.task_level(other)
        message = str(error.value)
        assert other in message and "hopper, halfcheetah, walker2d, ant" in message
        assert "random, medium, medium-replay, expert, medium-expert" in message
    assert registry.minari_id("walker2d", "medium-expert") == "mbrl/walker2d/medium-expert-v0"


def test_qlearning_rebuild_matches_hand_computed(tmp_path):
    # Episodes: rows 0-2 end in a terminal, rows 3-4 in a timeout, rows 5-6 are cut by the file's end.
    obs = np.arange(7 * 2, dtype=np.float32).reshape(7, 2)
    terminals = np.array([0, 0, 1, 0, 0, 0, 0], bool)
    timeouts = np.array([0, 0, 0, 0, 1, 0, 0], bool)
    path = write_hdf5(
        tmp_path / "handmade.hdf5",
        {
            "observations": obs,
            "actions": np.zeros((7, 1), np.float32),
            "rewards": np.arange(7, dtype=np.float32),
            "terminals": terminals,
            "timeouts": timeouts,
        },
    )
    dataset = load(path)
    # Kept rows 0, 1, 2, 3, 5 (4 timed out, 6 is last); the terminal row 2 takes row 3 like D4RL.
    np.testing.assert_array_equal(dataset.transitions.obs, obs[[0, 1, 2, 3, 5]])
    np.testing.assert_array_equal(dataset.transitions.next_obs, obs[[1, 2, 3, 4, 6]])
    np.testing.assert_array_equal(dataset.transitions.reward, [0, 1, 2, 3, 5])
    np.testing.assert_array_equal(dataset.transitions.terminal, [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(dataset.episode_starts, [0, 3, 4])
    assert dataset.info.task is None and dataset.info.normalized_score(1.0) is None


def test_shipped_sample_loads():
    dataset = load(SAMPLE_PATH)
    assert dataset.info.task == "hopper" and len(dataset) >= 100
    assert SAMPLE_PATH.stat().st_size < 100_000
    assert dataset.num_episodes >= 2 and dataset.transitions.terminal.any()
    assert dataset.info.normalized_score(dataset.episode_returns()) is not None


def test_clip_actions_clips_instead_of_refusing(hopper, tmp_path):
    arrays = d4rl_arrays(hopper["episodes"])
    arrays["actions"][3, 1] = 1.5
    path = write_hdf5(tmp_path / "hopper-wild.hdf5", arrays)
    with pytest.raises(DatasetError, match=r"row 3, column 1: expected an action in \[-1, 1\], found 1.5"):
        load(path)
    assert load(path, clip_actions=True).transitions.action[3, 1] == 1.0


def test_a_word_in_the_file_name_is_only_a_hint(hopper, tmp_path):
    # `ant` in the name, hopper dims: the task stays unknown rather than making the data invalid.
    path = write_hdf5(tmp_path / "ant-like.hdf5", d4rl_arrays(hopper["episodes"]))
    assert load(path).info.task is None
    assert load(path, task="hopper").info.task == "hopper"


def test_task_option_conflicting_with_minari_env_spec(hopper, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(hopper["minari_root"]))
    with pytest.raises(DatasetError, match=r"Hopper-v5 says task 'hopper'; expected 'walker2d'"):
        load("minari:test/hopper/mixed-v0", task="walker2d")
    with pytest.raises(ConfigError, match="unknown task 'humanoid'"):
        load("minari:test/hopper/mixed-v0", task="humanoid")


# --- bad D4RL files: each names file, key, row, expected and found ---------------------------------


def _drop(key):
    return lambda a: a.pop(key)


def _set(key, row, value, col=None):
    def mutate(a):
        a[key] = a[key].astype(np.float64) if a[key].dtype == bool else a[key].copy()
        if col is None:
            a[key][row] = value
        else:
            a[key][row, col] = value

    return mutate


BAD_D4RL = {
    "missing key": (_drop("rewards"), None, ["'rewards' is missing", "expected the D4RL keys"]),
    "unequal lengths": (lambda a: a.update(actions=a["actions"][:-1]), None, ["'actions'", "expected", "rows"]),
    "zero rows": (lambda a: a.update({k: v[:0] for k, v in a.items()}), None, ["0 rows", "at least 1 transition"]),
    "obs dim": (
        lambda a: a.update(observations=np.pad(a["observations"], ((0, 0), (0, 1)))),
        "hopper",
        ["'observations'", "dimension 12", "expected 11"],
    ),
    "action dim": (
        lambda a: a.update(actions=a["actions"][:, :2]),
        "hopper",
        ["'actions'", "dimension 2", "expected 3"],
    ),
    "nan observation": (_set("observations", 5, np.nan, 2), None, ["'observations', row 5", "finite", "nan"]),
    "inf reward": (_set("rewards", 7, np.inf), None, ["'rewards', row 7", "finite", "inf"]),
    "reward beyond float32": (_set("rewards", 8, 1e300), None, ["'rewards', row 8", "finite float32", "1e+300"]),
    "nan next obs": (_set("next_observations", 2, np.nan, 0), None, ["'next_observations', row 2", "nan"]),
    "action out of range": (_set("actions", 9, -3.0, 0), None, ["'actions', row 9, column 0", "[-1, 1]", "-3"]),
    "terminal not boolean": (_set("terminals", 4, 2.0), None, ["'terminals', row 4", "0 or 1", "found 2"]),
    "timeout not boolean": (_set("timeouts", 6, 0.5), None, ["'timeouts', row 6", "0 or 1", "0.5"]),
    "1-d observations": (lambda a: a.update(observations=a["rewards"]), None, ["'observations'", "expected (N, D)"]),
}


@pytest.mark.parametrize("case", list(BAD_D4RL))
def test_bad_d4rl_file_raises_dataset_error(case, hopper, tmp_path):
    mutate, task, needles = BAD_D4RL[case]
    arrays = d4rl_arrays(hopper["episodes"])
    mutate(arrays)
    path = write_hdf5(tmp_path / "hopper-bad.hdf5", arrays)
    with pytest.raises(DatasetError) as caught:
        load(path, task=task)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    for needle in needles:
        assert needle in message, (needle, message)
    assert "\n" not in message


def test_hdf5_group_where_an_array_belongs(hopper, tmp_path):
    arrays = d4rl_arrays(hopper["episodes"])
    actions = arrays.pop("actions")
    path = write_hdf5(tmp_path / "grouped.hdf5", arrays)
    with h5py.File(path, "a") as file:
        file.create_dataset("actions/values", data=actions)
    with pytest.raises(DatasetError, match=r"grouped.hdf5: key 'actions' is a group; expected an array"):
        load(path)


# --- bad NeoRL files ------------------------------------------------------------------------------

BAD_NPZ = {
    "missing index": (_drop("index"), ["neither 'truncated' (NeoRL-2) nor 'index' (NeoRL) is present"]),
    "missing done": (_drop("done"), ["key 'done' is missing", "expected the NeoRL-2 keys obs, next_obs, action"]),
    "index not from 0": (lambda a: a.update(index=a["index"] + 1), ["'index', position 0", "expected 0", "found 1"]),
    "index not increasing": (
        lambda a: a.update(index=a["index"][[0, 2, 1]]),
        ["'index', position 2", "increasing", "found"],
    ),
    "index past the end": (
        lambda a: a.update(index=np.append(a["index"], 10_000)),
        ["'index', position 3", "below", "found 10000"],
    ),
    "done inside an episode": (_set("done", 3, 1.0, 0), ["'done', row 3", "last row of an episode"]),
    "unequal lengths": (lambda a: a.update(reward=a["reward"][:-2]), ["'reward'", "expected", "rows"]),
    "nan action": (_set("action", 11, np.nan, 1), ["'action', row 11", "finite", "nan"]),
}


def _truncate_the_terminal_row(arrays):
    row = int(np.flatnonzero(arrays["done"])[0])  # the first episode ends by `done` (a fall)
    arrays["truncated"][row] = 1.0


BAD_NPZ2 = {
    "done and truncated on one row": (_truncate_the_terminal_row, ["'done' and 'truncated' are both set"]),
    "truncated not a flag": (_set("truncated", 2, 0.5), ["'truncated', row 2", "expected a boolean (0 or 1)"]),
    "short truncated": (lambda a: a.update(truncated=a["truncated"][:-1]), ["'truncated'", "rows"]),
}


def _assert_bad_npz_raises(path, arrays, mutate, needles):
    """`mutate`d arrays written to `path` make `load` raise a DatasetError whose message names the file and holds
    every needle."""
    mutate(arrays)
    write_npz(path, arrays)
    with pytest.raises(DatasetError) as caught:
        load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    for needle in needles:
        assert needle in message, (needle, message)


@pytest.mark.parametrize("case", list(BAD_NPZ2))
def test_bad_neorl2_file_raises_dataset_error(case, hopper, tmp_path):
    _assert_bad_npz_raises(tmp_path / "hopper-bad-v2.npz", neorl2_arrays(hopper["episodes"]), *BAD_NPZ2[case])


@pytest.mark.parametrize("case", list(BAD_NPZ))
def test_bad_neorl_file_raises_dataset_error(case, hopper, tmp_path):
    _assert_bad_npz_raises(tmp_path / "hopper-bad.npz", neorl_arrays(hopper["episodes"]), *BAD_NPZ[case])


# --- files that are not datasets at all -----------------------------------------------------------


def _truncated_hdf5(tmp_path, hopper):
    path = write_hdf5(tmp_path / "truncated.hdf5", d4rl_arrays(hopper["episodes"]))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


BROKEN = {
    "truncated hdf5": (_truncated_hdf5, "truncated"),
    "text named .hdf5": (lambda d, h: _write_text(d / "notes.hdf5"), "not a readable HDF5 file"),
    "npz not a zip": (lambda d, h: _write_text(d / "data.npz"), "not a zip archive"),
    "unknown extension": (lambda d, h: _write_text(d / "data.csv"), "unknown file type '.csv'"),
    "directory": (lambda d, h: d, "is a directory"),
    "missing file": (lambda d, h: d / "absent.hdf5", "no such file"),
}


def _write_text(path: Path) -> Path:
    path.write_text("observations,actions\n1,2\n")
    return path


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_file_raises_one_line_dataset_error(case, hopper, tmp_path):
    make, needle = BROKEN[case]
    path = make(tmp_path, hopper)
    with pytest.raises(DatasetError) as caught:
        load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and needle in message, message


def test_minari_id_not_present_is_refused_without_download(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    expected = r"minari:mujoco/hopper/expert-v0: no local Minari dataset.*never downloaded"
    with pytest.raises(DatasetError, match=expected):
        load("minari:mujoco/hopper/expert-v0")


def test_minari_nan_names_episode_and_step(hopper, tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    buffers = []
    for i, episode in enumerate(hopper["episodes"]):
        observations = episode["observations"].copy()
        if i == 1:
            observations[4, 3] = np.nan
        buffers.append(
            EpisodeBuffer(
                observations=list(observations),
                actions=list(episode["actions"]),
                rewards=list(episode["rewards"]),
                terminations=list(episode["terminations"]),
                truncations=list(episode["truncations"]),
            )
        )
    minari.create_dataset_from_buffers("test/hopper/nan-v0", buffers, env="Hopper-v5", algorithm_name="test")
    with pytest.raises(DatasetError, match=r"minari:test/hopper/nan-v0: key 'observations', episode 1, step 4: .*nan"):
        load("minari:test/hopper/nan-v0")

