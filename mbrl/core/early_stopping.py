"""The one early-stopping rule of every fit (the MLP ensemble, RWM-U, FQE): stop after `patience` checks in a row in
which no tracked value fell by more than `min_improvement` (relative) below its last significant improvement, or
at a budget of checks or seconds."""

from __future__ import annotations

import time

import numpy as np


class EarlyStopping:
    """`update(values)` after each check (one value, or one per member: any member's gain counts) returns the
    reason to stop ("early_stopping", "max_epochs", "time_budget") or None."""

    def __init__(self, patience: int, min_improvement: float, max_checks: int | None = None,
                 max_seconds: float | None = None):
        self.patience, self.min_improvement = patience, min_improvement
        self.max_checks, self.max_seconds = max_checks, max_seconds
        self.reference: np.ndarray | None = None  # each value at its last significant improvement
        self.since_improved = 0
        self.checks = 0
        self.start = time.perf_counter()

    def update(self, values) -> str | None:
        values = np.atleast_1d(np.asarray(values, np.float64))
        if self.reference is None:
            self.reference = np.full(values.shape, np.inf)
        significant = values < self.reference * (1.0 - self.min_improvement)
        self.reference = np.where(significant, values, self.reference)
        self.since_improved = 0 if significant.any() else self.since_improved + 1
        self.checks += 1
        if self.since_improved >= self.patience:
            return "early_stopping"
        if self.max_checks is not None and self.checks >= self.max_checks:
            return "max_epochs"
        if self.max_seconds is not None and time.perf_counter() - self.start >= self.max_seconds:
            return "time_budget"
        return None

    def to_record(self) -> dict:
        """What a checkpoint keeps of the rule (JSON), for `restore`."""
        reference = None if self.reference is None else self.reference.tolist()
        return {"reference": reference, "since_improved": self.since_improved, "checks": self.checks}

    def restore(self, record: dict, seconds_spent: float) -> None:
        """Continue a rule saved by `to_record` after `seconds_spent` seconds, which count toward `max_seconds`."""
        reference = record["reference"]
        self.reference = None if reference is None else np.asarray(reference, np.float64)
        self.since_improved, self.checks = int(record["since_improved"]), int(record["checks"])
        self.start = time.perf_counter() - seconds_spent
