"""ROS 2 bags (rosbag2: sqlite3 `.db3` or `.mcap` storage), read with `rosbags` (pure Python, no ROS install).

Each declared channel names a `topic` and a `field` path into its message (`position[0]`, `data[1]`,
`linear.x`); any message type the bag or ROS 2 Humble defines works (JointState, Float64MultiArray, Twist, ...).
A message's time is the bag's receive timestamp, not its `header.stamp`: every message has one, from one clock.
The channels are then put on the control-rate grid by `mbrl.datasets.importers.sampling`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rosbags.interfaces import MessageDefinitionFormat
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_types_from_idl, get_types_from_msg, get_typestore

from mbrl.core.declaration import Declaration
from mbrl.core.errors import DatasetError, UserError
from mbrl.datasets.importers import BAG_SUFFIXES, Imported, sampling
from mbrl.datasets.importers.settings import ImportSettings, parse_field_path


def read_bag(path: Path, decl: Declaration, settings: ImportSettings) -> Imported:
    bag = _bag_folder(path)
    source = str(bag)
    # (topic, field) per channel, in the declaration's order; obs first, then actions, then the reward.
    channels = []
    for kind, group in (("observation", decl.observations), ("action", decl.actions)):
        for channel in group:
            if channel.topic is None:
                raise DatasetError(f"{decl.path}: {kind} {channel.name!r} has no 'topic' and 'field'; expected both "
                                   f"to read it from the ROS 2 bag {source}")
            channels.append((kind, channel.name, channel.topic, channel.field))
    if settings.reward_topic is not None:
        channels.append(("reward", "reward", settings.reward_topic, settings.reward_field))
    fields: dict[str, list[str]] = {}
    for _, _, topic, field in channels:
        if field not in fields.setdefault(topic, []):
            fields[topic].append(field)

    typestore = get_typestore(Stores.ROS2_HUMBLE)
    values: dict[str, list] = {topic: [] for topic in fields}
    times: dict[str, list] = {topic: [] for topic in fields}
    markers: list[int] = []
    try:
        with Reader(bag) as reader:
            by_topic = {}
            for conn in reader.connections:
                by_topic.setdefault(conn.topic, []).append(conn)
            wanted = list(fields) + ([settings.episode_topic] if settings.episode_topic else [])
            for topic in wanted:
                if topic not in by_topic:
                    users = [f"{kind} {name!r}" for kind, name, t, _ in channels if t == topic]
                    users = users or ["[import] episode_topic"]
                    have = ", ".join(f"{t} ({c[0].msgtype})" for t, c in sorted(by_topic.items())) or "no topics"
                    raise DatasetError(f"{source}: no topic '{topic}' (for {', '.join(users)}); the bag has {have}")
            paths = {topic: [parse_field_path(f, f"{decl.path}: field") for f in fields[topic]] for topic in fields}
            for topic in fields:
                for conn in by_topic[topic]:
                    _know_type(typestore, conn, source)
            conns = [c for t in wanted for c in by_topic[t]]
            for conn, stamp, raw in reader.messages(connections=conns):
                if conn.topic == settings.episode_topic:
                    markers.append(stamp)
                    if conn.topic not in fields:
                        continue
                msg = typestore.deserialize_cdr(raw, conn.msgtype)
                row = [_walk(msg, steps, text, conn, stamp, source)
                       for steps, text in zip(paths[conn.topic], fields[conn.topic])]
                values[conn.topic].append(row)
                times[conn.topic].append(stamp)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a damaged bag makes rosbags or sqlite raise
        raise DatasetError(f"{source}: cannot read the ROS 2 bag ({' '.join(str(exc).split()) or type(exc).__name__}); "
                           f"it may be truncated or corrupt") from None

    streams = {}
    for topic in fields:
        if not times[topic]:
            raise DatasetError(f"{source}: topic '{topic}' has no messages; expected a stream at about "
                               f"{decl.control_hz:g} Hz or faster")
        stamp = np.asarray(times[topic], np.int64)
        order = np.argsort(stamp, kind="stable")
        streams[topic] = sampling.Stream(topic, stamp[order], np.asarray(values[topic], np.float64)[order])

    def column(topic: str, field: str) -> tuple[str, int]:
        return topic, fields[topic].index(field)

    obs_columns = [column(t, f) for kind, _, t, f in channels if kind == "observation"]
    act_columns = [column(t, f) for kind, _, t, f in channels if kind == "action"]
    reward = [column(t, f) for kind, _, t, f in channels if kind == "reward"]
    episodes, counts = sampling.resample(source, streams, obs_columns, act_columns, reward[0] if reward else None,
                                         np.sort(np.asarray(markers, np.int64)), settings)
    return Imported(source=source, format="ros2", episodes=episodes, counts=counts,
                    locate=lambda ns: f"{source}, bag time {ns / sampling.NS:.3f} s")


def _bag_folder(path: Path) -> Path:
    if path.is_dir() and (path / "metadata.yaml").is_file():
        return path
    if path.is_file() and path.suffix.lower() in BAG_SUFFIXES and (path.parent / "metadata.yaml").is_file():
        return path.parent
    raise DatasetError(f"{path}: not a ROS 2 bag; expected a rosbag2 folder holding metadata.yaml and its .db3 or "
                       f".mcap file")


def _know_type(typestore, conn, source: str) -> None:
    """Register a message type the bag defines but ROS 2 Humble's store lacks (a robot's own messages)."""
    if conn.msgtype in typestore.types:
        return
    msgdef = getattr(conn, "msgdef", None)
    try:
        if msgdef is not None and msgdef.format == MessageDefinitionFormat.MSG and msgdef.data:
            typestore.register(get_types_from_msg(msgdef.data, conn.msgtype))
        elif msgdef is not None and msgdef.format == MessageDefinitionFormat.IDL and msgdef.data:
            typestore.register(get_types_from_idl(msgdef.data))
    except Exception:  # noqa: BLE001 - a definition rosbags cannot parse: reported just below
        pass
    if conn.msgtype not in typestore.types:
        raise DatasetError(f"{source}: topic '{conn.topic}' carries {conn.msgtype}, a message type that neither "
                           f"ROS 2 Humble nor the bag defines; expected a known type or a bag that stores its "
                           f"definition")


def _walk(msg, steps, text: str, conn, stamp: int, source: str) -> float:
    """The number at field path `steps` of `msg`; a DatasetError naming the topic, type and field otherwise."""
    if len(steps) <= 2:  # the usual paths, without the checks' overhead per message
        try:
            value = getattr(msg, steps[0])
            value = value[steps[1]] if len(steps) == 2 and isinstance(steps[1], int) else (
                getattr(value, steps[1]) if len(steps) == 2 else value)
            if isinstance(value, (float, int, np.floating, np.integer)) and not isinstance(value, bool):
                return float(value)
        except (AttributeError, IndexError, TypeError):
            pass  # the careful walk below says what is wrong
    value, done = msg, ""
    where = f"{source}: topic '{conn.topic}' ({conn.msgtype}), field '{text}'"
    for step in steps:
        if isinstance(step, str):
            names = [n for n in getattr(value, "__dataclass_fields__", {}) if n != "__msgtype__"]
            if step not in names:
                have = f"fields {', '.join(names)}" if names else "no fields"
                raise DatasetError(f"{where}: {done or 'the message'} has no field '{step}'; it has {have}")
            value = getattr(value, step)
            done = f"{done}.{step}" if done else step
        else:
            if not isinstance(value, (list, tuple, np.ndarray)):
                raise DatasetError(f"{where}: '{done}' is not an array, so it has no [{step}]")
            if step >= len(value):
                raise DatasetError(f"{where}: '{done}' has {len(value)} values at bag time "
                                   f"{stamp / sampling.NS:.3f} s, so there is no [{step}]")
            value = value[step]
            done = f"{done}[{step}]"
    if isinstance(value, (bool, int, float, np.integer, np.floating, np.bool_)):
        return float(value)
    raise DatasetError(f"{source}: topic '{conn.topic}' ({conn.msgtype}), field '{text}' is "
                       f"{type(value).__name__.split('__')[-1]}, not a number; expected a path to a number such as "
                       f"'position[0]' or 'linear.x'")
