"""`mbrl data import`: ROS 2 bags (sqlite3 and mcap, written with rosbags' own writer), LeRobot parquet and CSV
tables into Minari datasets that `mbrl.datasets.load` and `mbrl data info` read, and one line + exit 2 on bad input.

The bags hold a simulated 1-D cart (x'' = u, reward -x_next^2 - 0.1 u^2), declared in a TOML file with its rules
in a .py beside it: joint states at 100 Hz, commands at 50 Hz, control at 50 Hz, with jitter on the receive times,
one dropped joint-state message and a pause that splits the run into two episodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from mbrl.cli import main
from mbrl.datasets import load
from mbrl.envs.tasks import find_task

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

DT = 0.02  # the control period (50 Hz); joint states come every DT / 2
NS = 1_000_000_000
STEPS = 60
DROPPED = (0, 30)  # (episode, step) whose joint-state message the recorder lost

RULES = '''
import jax.numpy as jnp


def reward(obs, action, next_obs):
    return -next_obs[..., 0] ** 2 - 0.1 * action[..., 0] ** 2


def terminated(obs, action, next_obs):
    return jnp.abs(next_obs[..., 0]) > 3.0
'''

DECLARATION = '''
name = "cart1d"
control_hz = {control_hz}
max_episode_steps = 200
reward = "cart_rules.py:reward"
termination = "cart_rules.py:terminated"

[[observation]]
name = "position"
unit = "m"
topic = "/joint_states"
field = "position[0]"

[[observation]]
name = "velocity"
unit = "m/s"
topic = "/joint_states"
field = "velocity[0]"

[[action]]
name = "force"
unit = "N"
low = {low}
high = 1.0
topic = "/cmd"
field = "data[0]"

[import]
{settings}
'''


def declare(folder: Path, control_hz=50.0, low=-1.0, settings='max_age_s = 0.014', edit=("", "")) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cart_rules.py").write_text(RULES)
    path = folder / "cart.toml"
    text = DECLARATION.format(control_hz=control_hz, low=low, settings=settings)
    path.write_text(text.replace(*edit) if edit[0] else text)
    return path


def simulate(x0: float, rng) -> dict[str, np.ndarray]:
    """One episode of the cart under a noisy PD controller, integrated exactly; the half-step states too."""
    states, halves, actions, rewards = [np.array([x0, 0.0])], [], [], []
    for _ in range(STEPS):
        x, v = states[-1]
        u = float(np.clip(-1.2 * x - 1.6 * v + 0.2 * rng.normal(), -1.0, 1.0))
        h = DT / 2
        halves.append(np.array([x + v * h + u * h * h / 2, v + u * h]))
        nxt = np.array([x + v * DT + u * DT * DT / 2, v + u * DT])
        states.append(nxt)
        actions.append(u)
        rewards.append(-nxt[0] ** 2 - 0.1 * u**2)
    return {"states": np.array(states), "halves": np.array(halves), "actions": np.array(actions),
            "rewards": np.array(rewards)}


@pytest.fixture(scope="module")
def cart_run():
    rng = np.random.default_rng(0)
    return [simulate(1.0, rng), simulate(-0.8, rng)]


def write_bag(path: Path, run, plugin_name: str) -> Path:
    """The run as a rosbag2: receive times jittered, the controller answering each state within ~2 ms, a 1 s pause
    between the episodes, and one joint-state message missing."""
    store = get_typestore(Stores.ROS2_HUMBLE)
    joint_state, header, stamp = (store.types[t] for t in (
        "sensor_msgs/msg/JointState", "std_msgs/msg/Header", "builtin_interfaces/msg/Time"))
    array, layout = store.types["std_msgs/msg/Float64MultiArray"], store.types["std_msgs/msg/MultiArrayLayout"]
    rng = np.random.default_rng(1)
    messages = []  # (time ns, topic, message)

    def state_message(t: float, state) -> object:
        return joint_state(header=header(stamp=stamp(sec=int(t), nanosec=int(t % 1 * NS)), frame_id=""),
                           name=["cart"], position=np.array([state[0]]), velocity=np.array([state[1]]),
                           effort=np.zeros(0))

    start = 1.0
    for e, episode in enumerate(run):
        for k in range(STEPS + 1):
            t = start + k * DT
            if (e, k) != DROPPED:
                messages.append((t + 0.0005 + rng.uniform(-3e-4, 3e-4), "/joint_states",
                                 state_message(t, episode["states"][k])))
            if k < STEPS:
                messages.append((t + DT / 2 + 0.0005 + rng.uniform(-3e-4, 3e-4), "/joint_states",
                                 state_message(t + DT / 2, episode["halves"][k])))
                messages.append((t + 0.002 + rng.uniform(-5e-4, 5e-4), "/cmd",
                                 array(layout=layout(dim=[], data_offset=0), data=np.array([episode["actions"][k]]))))
        start += STEPS * DT + 1.0
    return write_messages(path, messages, plugin_name)


def write_messages(path: Path, messages: list, plugin_name: str = "MCAP") -> Path:
    """(time s, topic, message) as a bag, with rosbags' own writer."""
    store = get_typestore(Stores.ROS2_HUMBLE)
    with Writer(path, version=8, storage_plugin=StoragePlugin[plugin_name]) as writer:
        conns = {}
        for t, topic, msg in sorted(messages, key=lambda m: m[0]):
            if topic not in conns:
                conns[topic] = writer.add_connection(topic, msg.__msgtype__, typestore=store)
            writer.write(conns[topic], int(round(t * NS)), store.serialize_cdr(msg, msg.__msgtype__))
    return path


