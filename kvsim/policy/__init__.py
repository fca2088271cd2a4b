"""The placement-policy interface: the API a policy imports, its state, hooks, registry and guard."""
