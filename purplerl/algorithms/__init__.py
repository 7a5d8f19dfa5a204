"""Pure tensor math: advantages, KL estimators, log-prob helpers, policy-gradient losses, Token Noiser, direct
preference losses (DPO, IPO, SimPO, KTO, ORPO).

Every function takes its knobs as arguments; nothing here imports config, engines or the trainer. The package
imports none of its modules itself: the settings read the registries' names (algorithms.names) without loading
torch. Importing algorithms.registry registers every loss.
"""
