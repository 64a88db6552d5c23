"""The robot-side DDS node of the ROS 2 topics of `mbrl.envs.robots.dds` around a Stepper (`mbrl.envs.robots.stepper`); as a
program, a Gymnasium env in its own process.

    python -m mbrl.envs.robots.dds_sim --env Hopper-v5 --prefix /hopper [--max-episode-steps N] [--stop-after N] [--log events.jsonl]

It prints `ready on ros2:PREFIX` once its readers and writers exist (a controller then discovers them), and
exits 0 on SIGTERM. Each `reset [SEED]` request resets the env with that seed, publishes the step-0
observation and acknowledges; each action for the current step steps the env once and publishes the next
observation with its reward, end flags and step, so a deterministic policy and env seed give the same episode
as an in-process evaluation. A repeated request (same stamp) is acknowledged again without acting twice; an
action for a step already applied is ignored; after `stop` actions are ignored until the next reset.
`--stop-after N` stops publishing observations after N steps of an episode (a dead sensor). Events (reset,
stop, errors, controllers coming and going) go to `--log` as JSON lines. The domain is $ROS_DOMAIN_ID (0).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from mbrl.envs.robots.dds import normalize_prefix
from mbrl.envs.robots.stepper import GymStepper, gym_server_parser, serve_program


class DdsSim:
    def __init__(self, stepper, prefix: str, stop_after: int | None = None, log_path: str | None = None):
        # optional: cyclonedds, the ros2 extra (main() says so when it is missing)
        from cyclonedds.core import InstanceState, ReadCondition, SampleState, ViewState, WaitSet
        from cyclonedds.domain import DomainParticipant
        from cyclonedds.pub import DataWriter
        from cyclonedds.sub import DataReader
        from cyclonedds.topic import Topic

        from mbrl.envs.robots import ros2_types as msg  # optional: imports cyclonedds (the ros2 extra)

        self.msg = msg
        self.prefix = normalize_prefix(prefix)
        domain = msg.domain_id()
        self.stepper = stepper
        self.low, self.high, self.act_dim = stepper.action_low, stepper.action_high, stepper.act_dim
        self.stop_after = stop_after
        qos = msg.default_qos()
        self.participant = DomainParticipant(domain)
        names = {role: "rt" + self.prefix + "/" + role for role in ("observation", "action", "request", "reply")}
        types = {"observation": msg.Float64MultiArray, "action": msg.Float64MultiArray, "request": msg.Header, "reply": msg.Header}
        self.topics = {role: Topic(self.participant, names[role], types[role], qos=qos) for role in types}
        self.requests = DataReader(self.participant, self.topics["request"], qos=qos)
        self.actions = DataReader(self.participant, self.topics["action"], qos=qos)
        self.observations = DataWriter(self.participant, self.topics["observation"], qos=qos)
        self.replies = DataWriter(self.participant, self.topics["reply"], qos=qos)
        mask = SampleState.NotRead | ViewState.Any | InstanceState.Any
        self.request_cond, self.action_cond = ReadCondition(self.requests, mask), ReadCondition(self.actions, mask)
        self.waitset = WaitSet(self.participant)
        self.waitset.attach(self.request_cond)
        self.waitset.attach(self.action_cond)
        self.log = open(log_path, "a") if log_path else None
        self.step = 0
        self.stopped = True  # until the first reset
        self.last_stamp = None  # the last request handled, and its reply
        self.last_reply = None
        self.last_obs = None
        self.controllers = 0

    def event(self, name: str, **fields) -> None:
        if self.log is not None:
            self.log.write(json.dumps({"event": name, "time": time.time(), **fields}) + "\n")
            self.log.flush()

    def reply(self, stamp, text: str) -> None:
        self.replies.write(self.msg.Header(stamp, text))

    def refuse(self, text: str) -> None:
        """An action the robot cannot take: logged, and published as an error reply with a zero stamp."""
        self.event("error", message=text)
        self.reply(self.msg.Time(), f"error: {text}")

    def publish(self, obs, reward=0.0, terminated=False, truncated=False) -> None:
        self.last_obs = self.msg.segmented([
            ("observation", np.asarray(obs, np.float64).reshape(-1).tolist()), ("reward", [float(reward)]),
            ("terminated", [float(terminated)]), ("truncated", [float(truncated)]), ("step", [self.step])])
        if self.stop_after is None or self.step <= self.stop_after:
            self.observations.write(self.last_obs)

    def on_request(self, request) -> None:
        stamp = (request.stamp.sec, request.stamp.nanosec)
        if stamp == self.last_stamp:  # a retry: our reply was slow or lost; do not act twice
            if self.last_reply == "ack reset" and self.step == 0 and self.last_obs is not None:
                self.observations.write(self.last_obs)
            self.reply(request.stamp, self.last_reply)
            return
        words = request.frame_id.split()
        if words[:1] == ["reset"] and (len(words) == 1 or (len(words) == 2 and words[1].lstrip("-").isdigit())):
            seed = int(words[1]) if len(words) == 2 else None
            try:
                obs = self.stepper.reset(seed)
            except Exception as exc:  # such as a negative seed
                text = f"error: reset with seed {seed} failed: {' '.join(str(exc).split())}"
                self.event("error", message=text)
            else:
                self.step, self.stopped = 0, False
                self.event("reset", seed=seed)
                self.publish(obs)
                text = "ack reset"
        elif words == ["stop"]:
            self.stopped = True
            self.event("stop", step=self.step)
            text = "ack stop"
        else:
            text = f"error: unknown request {request.frame_id!r}; expected reset, reset SEED or stop"
            self.event("error", message=text)
        self.last_stamp, self.last_reply = stamp, text
        self.reply(request.stamp, text)

    def on_action(self, message) -> None:
        if self.stopped:
            return  # holding the safe command until the next reset
        parts = {d.label: int(d.size) for d in message.layout.dim}
        if list(parts) != ["action", "step"] or parts["step"] != 1 or len(message.data) != sum(parts.values()):
            self.refuse(f"an action message with layout {parts} and {len(message.data)} values; expected action, step")
            return
        step = int(message.data[-1])
        if step < self.step:
            return  # a repeat of an applied step: never step twice
        if step != self.step:
            self.event("error", message=f"an action for step {step}, expected step {self.step}")
            return
        if parts["action"] != self.act_dim:
            self.refuse(f"an action of {parts['action']} values, this robot has {self.act_dim} actuators")
            return
        try:
            obs, reward, terminated, truncated = self.stepper.step(
                np.clip(np.asarray(message.data[:-1], np.float64), self.low, self.high))
        except Exception as exc:  # noqa: BLE001 - the robot's failure goes to the controller, the node lives on
            self.refuse(f"step {self.step} failed: {' '.join(str(exc).split())}")
            return
        self.step += 1
        self.publish(obs, reward, terminated, truncated)

    def serve(self) -> None:
        from cyclonedds.util import duration

        while True:
            self.waitset.wait(duration(milliseconds=200))  # short: a SIGTERM is handled between waits
            batch = [(s.sample_info.source_timestamp, 0, s) for s in self.requests.take(N=256, condition=self.request_cond)
                     if isinstance(s, self.msg.Header)]
            batch += [(s.sample_info.source_timestamp, 1, s) for s in self.actions.take(N=256, condition=self.action_cond)
                      if isinstance(s, self.msg.Float64MultiArray)]
            for _, kind, sample in sorted(batch, key=lambda item: item[:2]):  # in the order the controller wrote them
                (self.on_request if kind == 0 else self.on_action)(sample)
            controllers = self.requests.get_subscription_matched_status().current_count
            if controllers != self.controllers:
                self.controllers = controllers
                self.event("controllers", count=controllers)

    def close(self) -> None:
        self.stepper.close()
        if self.log is not None:
            self.log.close()


def main(argv: list[str] | None = None) -> int:
    args = gym_server_parser("python -m mbrl.envs.robots.dds_sim", __doc__, "publishing observations",
                             ("--prefix", {"default": "/robot", "help": "the ROS 2 topic prefix (default /robot)"})).parse_args(argv)
    try:
        import cyclonedds  # noqa: F401
    except ImportError as exc:
        print(f"dds_sim: error: cannot import cyclonedds ({exc}); pip install 'offline-mbrl[ros2]'", file=sys.stderr)
        return 2

    return serve_program(  # a bad env id, prefix or domain: one line, exit 2
        "dds_sim", lambda: DdsSim(GymStepper(args.env, args.max_episode_steps), args.prefix, args.stop_after, args.log),
        lambda node: f"ready on ros2:{node.prefix}")


if __name__ == "__main__":
    sys.exit(main())