@pytest.fixture(scope="module", params=["SQLITE3", "MCAP"])
def cart_bag(request, tmp_path_factory, cart_run):
    return write_bag(tmp_path_factory.mktemp("bags") / f"cart_{request.param.lower()}", cart_run, request.param)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bag_imports_as_the_simulated_run(tmp_path, capsys, cart_bag, cart_run):
    toml = declare(tmp_path / "robot")
    out = tmp_path / "cart-data"
    code, stdout, err = run_cli(capsys, "data", "import", cart_bag, "--task", toml, "--out", out, "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    # The lost joint state leaves one tick stale and cuts its episode; the pause is a gap between episodes.
    assert (summary["stale_ticks"], summary["stale_cuts"], summary["gaps"], summary["episodes"]) == (1, 1, 1, 3)
    assert summary["ticks"] == 2 * (STEPS + 1) and summary["kept_ticks"] == 2 * (STEPS + 1) - 1
    assert summary["transitions"] == 2 * STEPS - 2 and summary["terminations"] == 0

    dataset = load(out)  # no --task: the dataset's metadata names its declaration
    assert dataset.info.task == "cart1d" and dataset.info.action_low == (-1.0,)
    assert find_task(dataset.info.task).reward_fn is not None
    cut = DROPPED[1]
    first, second = cart_run
    kept = [(first, 0, cut - 1), (first, cut + 1, STEPS), (second, 0, STEPS)]  # steps [a, b) of each episode
    expected_returns = [episode["rewards"][a:b].sum() for episode, a, b in kept]
    np.testing.assert_allclose(dataset.episode_returns(), expected_returns, rtol=1e-4)
    expected_obs = np.concatenate([episode["states"][a:b] for episode, a, b in kept])
    expected_act = np.concatenate([episode["actions"][a:b] for episode, a, b in kept])
    np.testing.assert_allclose(dataset.transitions.obs, expected_obs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dataset.transitions.action[:, 0], expected_act, rtol=1e-5, atol=1e-6)
    assert dataset.transitions.timeout.sum() == 3 and not dataset.transitions.terminal.any()

    code, stdout, err = run_cli(capsys, "data", "info", out)
    assert code == 0, err
    assert "cart1d" in stdout


def test_episode_topic_reward_topic_and_twist_commands(tmp_path, capsys, cart_run):
    """Episodes split by a marker topic alone (the pause is shorter than episode_gap_s), the reward read from a
    topic (sampled at the tick after the action), commands as geometry_msgs/msg/Twist linear.x."""
    store = get_typestore(Stores.ROS2_HUMBLE)
    joint_state, header, stamp, twist, vector, number, empty = (store.types[f"{t}"] for t in (
        "sensor_msgs/msg/JointState", "std_msgs/msg/Header", "builtin_interfaces/msg/Time",
        "geometry_msgs/msg/Twist", "geometry_msgs/msg/Vector3", "std_msgs/msg/Float64", "std_msgs/msg/Empty"))
    messages, start = [], 1.0
    for episode in cart_run:
        messages.append((start - 0.001, "/reset", empty()))
        for k, state in enumerate(episode["states"]):
            t = start + k * DT
            messages.append((t + 0.0005, "/joint_states", joint_state(
                header=header(stamp=stamp(sec=0, nanosec=0), frame_id=""), name=["cart"],
                position=state[:1].copy(), velocity=state[1:].copy(), effort=np.zeros(0))))
            if k < STEPS:
                messages.append((t + 0.002, "/cmd_vel", twist(linear=vector(x=episode["actions"][k], y=0.0, z=0.0),
                                                               angular=vector(x=0.0, y=0.0, z=0.0))))
            if k > 0:
                messages.append((t + 0.001, "/reward", number(data=10 * episode["rewards"][k - 1])))
        start += STEPS * DT + 0.05
    bag = write_messages(tmp_path / "bag", messages)
    settings = 'max_age_s = 0.014\nepisode_topic = "/reset"\nreward_topic = "/reward"\nreward_field = "data"'
    toml = declare(tmp_path / "robot", settings=settings,
                   edit=('topic = "/cmd"\nfield = "data[0]"', 'topic = "/cmd_vel"\nfield = "linear.x"'))
    code, stdout, err = run_cli(capsys, "data", "import", bag, "--task", toml, "--out", tmp_path / "out", "--json")
    assert code == 0, err
    summary = json.loads(stdout)
    assert (summary["markers"], summary["gaps"], summary["episodes"], summary["stale_ticks"]) == (2, 0, 2, 0)
    np.testing.assert_allclose(load(tmp_path / "out").episode_returns(),
                               [10 * episode["rewards"].sum() for episode in cart_run], rtol=1e-6)


def test_lerobot_dataset_imports_with_its_rewards(tmp_path, capsys):
    root = tmp_path / "lerobot"
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps({"fps": 50, "features": {
        "observation.state": {"dtype": "float32", "shape": [2]},
        "observation.images.top": {"dtype": "video", "shape": [96, 96, 3]}}}))
    rng = np.random.default_rng(2)
    written = []
    for episode, frames in enumerate((7, 5)):
        folder = root / "data" / "chunk-000"
        folder.mkdir(parents=True, exist_ok=True)
        reward = rng.normal(size=frames)
        written.append(reward[:-1].sum())  # the last frame has no next observation
        pq.write_table(pa.table({
            "observation.state": pa.array(rng.normal(size=(frames, 2)).tolist(), pa.list_(pa.float32())),
            "action": pa.array(rng.uniform(-1, 1, (frames, 1)).tolist(), pa.list_(pa.float32())),
            "episode_index": pa.array([episode] * frames, pa.int64()),
            "frame_index": pa.array(range(frames), pa.int64()),
            "next.reward": pa.array(reward, pa.float32()),
            "next.done": pa.array([False] * (frames - 1) + [True]),
        }), folder / f"episode_{episode:06d}.parquet")
    toml = declare(tmp_path / "robot", low=-1.0)
    code, stdout, err = run_cli(capsys, "data", "import", root, "--task", toml, "--out", tmp_path / "out")
    assert code == 0, err
    assert "stale ticks" in stdout and "observation.images.top" in stdout  # the summary, naming what was left out
    dataset = load(tmp_path / "out")
    assert dataset.info.task == "cart1d" and dataset.num_episodes == 2
    np.testing.assert_allclose(dataset.episode_returns(), written, rtol=1e-5)
    # A single parquet file of the same layout is a LeRobot dataset too.
    single = root / "data" / "chunk-000" / "episode_000001.parquet"
    code, _, err = run_cli(capsys, "data", "import", single, "--task", toml, "--out", tmp_path / "one", "--json")
    assert code == 0, err
    np.testing.assert_allclose(load(tmp_path / "one").episode_returns(), written[1:], rtol=1e-5)


