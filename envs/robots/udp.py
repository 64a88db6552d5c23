"""`UdpRobot` and the UDP message protocol it speaks with a robot-side server.

Every datagram is a 32-byte little-endian header followed by float64 values:

    offset  type     field
    0       4 bytes  magic b"MBRL"
    4       uint8    version (1)
    5       uint8    kind: HELLO 1, SPEC 2, RESET 3, OBS 4, ACTION 5, STOP 6, BYE 7, ACK 8, ERROR 9
    6       uint16   flags: bit 0 terminated, bit 1 truncated (OBS)
    8       uint32   seq: the step within the episode (OBS, ACTION); echoed in replies
    12      uint32   reserved (0)
    16      float64  stamp: the sender's clock, seconds (informational)
    24      float64  reward: of the step that produced this observation (OBS), else 0
    32      float64[n] payload, n = (datagram size - 32) / 8

Exchanges (client = the controller, server = the robot):
    HELLO            -> SPEC    payload [obs_dim, act_dim, low_1..low_A, high_1..high_A]
    RESET [seed]     -> OBS     the first observation of an episode, seq 0 (payload empty: no seed)
    ACTION seq=k [a] -> OBS     seq k+1: the robot applied a and measured again; a repeated ACTION
                                for an already applied step is answered with the same OBS (a lost reply)
    STOP             -> ACK     the robot holds its safe command until the next RESET
    BYE              -> (none)  the robot forgets the client
    anything wrong   -> ERROR   payload: a UTF-8 message instead of floats
A server serves one client at a time: the last one that said HELLO.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

import numpy as np

from mbrl.core.errors import ConfigError
from mbrl.envs.robots.protocol import Observation, Robot, RobotError

MAGIC, VERSION = b"MBRL", 1
HEADER = struct.Struct("<4sBBHIIdd")
HELLO, SPEC, RESET, OBS, ACTION, STOP, BYE, ACK, ERROR = range(1, 10)
TERMINATED, TRUNCATED = 1, 2
MAX_DATAGRAM = 65507


@dataclass(frozen=True)
class Message:
    kind: int
    seq: int = 0
    flags: int = 0
    stamp: float = 0.0
    reward: float = 0.0
    payload: np.ndarray | bytes = b""

    def encode(self) -> bytes:
        body = self.payload if isinstance(self.payload, bytes) else np.asarray(self.payload, "<f8").tobytes()
        return HEADER.pack(MAGIC, VERSION, self.kind, self.flags, self.seq, 0, self.stamp, self.reward) + body

    @classmethod
    def decode(cls, data: bytes) -> Message:
        if len(data) < HEADER.size:
            raise ValueError(f"a datagram of {len(data)} bytes, shorter than the {HEADER.size}-byte header")
        magic, version, kind, flags, seq, _, stamp, reward = HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"magic/version {magic!r}/{version}, expected {MAGIC!r}/{VERSION}")
        body = data[HEADER.size:]
        if kind == ERROR:
            return cls(kind, seq, flags, stamp, reward, body)
        if len(body) % 8:
            raise ValueError(f"a payload of {len(body)} bytes, not a whole number of float64")
        return cls(kind, seq, flags, stamp, reward, np.frombuffer(body, "<f8").copy())

    def error_text(self) -> str:
        return bytes(self.payload).decode("utf-8", "replace")


def parse_address(uri: str, any_port: bool = False) -> tuple[str, int]:
    """("host", port) from udp://HOST:PORT; `any_port` (a server's address) also takes port 0, any free one."""
    rest = uri.removeprefix("udp://")
    host, _, port = rest.rpartition(":")
    lowest = 0 if any_port else 1
    if not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ConfigError(f"--robot {uri!r}: expected udp://HOST:PORT with a port in {lowest}..65535"
                          + (" (0: any free port)" if any_port else ""))
    return host.strip("[]"), int(port)


