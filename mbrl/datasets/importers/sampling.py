"""Message streams onto the control-rate grid: the sampling rule of `mbrl data import` for timestamped logs.

The rule, in order:

1. Episodes are cut where no observation topic has a message for longer than `episode_gap_s` (a gap), and at each
   message of the episode topic (a marker). A stretch between cuts is a segment; it sees only its own messages.
2. In each segment the ticks are t0 + phase_s + k / control_hz, where t0 is the first moment every observation
   and action channel has a message; they run until `max_age_s` after the segment's last observation message.
3. At each tick every channel holds its latest message at or before the tick. A channel whose latest message is
   older than `max_age_s` is stale at that tick.
4. Tick k gives a transition (observation at k, action at k, observation at k+1; the reward channel at k+1) when
   all of those are fresh. Each run of consecutive transitions is an episode, so a stale tick cuts the episode.
   An episode's last tick needs only its observation: the action there is never used.

A topic clearly slower than the grid that `max_age_s` does not let a tick hold (its median spacing within
segments over 1.5 times the longer of a period and `max_age_s`) supports no grid at that rate: an error, and so is
a log that leaves no transition.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mbrl.core.errors import DatasetError
from mbrl.datasets.importers import COUNTS, Episode
from mbrl.datasets.importers.settings import ImportSettings

NS = 1_000_000_000
SLOWER = 1.5  # a topic this much slower than what a tick may hold is no jitter: the rate is wrong


@dataclasses.dataclass
class Stream:
    """One topic's messages: receive times (ns, sorted) and the values of its used fields, one column each."""

    topic: str
    times: np.ndarray  # int64 (n,)
    values: np.ndarray  # float64 (n, fields)


Column = tuple[str, int]  # (topic, column of that stream's values)


