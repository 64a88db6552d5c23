"""Dynamics models: probabilistic ensembles, fitting, uncertainty measures and compiled rollouts."""
