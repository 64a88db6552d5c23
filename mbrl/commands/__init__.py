"""Implementations of the `mbrl` subcommands, one module per command group."""
