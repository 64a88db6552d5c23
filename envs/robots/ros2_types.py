"""ROS 2 message types as Cyclone DDS IDL structs, and ROS 2's naming and default QoS on DDS.

ROS 2 (rmw_cyclonedds) maps a message type `pkg/msg/Name` to the DDS type `pkg::msg::dds_::Name_`,
with the fields of the .msg file in order, and a topic `/a/b` to the DDS topic `rt/a/b`. The structs
here carry exactly those names and fields, so a ROS 2 node on Cyclone DDS and this package exchange
messages without a ROS installation on this side:

    builtin_interfaces/msg/Time          int32 sec, uint32 nanosec
    std_msgs/msg/Header                  builtin_interfaces/Time stamp, string frame_id
    std_msgs/msg/MultiArrayDimension     string label, uint32 size, uint32 stride
    std_msgs/msg/MultiArrayLayout        MultiArrayDimension[] dim, uint32 data_offset
    std_msgs/msg/Float64MultiArray       MultiArrayLayout layout, float64[] data

The ROS 2 default QoS profile: reliable, volatile, keep last 10; data in XCDR1 (plain CDR), as ROS 2 writes it.
cyclonedds is imported here at module level: import this module only where cyclonedds is known to be installed.
(No `from __future__ import annotations` here: cyclonedds resolves the field annotations as types.)
"""

import os
from dataclasses import dataclass, field

from cyclonedds.core import Policy, Qos
from cyclonedds.idl import IdlStruct
from cyclonedds.idl.types import float64, int32, sequence, uint32
from cyclonedds.util import duration


@dataclass
class Time(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    sec: int32 = 0
    nanosec: uint32 = 0


@dataclass
class Header(IdlStruct, typename="std_msgs::msg::dds_::Header_"):
    stamp: Time = field(default_factory=Time)
    frame_id: str = ""


@dataclass
class MultiArrayDimension(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayDimension_"):
    label: str = ""
    size: uint32 = 0
    stride: uint32 = 0


@dataclass
class MultiArrayLayout(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayLayout_"):
    dim: sequence[MultiArrayDimension] = field(default_factory=list)
    data_offset: uint32 = 0


@dataclass
class Float64MultiArray(IdlStruct, typename="std_msgs::msg::dds_::Float64MultiArray_"):
    layout: MultiArrayLayout = field(default_factory=MultiArrayLayout)
    data: sequence[float64] = field(default_factory=list)


def default_qos() -> Qos:
    """ROS 2's default profile (rmw_qos_profile_default): reliable, volatile, keep last 10."""
    return Qos(Policy.Reliability.Reliable(max_blocking_time=duration(milliseconds=100)), Policy.Durability.Volatile,
               Policy.History.KeepLast(10), Policy.DataRepresentation(use_cdrv0_representation=True))


def dds_topic(ros_topic: str) -> str:
    """The DDS topic name of a ROS 2 topic: `/P/name` -> `rt/P/name`."""
    return "rt/" + ros_topic.lstrip("/")


def domain_id() -> int:
    """The DDS domain of ROS 2: $ROS_DOMAIN_ID (0 when unset); ValueError for anything but an int in 0..232."""
    text = os.environ.get("ROS_DOMAIN_ID", "").strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) > 232:
        raise ValueError(f"ROS_DOMAIN_ID={text!r}: expected an int in 0..232")
    return int(text)


def segments(message: Float64MultiArray) -> list[tuple[str, int]]:
    """The (label, size) of each dimension of a message's layout, in order."""
    return [(d.label, int(d.size)) for d in message.layout.dim]


def segmented(parts: list[tuple[str, list[float]]]) -> Float64MultiArray:
    """A Float64MultiArray whose layout names the parts in order (size = stride = the part's length)."""
    dims = [MultiArrayDimension(label, len(values), len(values)) for label, values in parts]
    data = [float(x) for _, values in parts for x in values]
    return Float64MultiArray(MultiArrayLayout(dims, 0), data)


def stamp_of(ns: int) -> Time:
    return Time(int(ns // 1_000_000_000), int(ns % 1_000_000_000))
