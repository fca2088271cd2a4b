"""The closed loop: the engine's scheduler inside the replay, one engine or a routed cluster."""
