"""Studies built on the replay: sweeps, reports, trace summaries, calibration, validation, placement replay."""
