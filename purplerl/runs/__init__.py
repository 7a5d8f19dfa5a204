"""Run directories: their layout, reading their checkpoints and logs, resuming them, and loading a policy from a
run or a checkpoint, and generating from it (`purplerl sample`). Below `train/` (which writes runs) and above
`engines/`."""
