"""Robot adapters, the policy runner, the safety layer and the deploy loop."""
