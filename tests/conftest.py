"""Shared test set-up: keep every test's files and datasets inside pytest's temporary folders."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _xla_accepts(flag: str) -> bool:
    """Whether this jaxlib's XLA knows `flag`: an unknown flag in XLA_FLAGS aborts the process that starts JAX."""
    env = {**os.environ, "XLA_FLAGS": flag}
    done = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                          timeout=300)
    return done.returncode == 0


# The tests' programs are tiny, so most of their time is XLA's compile time. Two flags compile them fastest: LLVM's
# level 0, and XLA's older CPU emitters in place of its fusion emitters (the second took a third off the suite's
# time), although long loops such as FQE's run slower. The same programs, rounded differently in the last bits:
# no test compares two different programs bit for bit or leans on one rounding. Set before JAX starts; xdist's
# workers and every subprocess inherit them. The emitters' flag is checked first: a later XLA may drop it.
LEVEL_0, OLDER_EMITTERS = "--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"
FAST_COMPILE_FLAGS = (LEVEL_0, OLDER_EMITTERS)
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_backend_optimization_level" not in _flags:
    _flags = f"{_flags} {LEVEL_0}".strip()
if "xla_cpu_use_fusion_emitters" not in _flags and _xla_accepts(OLDER_EMITTERS):
    _flags = f"{_flags} {OLDER_EMITTERS}"
os.environ["XLA_FLAGS"] = _flags

# The slowest files first (longest-processing-time-first), so that the two xdist workers, which take whole files in
# this order (`--no-loadscope-reorder`), finish together; the rest keep pytest's order.
SLOWEST_FILES = ("test_train.py", "test_end_to_end.py", "test_sweep.py", "test_end_to_end_model_free.py",
                 "test_ope.py", "test_sweep_workers.py", "test_sac.py", "test_neubay.py", "test_export.py",
                 "test_finetune.py", "test_sharding.py", "test_cql.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def _compile_cache(tmp_path_factory) -> Path:
    """One on-disk compile cache for the whole session, both xdist workers included: tests that build the same
    tiny networks compile each program once. Outside the user's own cache, so no test reads a stale one."""
    root = tmp_path_factory.getbasetemp()
    return (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "jax-cache"


@pytest.fixture(scope="session", autouse=True)
def _isolated_from_the_users_folders(tmp_path_factory):
    """No test reads or writes the user's dataset folders or compile cache. For the whole session, so that
    module-scoped fixtures (trained runs, sweeps) set up before any test's own fixtures are isolated too."""
    import jax

    where = _compile_cache(tmp_path_factory)
    where.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(where))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    root = tmp_path_factory.getbasetemp()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MBRL_DATA_DIR", str(root / "mbrl-datasets"))
        patch.setenv("MINARI_DATASETS_PATH", str(root / "mbrl-datasets"))
        patch.setenv("MBRL_CACHE_DIR", str(where))  # `mbrl train` keeps compiles (and measured layouts) there
        # Populations vmap their members: the same numbers on every machine, and no layout probe per run
        # (tests/test_train.py checks the probe and the mapped layout).
        patch.setenv("MBRL_MEMBER_LAYOUT", "vmap")
        yield


@pytest.fixture(scope="session")
def default_compile_env():
    """The environment without this file's fast-compile flags: a child process started with it compiles as a
    user's run does (the user's own XLA_FLAGS kept)."""
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE_FLAGS)
    return {**os.environ, "XLA_FLAGS": flags}


LOOPBACK_DDS = ('<CycloneDDS><Domain id="any"><General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>'
                '<AllowMulticast>false</AllowMulticast></General><Discovery><ParticipantIndex>auto</ParticipantIndex>'
                '<MaxAutoParticipantIndex>100</MaxAutoParticipantIndex><Peers><Peer address="127.0.0.1"/></Peers>'
                '</Discovery></Domain></CycloneDDS>')


@pytest.fixture(scope="module")
def loopback_dds():
    """DDS discovery on loopback only (no multicast), for this process and the robot nodes it starts."""
    saved = os.environ.get("CYCLONEDDS_URI")
    os.environ["CYCLONEDDS_URI"] = LOOPBACK_DDS
    yield
    if saved is None:
        os.environ.pop("CYCLONEDDS_URI", None)
    else:
        os.environ["CYCLONEDDS_URI"] = saved