class UdpRobot(Robot):
    """A robot behind the UDP protocol above. `obs_timeout`: how long `observe` waits for a new observation."""

    def __init__(self, host: str, port: int, *, obs_timeout: float = 0.05, request_timeout: float = 2.0, retries: int = 3):
        super().__init__(f"udp://{host}:{port}", obs_timeout=obs_timeout)
        self.address = (host, port)
        self.request_timeout, self.retries = request_timeout, retries
        self.sock: socket.socket | None = None
        self._step = 0

    def _transmit(self, message: Message) -> None:
        try:
            self.sock.send(message.encode())
        except ConnectionRefusedError:  # ICMP port unreachable after an earlier send: nobody listens
            raise RobotError(f"{self.name}: connection refused; is the robot server running?") from None

    def _receive(self, timeout: float) -> Message | None:
        """The next valid datagram from the robot within `timeout` seconds, or None."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(MAX_DATAGRAM)
            except (TimeoutError, socket.timeout):
                return None
            except ConnectionRefusedError:  # ICMP port unreachable after an earlier send: nobody listens
                raise RobotError(f"{self.name}: connection refused; is the robot server running?") from None
            try:
                message = Message.decode(data)
            except ValueError as exc:
                raise RobotError(f"{self.name}: a datagram outside the protocol ({exc})") from None
            if message.kind == ERROR:
                raise RobotError(f"{self.name}: the robot answered with an error: {message.error_text()}")
            return message

    def _request(self, message: Message, expect: int, seq: int | None = None) -> Message:
        for _ in range(self.retries):
            self._transmit(message)
            deadline = time.monotonic() + self.request_timeout
            while (remaining := deadline - time.monotonic()) > 0:
                reply = self._receive(remaining)
                if reply is None:
                    break
                if reply.kind == expect and (seq is None or reply.seq == seq):
                    return reply
        raise RobotError(f"{self.name}: no answer after {self.retries} tries of {self.request_timeout:.1f} s; is the robot server running?")

    def connect(self) -> None:
        try:
            family = socket.getaddrinfo(*self.address, type=socket.SOCK_DGRAM)[0][0]
        except socket.gaierror as exc:
            raise RobotError(f"{self.name}: cannot resolve the host ({exc})") from None
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.connect(self.address)  # only this peer's datagrams; a closed port raises instead of hanging
        spec = self._request(Message(HELLO), SPEC).payload
        act_dim = int(spec[1]) if len(spec) >= 2 else -1
        if act_dim < 1 or len(spec) != 2 + 2 * act_dim:
            raise RobotError(f"{self.name}: a SPEC message with {len(spec)} values, expected 2 + 2 * act_dim")
        self._set_spec(int(spec[0]), spec[2:2 + act_dim], spec[2 + act_dim:])

    def _observation(self, message: Message) -> Observation:
        return self._measured(message.payload, reward=float(message.reward) if message.seq > 0 else None,
                              terminated=bool(message.flags & TERMINATED), truncated=bool(message.flags & TRUNCATED))

    def reset(self, seed: int | None = None) -> None:
        payload = np.zeros(0) if seed is None else np.asarray([seed], np.float64)
        self._step = 0
        self._observation(self._request(Message(RESET, payload=payload), OBS, seq=0))
        self._fresh = True

    def _receive_observation(self, seconds: float) -> bool:
        message = self._receive(seconds)
        if message is not None and message.kind == OBS and message.seq == self._step:
            self._observation(message)
            return True
        return False

    def _send(self, sent: np.ndarray) -> None:
        try:
            self._transmit(Message(ACTION, seq=self._step, stamp=time.monotonic(), payload=sent.astype(np.float64)))
        except RobotError:
            pass  # a robot that went away stops answering: the watchdog sees stale observations and stops
        self._step += 1

    def safe_stop(self) -> None:
        if self.sock is not None:
            self._request(Message(STOP), ACK)

    def disconnect(self) -> None:
        if self.sock is not None:
            try:
                self._transmit(Message(BYE))
            except OSError:
                pass
            self.sock.close()
            self.sock = None
