"""CSV and Parquet tables: one row per control tick, in order, read with pyarrow.

Each channel is the column its declaration names (`column`, default the channel's name). Rows are episodes by the
`[import] episode_column` (default "episode"): each run of equal values is one episode; without that column the
whole table is one. Row k's action and `[import] reward_column` belong to the transition from row k to row k+1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from mbrl.core.declaration import Declaration
from mbrl.core.errors import DatasetError
from mbrl.datasets.importers import Imported, episodes_from_rows
from mbrl.datasets.importers.settings import ImportSettings


def read_table(path: Path, decl: Declaration, settings: ImportSettings) -> Imported:
    is_csv = path.suffix.lower() == ".csv"
    if path.suffix.lower() not in (".csv", ".parquet"):
        raise DatasetError(f"{path}: a table must be a .csv or .parquet file")
    try:
        if is_csv:
            table = pcsv.read_csv(path)
        else:
            table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - a malformed or damaged file
        raise DatasetError(f"{path}: cannot read the table ({' '.join(str(exc).split()) or type(exc).__name__}); "
                           f"it may be truncated or corrupt") from None
    names = table.column_names

    def row_text(row: int) -> str:  # a CSV's line numbers count the header
        return f"{path}, line {row + 2}" if is_csv else f"{path}, row {row}"

    def numbers(column: str, what: str) -> np.ndarray:
        if column not in names:
            raise DatasetError(f"{path}: no column '{column}' (for {what}); the table has {', '.join(names)}")
        values = table.column(column).combine_chunks()
        if values.null_count:
            row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            raise DatasetError(f"{row_text(row)}: column '{column}' is empty; expected a number")
        if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)
                or pa.types.is_boolean(values.type)):
            raise DatasetError(f"{path}: column '{column}' holds {values.type}; expected numbers (for {what})")
        return values.to_numpy(zero_copy_only=False).astype(np.float64)

    obs = np.stack([numbers(c.column_name, f"observation {c.name!r}") for c in decl.observations], axis=1)
    act = np.stack([numbers(c.column_name, f"action {c.name!r}") for c in decl.actions], axis=1)
    rewards = None if settings.reward_column is None else numbers(settings.reward_column, "[import] reward_column")
    starts = np.zeros(len(obs), bool)
    if len(obs):
        starts[0] = True
    if settings.episode_column in names:
        ids = np.asarray(table.column(settings.episode_column).to_pylist(), dtype=object)
        starts[1:] |= ids[1:] != ids[:-1]
    elif settings.episode_column_given:
        raise DatasetError(f"{path}: no column '{settings.episode_column}' ([import] episode_column); the table has "
                           f"{', '.join(names)}")
    episodes, counts = episodes_from_rows(obs, act, starts, rewards, np.arange(len(obs), dtype=np.int64))
    if not episodes:
        raise DatasetError(f"{path}: no transitions in {len(obs)} rows; expected episodes of at least 2 rows")
    notes = [] if settings.episode_column in names else [f"no column '{settings.episode_column}': one episode"]
    return Imported(source=str(path), format="table", episodes=episodes, counts=counts, locate=row_text, notes=notes)