@pytest.fixture(scope="session")
def load_script():
    """Import `scripts/NAME.py` (scripts are not a package; NAME may be `experiments/NAME`) and return the module."""

    def load(name):
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        name = Path(name).name
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def hopper_tiny_path(tmp_path_factory):
    """600 steps of Hopper-v5 under uniform random actions (episodes of at most 100), as a D4RL-layout file
    written with h5py."""
    import gymnasium
    import h5py

    env = gymnasium.make("Hopper-v5", max_episode_steps=100)
    rng = np.random.default_rng(0)
    rows = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    obs, _ = env.reset(seed=0)
    episode = 0
    while len(rows["rewards"]) < 600:
        action = rng.uniform(-1, 1, 3).astype(np.float32)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(rows, (obs, action, reward, next_obs, terminated, truncated and not terminated)):
            rows[key].append(value)
        obs = next_obs
        if terminated or truncated:
            episode += 1
            obs, _ = env.reset(seed=episode)
    path = tmp_path_factory.mktemp("data") / "hopper-tiny.hdf5"
    with h5py.File(path, "w") as f:
        for key, values in rows.items():
            dtype = bool if key in ("terminals", "timeouts") else np.float32
            f.create_dataset(key, data=np.asarray(values, dtype))
        f.attrs["env_id"] = "Hopper-v5"
    return path


@pytest.fixture(scope="session")
def onnx_extra():
    """Skips what requests it where the onnx extra (onnx, onnxruntime) is not installed; nothing else skips."""
    for module in ("onnx", "onnxruntime"):
        pytest.importorskip(module, reason="the onnx extra is not installed: pip install 'offline-mbrl[onnx]'")


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory, onnx_extra):
    """An export (test_deploy, test_ros2_dds): a SAC actor at random init for Hopper-v5, with a normalizer from the
    sample dataset; (folder, PolicySpec)."""
    import jax

    from mbrl.agents.sac_n import SACN, SACNConfig
    from mbrl.datasets import SAMPLE_PATH, load
    from mbrl.export import PolicySpec, export_policy

    obs = load(SAMPLE_PATH).transitions.obs
    sac = SACN(SACNConfig(hidden_sizes=(32, 32)), 11, 3)
    params = jax.tree.map(lambda x: 2.0 * x, sac.init(jax.random.PRNGKey(3), sac.hypers()).actor_params)  # bolder actions
    spec = PolicySpec(apply_fn=lambda p, o: sac.act(p, o, None, True), params=params, obs_dim=11, act_dim=3,
                      action_low=-1.0, action_high=1.0, obs_mean=obs.mean(axis=0), obs_std=obs.std(axis=0) + 0.05,
                      control_rate_hz=125.0, env_id="Hopper-v5")
    return export_policy(spec, tmp_path_factory.mktemp("deploy") / "export"), spec


@pytest.fixture(scope="session")
def robot_only_dataset(tmp_path_factory):
    """A damped 4-D system driven by random 2-D actions, as a D4RL-layout file written with h5py: no simulator
    task matches its dimensions (a robot-only dataset)."""
    import h5py

    rng = np.random.default_rng(0)
    rows_ = {k: [] for k in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")}
    for episode in range(12):
        x = rng.normal(size=4).astype(np.float32)
        for t in range(50):
            a = rng.uniform(-1, 1, 2).astype(np.float32)
            nxt = (0.9 * x + 0.1 * np.concatenate([a, a])).astype(np.float32)
            for key, value in zip(rows_, (x, a, -float(np.sum(nxt**2)), nxt, False, t == 49)):
                rows_[key].append(value)
            x = nxt
    path = tmp_path_factory.mktemp("robot") / "robot-arm-v0.hdf5"
    with h5py.File(path, "w") as f:
        for key, values in rows_.items():
            f.create_dataset(key, data=np.asarray(values, bool if key in ("terminals", "timeouts") else np.float32))
    return path