def test_csv_imports_with_its_rewards_and_terminations(tmp_path, capsys):
    rng = np.random.default_rng(3)
    rows = 12
    position = rng.uniform(-1, 1, rows)
    position[8] = 3.5  # row 7 -> row 8 crosses |x| > 3: terminated there
    reward = rng.normal(size=rows)
    episode = [0] * 5 + [1] * 7
    lines = ["episode,position,velocity,force,reward"]
    lines += [",".join([str(e)] + [repr(float(x)) for x in (p, v, f, r)]) for e, p, v, f, r in
              zip(episode, position, rng.normal(size=rows), rng.uniform(-1, 1, rows), reward)]
    csv = tmp_path / "log.csv"
    csv.write_text("\n".join(lines) + "\n")
    toml = declare(tmp_path / "robot", settings='reward_column = "reward"')
    code, stdout, err = run_cli(capsys, "data", "import", csv, "--task", toml, "--out", tmp_path / "out", "--json")
    assert code == 0, err
    assert json.loads(stdout)["terminations"] == 1
    dataset = load(tmp_path / "out")
    # Rows 0-4 (4 transitions); rows 5-8 end terminated; rows 8-11 go on as a new episode.
    np.testing.assert_allclose(dataset.episode_returns(), [reward[0:4].sum(), reward[5:8].sum(), reward[8:11].sum()],
                               rtol=1e-5)
    assert dataset.transitions.terminal.sum() == 1 and dataset.transitions.timeout.sum() == 2


