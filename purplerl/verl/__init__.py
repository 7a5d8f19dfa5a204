"""Running purplerl's recipes on veRL (Ray, FSDP, vLLM/SGLang rollouts) at cluster scale.

`purplerl verl export` writes a directory that a veRL 0.9 installation runs as it is: the prompts as
veRL-schema parquet (`export`), purplerl's reward behind veRL's custom-reward hook (`reward`), and the
recipe's settings as Hydra overrides of `verl.trainer.main_ppo` (`mapping`), each purplerl setting
without a veRL equivalent named. `validate` checks overrides against veRL's own default config.
"""
