"""`DdsRobot`: a robot on ROS 2 topics, spoken to over DDS directly with cyclonedds (no ROS installation).

Four topics under a prefix P (`--robot ros2:P`), with ROS 2 message types (`mbrl.envs.robots.ros2_types`), ROS 2
topic names (the ROS topic `/P/name` is the DDS topic `rt/P/name`) and the ROS 2 default QoS (reliable,
volatile, keep last 10), so a ROS 2 node on Cyclone DDS can be the robot:

    P/observation  std_msgs/Float64MultiArray  robot -> controller
        data: the observation, then optional simulator fields. layout.dim names the segments of data in order,
        each by `label` and `size` (stride = size; data starts at layout.data_offset):
            observation  obs_dim   the values the policy sees (required when the layout is not empty)
            reward       1         the reward of the step that led here (simulators)
            terminated   1         nonzero: the episode ended in a terminal state (simulators)
            truncated    1         nonzero: the episode hit its time limit (simulators)
            step         1         the step within the episode: 0 after a reset, k + 1 after the action for step k
        Other labels are ignored. An empty layout means all of data is the observation: a robot that publishes
        only its state, with no steps (every message is a new measurement).
    P/action       std_msgs/Float64MultiArray  controller -> robot
        data: the command (act_dim values), then the step it is for; layout dims `action` (act_dim), `step` (1).
    P/request      std_msgs/Header             controller -> robot
        frame_id: `reset`, `reset SEED` (start an episode; SEED an int) or `stop` (hold the safe command until
        the next reset). stamp: the controller's wall clock when it made the request; it identifies the request.
    P/reply        std_msgs/Header             robot -> controller
        stamp: the request's, echoed. frame_id: `ack reset` (sent after the episode's step-0 observation was
        published), `ack stop`, or `error: MESSAGE`. A reply with a zero stamp and `error: MESSAGE` is the robot
        refusing an action (a malformed one); the controller raises it.

Exchanges. A request is published again with the same stamp until a reply with its stamp arrives (3 tries of
`request_timeout`); the robot answers a repeated stamp again without acting on it twice. `reset` starts an
episode (the controller then waits for the step-0 observation); the action for step k makes the robot step
once and publish the observation of step k + 1; an action for a step already applied is ignored (never
steps twice); after `stop` actions are ignored until the next reset. The controller takes the observation
for its current step only, stamps it with its own `time.monotonic()` on reception and numbers fresh ones
with a local seq; the reward of step 0 is None. One controller per prefix.

The controller's side. `connect` joins DDS domain $ROS_DOMAIN_ID (default 0) and waits until the robot
subscribes to P/request and P/action and publishes P/observation and P/reply (up to $MBRL_ROS2_CONNECT_TIMEOUT
seconds, default 5), else RobotError. `observe` waits up to `obs_timeout` for the observation of the current
step, else returns the previous one (stale, same seq: the control loop's watchdog counts it). `act` never
raises (a robot that went away shows as stale observations). `safe_stop` is the `stop` request: RobotError
when unacknowledged. `disconnect` deletes the participant, so a process can connect again.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import time
import weakref

import numpy as np

from mbrl.envs.robots.protocol import Observation, Robot, RobotError
from mbrl.core.errors import MissingDependencyError

CONNECT_TIMEOUT_ENV = "MBRL_ROS2_CONNECT_TIMEOUT"  # seconds connect() waits for the robot's endpoints
DEFAULT_CONNECT_TIMEOUT = 5.0
_NAME = re.compile(r"^(/[A-Za-z_][A-Za-z0-9_]*)+$")
_SCALARS = ("reward", "terminated", "truncated", "step")


def cyclonedds_available() -> bool:
    return importlib.util.find_spec("cyclonedds") is not None


def normalize_prefix(prefix: str) -> str:
    """`/a/b` from `a/b/` and the like; RobotError for a prefix that is not a ROS 2 name."""
    name = "/" + prefix.strip("/")
    if not _NAME.match(name):
        raise RobotError(f"ros2:{prefix}: not a ROS 2 topic prefix; expected tokens of letters, digits and _ "
                         "separated by /, each starting with a letter or _ (such as /my_robot)")
    return name


def parse_segments(message, topic: str, obs_dim: int | None) -> dict:
    """The segments of an observation message by label ({"observation": ndarray, "step": int, ...}); RobotError
    when data does not fit the layout, or the observation does not have `obs_dim` values (unless None)."""
    data = np.asarray(message.data, np.float64)
    dims = [(d.label, int(d.size)) for d in message.layout.dim]
    if not dims:
        parts = {"observation": data}
    else:
        offset = int(message.layout.data_offset)
        total = sum(size for _, size in dims)
        if offset + total != data.size:
            raise RobotError(f"{topic}: a message of {data.size} values, its layout says {offset} + {total} "
                             f"({', '.join(f'{label} {size}' for label, size in dims)})")
        parts, at = {}, offset
        for label, size in dims:
            parts[label] = data[at:at + size]
            at += size
        for label in _SCALARS:
            if label in parts and parts[label].size != 1:
                raise RobotError(f"{topic}: the layout gives `{label}` {parts[label].size} values, expected 1")
        if "observation" not in parts:
            raise RobotError(f"{topic}: no `observation` in the layout (found {', '.join(label for label, _ in dims)})")
    if obs_dim is not None and parts["observation"].size != obs_dim:
        raise RobotError(f"{topic}: an observation of {parts['observation'].size} values, the policy expects {obs_dim}")
    out = {label: (values if label not in _SCALARS else float(values[0])) for label, values in parts.items()}
    if "step" in out:
        out["step"] = int(out["step"])
    return out


class DdsRobot(Robot):
    """A robot behind the topics above. `obs_timeout`: how long `observe` waits for a new observation;
    `connect_timeout` (default: $MBRL_ROS2_CONNECT_TIMEOUT, else 5 s): how long `connect` waits for the robot."""

    def __init__(self, prefix: str, obs_dim: int, action_low, action_high, *, obs_timeout: float = 0.05,
                 request_timeout: float = 1.0, retries: int = 3, connect_timeout: float | None = None):
        if not cyclonedds_available():
            raise MissingDependencyError(f"ros2:{prefix}: cyclonedds is not installed; pip install 'offline-mbrl[ros2]'")
        self.prefix = normalize_prefix(prefix)
        super().__init__(f"ros2:{self.prefix}", obs_timeout=obs_timeout)
        self._set_spec(obs_dim, action_low, action_high)
        self.request_timeout, self.retries = request_timeout, retries
        if connect_timeout is None:
            text = os.environ.get(CONNECT_TIMEOUT_ENV)
            try:
                connect_timeout = float(text) if text else DEFAULT_CONNECT_TIMEOUT
            except ValueError:
                raise RobotError(f"{CONNECT_TIMEOUT_ENV}={text!r}: expected seconds, such as 5") from None
        self.connect_timeout = connect_timeout
        self.topics = {role: "rt" + self.prefix + "/" + role for role in ("observation", "action", "request", "reply")}
        self._dds = None  # the DDS entities, while connected
        self._step = 0
        self._observed_step = -1  # the step whose observation was taken (each is taken once)
        self._stamp_ns = 0
        self._discovered = False  # a robot's endpoints were matched at connect

    def connect(self) -> None:
        try:
            from cyclonedds.core import InstanceState, ReadCondition, SampleState, ViewState, WaitSet
            from cyclonedds.domain import DomainParticipant
            from cyclonedds.pub import DataWriter
            from cyclonedds.sub import DataReader
            from cyclonedds.topic import Topic

            from mbrl.envs.robots import ros2_types as msg
        except ImportError as exc:
            raise MissingDependencyError(f"{self.name}: cannot import cyclonedds ({exc}); pip install 'offline-mbrl[ros2]'") from None
        try:
            domain = msg.domain_id()
        except ValueError as exc:
            raise RobotError(f"{self.name}: {exc}") from None
        self.disconnect()
        self._msg = msg
        qos = msg.default_qos()
        try:
            participant = DomainParticipant(domain)
            types = {"observation": msg.Float64MultiArray, "action": msg.Float64MultiArray, "request": msg.Header,
                     "reply": msg.Header}
            topics = {role: Topic(participant, self.topics[role], types[role], qos=qos) for role in types}
            d = {"participant": participant, "topics": topics}
            d["obs"] = DataReader(participant, topics["observation"], qos=qos)
            d["reply"] = DataReader(participant, topics["reply"], qos=qos)
            d["action"] = DataWriter(participant, topics["action"], qos=qos)
            d["request"] = DataWriter(participant, topics["request"], qos=qos)
            mask = SampleState.NotRead | ViewState.Any | InstanceState.Any
            d["obs_cond"], d["reply_cond"] = ReadCondition(d["obs"], mask), ReadCondition(d["reply"], mask)
            d["waitset"] = WaitSet(participant)
            d["waitset"].attach(d["obs_cond"])
            d["waitset"].attach(d["reply_cond"])
        except Exception as exc:  # such as a CYCLONEDDS_URI that Cyclone DDS rejects
            raise RobotError(f"{self.name}: cannot create the DDS participant and topics in domain {domain} "
                             f"(check CYCLONEDDS_URI): {' '.join(str(exc).split())}") from None
        self._dds = d
        self._step, self._observed_step, self._fresh, self._last = 0, -1, False, None
        waiting = {  # the robot's side of each topic, as this side sees it
            "request": (lambda: d["request"].get_publication_matched_status().current_count, "subscribes to"),
            "action": (lambda: d["action"].get_publication_matched_status().current_count, "subscribes to"),
            "observation": (lambda: d["obs"].get_subscription_matched_status().current_count, "publishes"),
            "reply": (lambda: d["reply"].get_subscription_matched_status().current_count, "publishes"),
        }
        deadline = time.monotonic() + self.connect_timeout
        while waiting:
            waiting = {role: check for role, check in waiting.items() if check[0]() == 0}
            if waiting and time.monotonic() > deadline:
                role, (_, verb) = next(iter(waiting.items()))
                self.disconnect()
                raise RobotError(f"no robot on {self.name}: nobody {verb} {self.topics[role]} after "
                                 f"{self.connect_timeout:g} s; is the robot node running?")
            if waiting:
                time.sleep(0.01)
        self._discovered = True

    # -- receiving ---------------------------------------------------------------------------------------

    def _take(self, key: str, cls) -> list:
        d = self._dds
        return [s for s in d[key].take(N=256, condition=d[key + "_cond"]) if isinstance(s, cls)]

    def _poll(self, stamp=None) -> tuple[bool, str | None]:
        """Take what has arrived: (a new observation was accepted, the reply to `stamp` or None)."""
        reply = None
        for message in self._take("reply", self._msg.Header):
            s = message.stamp
            if s.sec == 0 and s.nanosec == 0 and message.frame_id.startswith("error"):
                raise RobotError(f"{self.name}: the robot refused an action: {message.frame_id}")
            if stamp is not None and (s.sec, s.nanosec) == (stamp.sec, stamp.nanosec):
                reply = message.frame_id
        accepted = None
        for message in self._take("obs", self._msg.Float64MultiArray):
            parts = parse_segments(message, self.topics["observation"], self.obs_dim)
            step = parts.get("step")
            if step is None or (step == self._step and self._observed_step != self._step):
                accepted = parts
                self._observed_step = self._step
        if accepted is not None:
            self._observation(accepted)
        return accepted is not None, reply

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self._dds["waitset"].wait(max(1, int(seconds * 1e9)))

    def _observation(self, parts: dict) -> Observation:
        reward = parts.get("reward")
        return self._measured(parts["observation"], reward=None if reward is None or parts.get("step") == 0 else float(reward),
                              terminated=bool(parts.get("terminated", 0.0)), truncated=bool(parts.get("truncated", 0.0)))

    # -- requests ----------------------------------------------------------------------------------------

    def _request(self, text: str, want_observation: bool = False) -> None:
        """Publish request `text` until its reply arrives; with `want_observation`, also wait for an observation."""
        self._stamp_ns = max(time.time_ns(), self._stamp_ns + 1)
        stamp = self._msg.stamp_of(self._stamp_ns)
        request = self._msg.Header(stamp, text)
        observed = replied = False
        for _ in range(self.retries):
            self._dds["request"].write(request)
            deadline = time.monotonic() + self.request_timeout
            while True:
                fresh, reply = self._poll(stamp)
                observed = observed or fresh
                if reply is not None:
                    if reply != f"ack {text.split()[0]}":
                        raise RobotError(f"{self.name}: the robot answered `{text}` with `{reply}`")
                    replied = True
                if replied and (observed or not want_observation):
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wait(remaining)
            if replied:  # acknowledged, but the observation is missing: asking again would not bring it
                raise RobotError(f"{self.name}: the robot acknowledged `{text}` but published no observation on "
                                 f"{self.topics['observation']} within {self.request_timeout:g} s")
        topic = self.topics["request"]
        if not self._discovered:
            seen = f"no robot was ever discovered on {topic}"
        elif self._dds["request"].get_publication_matched_status().current_count:
            seen = f"a robot was discovered on {topic} and is still listed, but it does not answer (stopped or crashed?)"
        else:
            seen = f"a robot was discovered on {topic} at connect, but nobody subscribes to it now"
        raise RobotError(f"{self.name}: no reply to `{text}` on {self.topics['reply']} after {self.retries} tries of "
                         f"{self.request_timeout:g} s; {seen}")

    def reset(self, seed: int | None = None) -> None:
        self._take("obs", self._msg.Float64MultiArray)  # the previous episode's leftovers
        self._step, self._observed_step, self._fresh = 0, -1, False
        self._request("reset" if seed is None else f"reset {int(seed)}", want_observation=True)
        self._fresh = True

    def _receive_observation(self, seconds: float) -> bool:
        self._wait(seconds)
        fresh, _ = self._poll()
        return fresh

    def _send(self, sent: np.ndarray) -> None:
        try:
            self._dds["action"].write(self._msg.segmented([("action", sent.tolist()), ("step", [self._step])]))
        except Exception:  # a robot that went away: the watchdog sees stale observations and stops
            pass
        self._step += 1

    def safe_stop(self) -> None:
        if self._dds is not None:
            self._request("stop")

    def disconnect(self) -> None:
        """Delete the participant and everything in it, so that this process can connect again."""
        d, self._dds = self._dds, None
        if d is None:
            return
        participant = weakref.ref(d["participant"])
        for key in ("waitset", "obs_cond", "reply_cond", "obs", "reply", "action", "request", "topics", "participant"):
            d.pop(key)
        if participant() is not None:  # held by a reference cycle: collect it now
            gc.collect()
