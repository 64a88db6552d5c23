"""Judging a policy from the data alone (off-policy evaluation): Fitted Q Evaluation (`fqe`), and the policies it
reads (`policy`). `mbrl ope` is the command."""
