"""Tasks (MuJoCo ids, termination functions, reference scores), data collection and robot adapters."""
