"""Offline model-based reinforcement learning for robotics, in JAX."""

__version__ = "0.1.0"
