"""The robot-side server of the UDP protocol (`mbrl.envs.robots.udp`) around a Stepper (`mbrl.envs.robots.stepper`); as a
program, a Gymnasium env in its own process.

    python -m mbrl.envs.robots.sim_server --env Hopper-v5 --port 5555 [--max-episode-steps N] [--log events.jsonl]

It prints `listening on HOST:PORT` once it is ready (`--port 0` picks a free port and prints it). Each
ACTION steps the env once and is answered with the next observation, its reward and end flags, so a
deterministic policy and env seed give the same episode as an in-process evaluation. `--stop-after N`
stops answering after N steps of an episode (a dead sensor, to test the controller's watchdog).
Events (hello, reset, stop, bye, errors) go to `--log` as JSON lines.
"""

from __future__ import annotations

import json
import socket
import sys
import time

import numpy as np

from mbrl.envs.robots.stepper import GymStepper, gym_server_parser, serve_program
from mbrl.envs.robots.udp import ACK, ACTION, BYE, ERROR, HELLO, MAX_DATAGRAM, OBS, RESET, SPEC, STOP, TERMINATED, TRUNCATED, Message


class SimServer:
    def __init__(self, stepper, host: str, port: int, stop_after: int | None = None, log_path: str | None = None):
        self.stepper = stepper
        self.low, self.high = stepper.action_low, stepper.action_high
        self.obs_dim, self.act_dim = stepper.obs_dim, stepper.act_dim
        self.stop_after = stop_after
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.address = self.sock.getsockname()[:2]
        self.log = open(log_path, "a") if log_path else None
        self.client = None
        self.step = 0
        self.stopped = True  # until the first RESET
        self.last_reply: Message | None = None

    def event(self, name: str, **fields) -> None:
        if self.log is not None:
            self.log.write(json.dumps({"event": name, "time": time.time(), **fields}) + "\n")
            self.log.flush()

    def reply(self, message: Message, address) -> None:
        self.sock.sendto(message.encode(), address)

    def error(self, text: str, address) -> None:
        self.event("error", message=text)
        self.reply(Message(ERROR, payload=text.encode()), address)

    def observation(self, obs, reward=0.0, terminated=False, truncated=False) -> Message:
        flags = (TERMINATED if terminated else 0) | (TRUNCATED if truncated else 0)
        return Message(OBS, seq=self.step, flags=flags, stamp=time.monotonic(), reward=float(reward),
                       payload=np.asarray(obs, np.float64).reshape(-1))

    def handle(self, message: Message, address) -> None:
        if message.kind == HELLO:
            self.client = address
            self.event("hello", client=list(address))
            spec = np.concatenate([[self.obs_dim, self.act_dim], self.low, self.high])
            self.reply(Message(SPEC, payload=spec), address)
            return
        if address != self.client:
            self.error("say HELLO first: this server serves the last client that did", address)
            return
        if message.kind == RESET:
            seed = int(message.payload[0]) if len(message.payload) else None
            try:
                obs = self.stepper.reset(seed)
            except Exception as exc:  # noqa: BLE001 - the robot's failure goes to the controller, the server lives on
                self.error(f"reset with seed {seed} failed: {' '.join(str(exc).split())}", address)
                return
            self.step, self.stopped = 0, False
            self.event("reset", seed=seed)
            self.last_reply = self.observation(obs)
            self.reply(self.last_reply, address)
        elif message.kind == ACTION:
            if self.stopped:
                return  # holding the safe command until the next RESET
            if message.seq == self.step - 1 and self.last_reply is not None:
                self.reply(self.last_reply, address)  # our reply was lost; do not step twice
                return
            if message.seq != self.step:
                self.error(f"ACTION for step {message.seq}, expected step {self.step}", address)
                return
            if len(message.payload) != self.act_dim:
                self.error(f"ACTION with {len(message.payload)} values, this robot has {self.act_dim} actuators", address)
                return
            try:
                obs, reward, terminated, truncated = self.stepper.step(np.clip(message.payload, self.low, self.high))
            except Exception as exc:  # noqa: BLE001 - as for reset
                self.error(f"step {self.step} failed: {' '.join(str(exc).split())}", address)
                return
            self.step += 1
            self.last_reply = self.observation(obs, reward, terminated, truncated)
            if self.stop_after is None or self.step <= self.stop_after:
                self.reply(self.last_reply, address)
        elif message.kind == STOP:
            self.stopped = True
            self.event("stop", step=self.step)
            self.reply(Message(ACK), address)
        elif message.kind == BYE:
            self.event("bye")
            self.client = None
        else:
            self.error(f"unexpected message kind {message.kind}", address)

    def serve(self) -> None:
        while True:
            data, address = self.sock.recvfrom(MAX_DATAGRAM)
            try:
                message = Message.decode(data)
            except ValueError as exc:
                self.error(f"a datagram outside the protocol: {exc}", address)
                continue
            self.handle(message, address)

    def close(self) -> None:
        self.sock.close()
        self.stepper.close()
        if self.log is not None:
            self.log.close()


def main(argv: list[str] | None = None) -> int:
    args = gym_server_parser("python -m mbrl.envs.robots.sim_server", __doc__, "answering",
                             ("--host", {"default": "127.0.0.1"}),
                             ("--port", {"type": int, "default": 5555, "help": "0: any free port (printed)"})).parse_args(argv)
    return serve_program(  # a bad env id or a port in use: one line, exit 2
        "sim_server", lambda: SimServer(GymStepper(args.env, args.max_episode_steps), args.host, args.port, args.stop_after,
                                        args.log), lambda server: f"listening on {server.address[0]}:{server.address[1]}")


if __name__ == "__main__":
    sys.exit(main())
