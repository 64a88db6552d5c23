"""Hyperparameter sweeps by Bayesian optimisation (Optuna) over populations of the one training program:
`space` (TOML search spaces), `objective` (sim and offline scores), `engine` (the ask/train/tell loop)."""
