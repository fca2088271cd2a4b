"""What a run is about: hardware profiles, KV footprint, the model catalog, the replay config, workload profiles."""