@pytest.mark.parametrize("case, declaration, needles", [
    ("missing topic", {"edit": ('topic = "/cmd"', 'topic = "/command"')}, ["/command", "/cmd"]),
    ("bad field path", {"edit": ('"position[0]"', '"positon[0]"')}, ["/joint_states", "positon", "has no field"]),
    ("index past the array", {"edit": ('"velocity[0]"', '"velocity[2]"')}, ["velocity[2]", "1 values"]),
    ("unsupported rate", {"control_hz": 500.0, "settings": ""}, ["/joint_states", "Hz", "control_hz = 500"]),
    ("action outside bounds", {"low": -0.1}, ["force", "outside its declared bounds", "--clip-actions"]),
    ("truncated bag", {}, ["cannot read", "truncated"]),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, cart_run, case, declaration, needles):
    bag = write_bag(tmp_path / "bag", cart_run[:1], "MCAP")
    if case == "truncated bag":
        data = next(bag.glob("*.mcap"))
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    toml = declare(tmp_path / "robot", **declaration)
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "data", "import", bag, "--task", toml, "--out", out)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mbrl: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("case, needles", [
    ("lerobot state of another size", ["observation.state", "3 values", "expected 2"]),
    ("table without a declared column", ["velocity", "no column"]),
])
def test_declaration_disagreeing_with_a_table(tmp_path, capsys, case, needles):
    toml = declare(tmp_path / "robot")
    if case.startswith("lerobot"):
        source = tmp_path / "frames.parquet"
        pq.write_table(pa.table({"observation.state": [[0.0, 1.0, 2.0]] * 3, "action": [[0.0]] * 3,
                                 "episode_index": [0] * 3}), source)
    else:
        source = tmp_path / "log.csv"
        source.write_text("position,force\n0.0,0.1\n0.1,0.2\n")
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "data", "import", source, "--task", toml, "--out", out)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and all(n in err for n in needles), err
    assert not out.exists()
