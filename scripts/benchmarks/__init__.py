"""Benchmark figures, one module per topic. See scripts/bench.py."""
