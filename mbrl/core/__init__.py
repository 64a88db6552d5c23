"""The ground every other part stands on: errors, types, network layers, the device ring buffer (and the
sequence tape on it), and the one normalized score. It imports nothing else of the project."""