def resample(
    source: str,
    streams: dict[str, Stream],
    obs_columns: list[Column],
    act_columns: list[Column],
    reward_column: Column | None,
    markers: np.ndarray,
    settings: ImportSettings,
) -> tuple[list[Episode], dict[str, int]]:
    """Episodes from the streams by the rule above; `markers` are the episode topic's message times (ns)."""
    period, max_age = settings.period_s * NS, round(settings.max_age_s * NS)
    phase, gap = settings.phase_s * NS, round(settings.episode_gap_s * NS)
    obs_topics = sorted({topic for topic, _ in obs_columns})
    act_topics = sorted({topic for topic, _ in act_columns})
    reward_topics = [] if reward_column is None else [reward_column[0]]
    needed = list(dict.fromkeys(obs_topics + act_topics + reward_topics))

    segments, gaps = _segments(streams, obs_topics, needed, markers, gap)
    _check_rates(source, streams, needed, segments, max_age, settings)

    counts = dict.fromkeys(COUNTS, 0)
    counts.update(gaps=gaps, markers=len(markers))
    stale_by_topic = dict.fromkeys(needed, 0)
    episodes: list[Episode] = []
    for start, end, limit in segments:
        first = {t: int(np.searchsorted(streams[t].times, start, "left")) for t in needed}
        if any(first[t] >= len(streams[t].times) or streams[t].times[first[t]] > end for t in needed):
            continue  # a segment where some channel never speaks: no grid to put there
        last_obs = max(int(streams[t].times[np.searchsorted(streams[t].times, end, "right") - 1]) for t in obs_topics)
        stop = last_obs + max_age if limit is None else min(last_obs + max_age, limit)
        # The reward of transition k comes at tick k+1, so it does not hold back the first tick.
        t0 = max(int(streams[t].times[first[t]]) for t in obs_topics + act_topics) + phase
        if t0 > stop:
            continue
        ticks = np.round(t0 + period * np.arange(int((stop - t0) // period) + 1)).astype(np.int64)
        held, fresh = {}, {}
        for topic in needed:
            index = np.searchsorted(streams[topic].times, ticks, "right") - 1
            before = index < first[topic]  # no message of this segment yet
            index = np.maximum(index, first[topic])
            held[topic] = index
            fresh[topic] = ~before & (ticks - streams[topic].times[index] <= max_age)
        obs_ok = np.logical_and.reduce([fresh[t] for t in obs_topics])
        act_ok = np.logical_and.reduce([fresh[t] for t in act_topics])
        rew_ok = np.logical_and.reduce([fresh[t] for t in reward_topics]) if reward_topics else np.ones_like(obs_ok)
        valid = obs_ok[:-1] & act_ok[:-1] & obs_ok[1:] & rew_ok[1:]
        used = np.zeros(len(ticks), bool)
        runs = _runs(valid)
        for a, b in runs:  # transitions a..b-1, ticks a..b
            used[a:b + 1] = True
            obs = _gather(streams, held, obs_columns, slice(a, b + 1))
            act = _gather(streams, held, act_columns, slice(a, b))
            rewards = (None if reward_column is None
                       else _gather(streams, held, [reward_column], slice(a + 1, b + 1))[:, 0])
            episodes.append(Episode(observations=obs, actions=act, rewards=rewards, origins=ticks[a:b + 1]))
        all_fresh = obs_ok & act_ok & rew_ok
        counts["ticks"] += len(ticks)
        counts["kept_ticks"] += int(used.sum())
        counts["stale_ticks"] += int((~used & ~all_fresh).sum())
        counts["short_dropped"] += int((~used & all_fresh).sum())
        counts["stale_cuts"] += max(0, len(runs) - 1)
        for topic in needed:
            stale_by_topic[topic] += int((~used & ~fresh[topic]).sum())

    if not counts["ticks"]:
        raise DatasetError(f"{source}: no stretch of the log between episode cuts has a message on every topic "
                           f"({', '.join(needed)}); expected each of them in each episode")
    if not episodes:
        worst = max(needed, key=lambda t: stale_by_topic[t])
        raise DatasetError(
            f"{source}: no transitions at control_hz = {1 / settings.period_s:g}: of {counts['ticks']} ticks none "
            f"had every input within max_age_s = {settings.max_age_s:g} s of it (most often stale: topic '{worst}', "
            f"{stale_by_topic[worst]} ticks); check the topics' rates, or raise [import] max_age_s")
    return episodes, counts


def _segments(streams: dict[str, Stream], obs_topics: list[str], needed: list[str], markers: np.ndarray,
              gap: int) -> tuple[list[tuple[int, int, int | None]], int]:
    """The log cut at observation gaps longer than `gap` and at `markers`: (start, end, limit) per segment, where
    `limit` is the last time before the next segment (None for the last), and the number of gaps."""
    obs_times = np.sort(np.concatenate([streams[t].times for t in obs_topics]))
    begin = min(int(streams[t].times[0]) for t in needed)
    gap_at = np.flatnonzero(np.diff(obs_times) > gap)
    # A cut is (last time of the segment before, first time of the segment after).
    cuts = [(int(obs_times[i]), int(obs_times[i + 1])) for i in gap_at]
    cuts += [(int(m) - 1, int(m)) for m in markers]
    cuts.sort(key=lambda cut: cut[1])
    segments, start = [], begin
    for end, next_start in cuts:
        if end >= start:
            segments.append((start, end, next_start - 1))
        start = max(start, next_start)
    segments.append((start, int(obs_times[-1]), None))
    return segments, len(gap_at)


def _check_rates(source: str, streams: dict[str, Stream], needed: list[str], segments, max_age: int,
                 settings: ImportSettings) -> None:
    for topic in needed:
        times = streams[topic].times
        spacings = [np.diff(times[(times >= start) & (times <= end)]) for start, end, _ in segments]
        spacings = np.concatenate(spacings) if spacings else np.zeros(0)
        if spacings.size == 0:
            continue
        typical = float(np.median(spacings))
        if typical > SLOWER * max(max_age, settings.period_s * NS):
            raise DatasetError(
                f"{source}: topic '{topic}' has a message about every {typical / NS:.3g} s "
                f"({NS / typical:.3g} Hz): most ticks at control_hz = {1 / settings.period_s:g} would find it older "
                f"than max_age_s = {settings.max_age_s:g} s; expected a topic at least as fast as the control rate "
                f"(lower control_hz, or raise [import] max_age_s)")


def _runs(valid: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of True, end exclusive."""
    padded = np.concatenate([[False], valid, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def _gather(streams: dict[str, Stream], held: dict[str, np.ndarray], columns: list[Column], rows: slice) -> np.ndarray:
    return np.stack([streams[topic].values[held[topic][rows], col] for topic, col in columns], axis=1)
