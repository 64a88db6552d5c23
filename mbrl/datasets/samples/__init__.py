"""A tiny real dataset shipped with the package (written by scripts/make_sample.py)."""
