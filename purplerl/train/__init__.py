"""The RL loop, checkpoints and metric sinks."""
