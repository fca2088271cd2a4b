"""Engine step-time models (``--timing``): the roofline, AIConfigurator-measured tables, fitted coefficients."""
