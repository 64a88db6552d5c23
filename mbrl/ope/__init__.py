"""Judging a policy from the data alone (off-policy evaluation): Fitted Q Evaluation (`fqe`), the policies it
reads (`policy`), the greedy return in a world model (`model_return`), held-out episodes and FQE's values of a
population (`holdout`), and the estimators of `mbrl ope` (`estimates`). Training (checkpoint selection) and sweeps
(their offline objectives) judge through here."""
