"""Learning algorithms as pure functions: SAC-N/EDAC core, MOPO, RAVL, NEUBAY, BC."""
