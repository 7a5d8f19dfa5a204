"""The mutations `make mutation` runs (scripts/mutation_check.py): each one exact edit of a file (the original snippet,
the mutated one) and the tests that should notice it. tests/test_mutation_list.py checks in `make test` that every
snippet still occurs exactly once in its file, so a refactor that moves one fails there, not at the next mutation run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repo root
    original: str  # must occur exactly once in the file
    mutated: str
    tests: tuple[str, ...]  # pytest paths, cheapest likely killer first (-x stops at the first failure)
    equivalent: str | None = None  # why no test can kill it, when that is so


# Test sets, cheapest first.
ADV = ("tests/algorithms/test_advantages.py", "tests/algorithms/test_advantage_estimators.py")
KL = ("tests/algorithms/test_kl.py",)
LOGP = ("tests/algorithms/test_logprobs.py",)
LOSS = ("tests/algorithms/test_losses.py", "tests/algorithms/test_loss_aggregation.py",
        "tests/algorithms/test_loss_edges.py")
NOISER = ("tests/algorithms/test_noiser.py",)
PREF = ("tests/algorithms/test_preference_losses.py", "tests/engines/test_preference_engine.py")
LOOP = ("tests/train/test_estimator_in_use.py", "tests/train/test_kl_direction.py", "tests/train/test_loop_variants.py",
        "tests/train/test_loop.py")
ENGINE = ("tests/train/test_kl_direction.py", "tests/engines/test_local_engine.py",
          "tests/engines/test_engine_fast_paths.py", "tests/train/test_estimator_in_use.py",
          "tests/eval/test_adapter_loaded.py", "tests/train/test_loop.py", "tests/engines/test_engine_contract.py")
ATTACK = ("tests/recipes/test_attack_reward.py", "tests/recipes/test_defend_tamper.py",
          "tests/train/test_kl_direction.py")
TAMPER = ("tests/recipes/test_tamper_verdict.py", "tests/recipes/test_defend_tamper.py",
          "tests/experiments/test_tamper_threats.py")
DEFEND = ("tests/recipes/test_defend_tamper.py",)
REGISTERED = ("tests/engines/test_registered_losses.py", "tests/engines/test_engine_contract.py")
ADAPTER = ("tests/eval/test_adapter_loaded.py",)
PROMPTING = ("tests/eval/test_checkpoint_prompting.py",)
CRITIC = ("tests/algorithms/test_critic.py", "tests/engines/test_critic_engine.py")
PIPELINE_GATES = ("tests/experiments/test_pipeline_gates.py", "tests/experiments/test_pipeline_measure.py")
PIPELINE_RUN = ("tests/experiments/test_pipeline_run.py",)
PIPELINE_MEASURE = ("tests/experiments/test_pipeline_measure.py",)
ROUTE = ("tests/engines/test_adapter_mix.py",)
ADVERSARIAL = ("tests/recipes/test_adversarial_sides.py",)

A, K, G, L = ("purplerl/algorithms/advantages.py", "purplerl/algorithms/kl.py", "purplerl/algorithms/logprobs.py",
              "purplerl/algorithms/losses.py")
NZ, LP, RG = "purplerl/algorithms/noiser.py", "purplerl/train/loop.py", "purplerl/algorithms/registry.py"
PW = "purplerl/algorithms/pairwise.py"
PF = "purplerl/algorithms/preference.py"
DF, RL = "purplerl/recipes/defend/step.py", "purplerl/train/rl.py"
ET, ES, EM = ("purplerl/engines/local_training.py", "purplerl/engines/local_scoring.py",
              "purplerl/engines/local_sampling.py")
TI, TR, TS = ("purplerl/experiments/tamper/__init__.py", "purplerl/experiments/tamper/runs.py",
              "purplerl/experiments/tamper/stats.py")
PO = "purplerl/runs/policy.py"
CR, TC = "purplerl/algorithms/critic.py", "purplerl/recipes/ppo/step.py"
PG, PR, PM = ("purplerl/experiments/pipeline/gates.py", "purplerl/experiments/pipeline/run.py",
              "purplerl/experiments/pipeline/measure.py")
RT, AV = "purplerl/recipes/route/step.py", "purplerl/recipes/adversarial/step.py"

MUTATIONS = [
    # ---- advantages
    Mutation("grpo-mean-over-batch", A, "    advantages_BG = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)",
             "    advantages_BG = rewards_BG - rewards_BG.mean(dim=0, keepdim=True)", ADV),
    Mutation("grpo-std-unbiased", A, "std_B1 = rewards_BG.std(dim=1, unbiased=False, keepdim=True)",
             "std_B1 = rewards_BG.std(dim=1, unbiased=True, keepdim=True)", ADV),
    Mutation("grpo-std-ignored", A, "advantages_BG = advantages_BG / (std_B1 + eps)",
             "advantages_BG = advantages_BG", ADV),
    Mutation("dr-grpo-mean-over-batch", A,
             "return _finish_group(rewards_BG, rewards_BG - rewards_BG.mean(dim=1, keepdim=True))",
             "return _finish_group(rewards_BG, rewards_BG - rewards_BG.mean(dim=0, keepdim=True))", ADV),
    Mutation("rloo-off-by-one", A, "(group_size / (group_size - 1))", "(group_size / group_size)", ADV),
    Mutation("flat-groups-keep-noise", A, "torch.where(flat_B[:, None], 0.0, advantages_BG)",
             "torch.where(flat_B[:, None], advantages_BG, 0.0)", ADV),
    Mutation("seq-advantage-off-mask", A, "return torch.where(on_NT, advantages_N1, 0.0), metrics",
             "return advantages_N1.expand(mask_NT.shape).clone(), metrics", ADV + LOOP),
    Mutation("reinforce-pp-kl-sign", A, "-kl_beta * kl_NT.detach().float()", "kl_beta * kl_NT.detach().float()", ADV),
    Mutation("reinforce-pp-forward-cumsum", A, "token_rewards_NT.flip(dims=[1]).cumsum(dim=1).flip(dims=[1])",
             "token_rewards_NT.cumsum(dim=1)", ADV),
    Mutation("reinforce-pp-reward-at-first-token", A,
             "return (num_tok - 1) - on_NT.flip(dims=[1]).int().argmax(dim=1)", "return on_NT.int().argmax(dim=1)",
             ADV),
    Mutation("reinforce-pp-reward-overwrites-kl", A, "token_rewards_NT[rows_N, _last_masked_index(on_NT)] += rewards_N",
             "token_rewards_NT[rows_N, _last_masked_index(on_NT)] = rewards_N", ADV),
    Mutation("whiten-mean-over-padding", CR, "    mean = values.mean()\n", "    mean = x_NT.float().mean()\n",
             ADV + CRITIC),
    Mutation("zscore-std-unbiased", A, "(x_N - x_N.mean()) / (x_N.std(unbiased=False) + eps)",
             "(x_N - x_N.mean()) / (x_N.std(unbiased=True) + eps)",
             ADV + ("tests/rewards/test_composite.py", "tests/rewards/test_reward.py")),
    # ---- KL estimators
    Mutation("k1-direction", K, "    return logp - logp_ref\n", "    return logp_ref - logp\n", KL),
    Mutation("k2-no-half", K, "return 0.5 * (logp - logp_ref) ** 2", "return (logp - logp_ref) ** 2", KL),
    Mutation("k3-sign", K, "return torch.exp(log_ratio) - log_ratio - 1.0",
             "return torch.exp(log_ratio) + log_ratio - 1.0", KL),
    Mutation("sequence-kl-sum-not-mean", K, "        kl_N = kl_N / mask_NT.sum(dim=1)", "        kl_N = kl_N", KL),
    Mutation("sequence-kl-mean-over-padding", K, "        kl_N = kl_N / mask_NT.sum(dim=1)",
             "        kl_N = kl_N / mask_NT.shape[1]", KL),
    # ---- log-probs and entropy
    Mutation("logprob-temperature-ignored", G, "            work_CV.div_(temperature)", "            pass", LOGP),
    Mutation("logprob-grad-softmax-sign", G, ".exp_().mul_(-grad_C[:, None])", ".exp_().mul_(grad_C[:, None])", LOGP),
    Mutation("logprob-grad-temperature-chain", G,
             "grad_C[:, None].to(grad_CV.dtype))\n        if t != 1.0:\n            grad_CV.div_(t)",
             "grad_C[:, None].to(grad_CV.dtype))", LOGP),
    Mutation("entropy-temperature-ignored", G, "chunk_CV = logits_RV[start:start + chunk_rows].float() / temperature",
             "chunk_CV = logits_RV[start:start + chunk_rows].float()", LOGP),
    Mutation("entropy-sign", G, "out_R.append(-(logp_CV.exp() * finite_logp_CV).sum(dim=-1))",
             "out_R.append((logp_CV.exp() * finite_logp_CV).sum(dim=-1))", LOGP),
    Mutation("masked-mean-counts-padding", G, "count = mask.sum() if dim is None else mask.sum(dim=dim)",
             "count = torch.ones_like(mask).sum() if dim is None else torch.ones_like(mask).sum(dim=dim)", LOGP + LOSS),
    # ---- policy-gradient losses and aggregation
    Mutation("ratio-detach-removed", L, "logprobs_NT - sampling_logprobs_NT.detach()",
             "logprobs_NT - sampling_logprobs_NT", LOSS),
    Mutation("is-loss-sign", L, "loss_NT = torch.where(on_NT, -ratio_NT * advantages_NT, 0.0)",
             "loss_NT = torch.where(on_NT, ratio_NT * advantages_NT, 0.0)", LOSS),
    Mutation("ppo-clip-bounds-swapped", L, "torch.clamp(ratio_NT, 1.0 - clip_low, 1.0 + clip_high)",
             "torch.clamp(ratio_NT, 1.0 - clip_high, 1.0 + clip_low)", LOSS),
    Mutation("ppo-min-to-max", L, "-torch.minimum(unclipped_NT, clipped_NT)",
             "-torch.maximum(unclipped_NT, clipped_NT)", LOSS),
    Mutation("ppo-clip-frac-high-wrong-side", L, "high_NT = ((ratio_NT > 1.0 + clip_high) & (advantages_NT > 0))",
             "high_NT = ((ratio_NT > 1.0 + clip_high) & (advantages_NT < 0))", LOSS),
    Mutation("token-mean-per-micro-batch", L, "loss_NT * mask_NT, 0.0).sum() / normalizer",
             "loss_NT * mask_NT, 0.0).sum() / mask_NT.sum()", LOSS),
    Mutation("seq-mean-per-micro-batch", L, "return row_mean_N.sum() / total_sequences", "return row_mean_N.mean()",
             LOSS),
    Mutation("sum-norm-no-length-norm", L, "_masked_row_sums(loss_NT, mask_NT).sum() / length_norm / total_sequences",
             "_masked_row_sums(loss_NT, mask_NT).sum() / total_sequences", LOSS),
    Mutation("kl-penalty-negated", L, "return get_kl_estimator(estimator)(logp_NT, ref_NT.detach())",
             "return -get_kl_estimator(estimator)(logp_NT, ref_NT.detach())", LOSS + ENGINE),
    Mutation("kl-penalty-direction", L, "return get_kl_estimator(estimator)(logp_NT, ref_NT.detach())",
             "return get_kl_estimator(estimator)(ref_NT.detach(), logp_NT)", LOSS + ENGINE),
    # ---- Token Noiser
    Mutation("noiser-epsilon-swapped", NZ, "return (1.0 - epsilon) * nll_C + weight * noise_ce_C, nll_C, noise_ce_C",
             "return weight * nll_C + (1.0 - epsilon) * noise_ce_C, nll_C, noise_ce_C", NOISER),
    Mutation("noiser-noise-on-target", NZ, "noise_RV = raw_RV.float().scatter(1, targets_R.long()[:, None], 0.0)",
             "noise_RV = raw_RV.float()", NOISER),
    # ---- the loop
    Mutation("loop-kl-direction", LP, "kl_N = sequence_kl(sampled_NT, ref_NT, mask_NT, estimator)",
             "kl_N = sequence_kl(ref_NT, sampled_NT, mask_NT, estimator)", LOOP),
    Mutation("loop-estimator-swapped", LP, "estimate_advantages(\n        config.training.advantage,",
             'estimate_advantages(\n        "grpo",', LOOP),
    Mutation("grpo-std-not-divided", A, "return grpo_advantages(rewards_BG, scale_by_std=True, eps=eps)",
             "return grpo_advantages(rewards_BG, scale_by_std=False, eps=eps)", (*ADV, *LOOP)),
    Mutation("loop-kl-always-in-loss", LP, "kl_beta=kl_placement(config).loss_beta,", "kl_beta=config.reward.kl_beta,",
             LOOP),
    Mutation("loop-kl-never-in-loss", LP, "kl_beta=kl_placement(config).loss_beta,", "kl_beta=0.0,", LOOP),
    Mutation("loop-token-kl-also-with-kl-in-loss", LP, '    if r.kl_in == "loss":\n',
             '    if r.kl_in == "loss" and not takes_token_kl(config.training.advantage):\n', LOOP),
    Mutation("loop-reward-kl-twice-for-reinforce-pp", LP, "return KLPlacement(token_beta=r.kl_beta)",
             "return KLPlacement(token_beta=r.kl_beta, reward_beta=r.kl_beta)", LOOP),
    Mutation("loop-reference-temperature-ignored", LP, "reference=True,\n                                   "
             "temperature=s.temperature,", "reference=True,\n                                   temperature=1.0,",
             LOOP),
    Mutation("loop-loss-temperature-ignored", LP, "return Loss(t.loss, params, temperature=s.temperature,",
             "return Loss(t.loss, params, temperature=1.0,", LOOP),
    Mutation("loop-logged-advantage-summed", LP, "advantages_N = (advantages_NT * mask_NT).sum(-1) / mask_NT.sum(-1)",
             "advantages_N = (advantages_NT * mask_NT).sum(-1)", LOOP),
    Mutation("noiser-step-drops-zero-advantage", DF, "mask_NT = batch.loss_mask_NT * (batch.advantages_NT >= 0)",
             "mask_NT = batch.loss_mask_NT * (batch.advantages_NT > 0)", DEFEND + LOOP),
    Mutation("noiser-step-schedule-off-by-one", DF, "(step - d.noiser_warmup) % d.noiser_every == 0",
             "(step - d.noiser_warmup - 1) % d.noiser_every == 0", LOOP),
    Mutation("loop-old-logprobs-auto-or", LP, '"current" if t.ppo_epochs == 1 and t.mini_batches == 1 else "sampler"',
             '"current" if t.ppo_epochs == 1 or t.mini_batches == 1 else "sampler"', LOOP),
    Mutation("loop-minibatches-ignored", LP, "torch.tensor_split(order, t.mini_batches)",
             "torch.tensor_split(order, 1)", LOOP),
    # ---- the critic: GAE, whitening, the value loss, its values
    Mutation("gae-next-value-undiscounted", CR, "delta_N = rewards_NT[:, t] + gamma * next_value_N - values_NT[:, t]",
             "delta_N = rewards_NT[:, t] + next_value_N - values_NT[:, t]", CRITIC),
    Mutation("gae-lambda-dropped", CR, "advantage_N = delta_N + gamma * lam * next_advantage_N",
             "advantage_N = delta_N + gamma * next_advantage_N", CRITIC),
    Mutation("gae-pad-value-bootstrapped", CR, "next_value_N = torch.where(on_N, values_NT[:, t], next_value_N)",
             "next_value_N = values_NT[:, t]", CRITIC),
    Mutation("gae-returns-without-values", CR, "returns_NT = torch.where(on_NT, advantages_NT + values_NT, 0.0)",
             "returns_NT = torch.where(on_NT, advantages_NT, 0.0)", CRITIC),
    Mutation("gae-reward-at-first-token", CR, "last_N = (on_NT * positions_T).argmax(-1)",
             "last_N = on_NT.int().argmax(-1)", CRITIC),
    Mutation("whiten-population-variance", CR, "var = ((values - mean) ** 2).sum() / (count - 1)",
             "var = ((values - mean) ** 2).sum() / count", CRITIC),
    Mutation("value-loss-min-of-clipped", CR, "torch.maximum(unclipped_loss_NT, clipped_loss_NT)",
             "torch.minimum(unclipped_loss_NT, clipped_loss_NT)", CRITIC),
    Mutation("critic-values-not-shifted", CR, "shifted_NT = F.pad(values_NT[:, :-1], (1, 0))",
             "shifted_NT = values_NT", CRITIC),
    Mutation("critic-lr-ignored", TC, "lr=c.lr if c.lr is not None else t.lr", "lr=t.lr",
             ("tests/recipes/test_ppo_critic_update.py",)),
    # ---- the registered losses (what the engine computes for each name)
    Mutation("registry-kl-subtracted", RG, "loss_NT = loss_NT + params.kl_beta * kl_NT",
             "loss_NT = loss_NT - params.kl_beta * kl_NT", LOSS + ENGINE),
    Mutation("registry-kl-arguments-swapped", RG,
             'kl_penalty_loss(logprobs_NT, inputs["ref_logprobs_NT"], params.kl_estimator)',
             'kl_penalty_loss(inputs["ref_logprobs_NT"], logprobs_NT, params.kl_estimator)', LOSS + ENGINE),
    Mutation("registry-old-logprobs-always-current", RG,
             'old_NT = logprobs_NT.detach() if params.old_logprobs == "current" else inputs["sampling_logprobs_NT"]',
             "old_NT = logprobs_NT.detach()", LOSS + ENGINE),
    Mutation("registry-old-logprobs-detach-removed", RG,
             'old_NT = logprobs_NT.detach() if params.old_logprobs == "current" else inputs["sampling_logprobs_NT"]',
             'old_NT = logprobs_NT if params.old_logprobs == "current" else inputs["sampling_logprobs_NT"]',
             LOSS + ENGINE,
             equivalent="every loss detaches its sampling logprobs itself (_ratio), so a second detach changes "
                        "no value and no gradient"),
    Mutation("registry-ppo-clip-high-dropped", RG, "clip_low=params.clip_low, clip_high=params.clip_high)",
             "clip_low=params.clip_low, clip_high=params.clip_low)", LOSS + ENGINE),
    Mutation("registry-cross-entropy-sign", RG, "torch.where(mask_NT != 0, -logprobs_NT * mask_NT, 0.0)",
             "torch.where(mask_NT != 0, logprobs_NT * mask_NT, 0.0)", LOSS + REGISTERED),
    Mutation("registry-cross-entropy-unweighted", RG, "torch.where(mask_NT != 0, -logprobs_NT * mask_NT, 0.0)",
             "torch.where(mask_NT != 0, -logprobs_NT, 0.0)", LOSS + REGISTERED),
    Mutation("registry-dpo-pair-sign", PW, "return pairs_P2[:, 0], pairs_P2[:, 1]",
             "return pairs_P2[:, 1], pairs_P2[:, 0]", LOSS + PREF + REGISTERED),
    Mutation("registry-dpo-beta-dropped", PF, "logits_P = beta * (chosen_logratios_P - rejected_logratios_P)",
             "logits_P = (chosen_logratios_P - rejected_logratios_P)", LOSS + PREF + REGISTERED),
    Mutation("registry-dpo-no-reference", PW,
             'ref_N = (inputs["ref_logprobs_NT"].detach() * mask_NT).sum(-1) if reference else None',
             'ref_N = torch.zeros_like(logps_N) if reference else None', LOSS + PREF + REGISTERED),
    Mutation("registry-dpo-margin-over-padding", PW, "logps_N = (logprobs_NT * mask_NT).sum(-1)",
             "logps_N = logprobs_NT.sum(-1)", LOSS + PREF + REGISTERED),
    Mutation("preference-cdpo-smoothing-sign", PF, "- label_smoothing * F.logsigmoid(-logits_P)",
             "+ label_smoothing * F.logsigmoid(-logits_P)", PREF),
    Mutation("preference-ipo-summed-log-ratios", PF,
             "delta_P = chosen_logratios_P / chosen_lengths_P - rejected_logratios_P / rejected_lengths_P",
             "delta_P = chosen_logratios_P - rejected_logratios_P", PREF),
    Mutation("preference-kto-reference-point-unclamped", PF,
             "z0 = (kl_logps_K.detach() - ref_kl_logps_K.detach()).mean().clamp(min=0.0)",
             "z0 = (kl_logps_K.detach() - ref_kl_logps_K.detach()).mean()", PREF),
    Mutation("preference-orpo-log-probability-not-odds", PF,
             "log_odds_P = (chosen_avg_P - rejected_avg_P) - (log1mexp(chosen_avg_P) - log1mexp(rejected_avg_P))",
             "log_odds_P = (chosen_avg_P - rejected_avg_P)", PREF),
    # ---- the engine's loss path (and where it loads and samples the adapter)
    Mutation("engine-loss-temperature-ignored", ET,
             "logp_NT = self._target_logprobs(ids, attn, mask, loss.temperature, layout=layout)",
             "logp_NT = self._target_logprobs(ids, attn, mask, 1.0, layout=layout)", ENGINE),
    Mutation("engine-normalizer-per-micro-batch", ET, "loss.aggregation, total_tokens=normalizer,",
             "loss.aggregation, total_tokens=float(mask.sum()),", ENGINE),
    Mutation("engine-targets-off-by-one", ES, "picked_NT = targets_NT[:, 1:].bool()",
             "picked_NT = targets_NT[:, :-1].bool()", ENGINE),
    Mutation("engine-logprobs-shifted", ES, "return F.pad(logp_NT, (1, 0))", "return F.pad(logp_NT, (0, 1))", ENGINE),
    Mutation("engine-reference-keeps-adapter", ET, "with self.model.disable_adapter():",
             "with contextlib.nullcontext():", ENGINE),
    Mutation("engine-metric-weights-dropped", ET, "weight = float(mask.sum()) / normalizer", "weight = 1.0", ENGINE),
    Mutation("engine-linearized-gradient-negated", ET, "(lp * grad_NT[rows, :width].to(self.device)).sum().backward()",
             "(-lp * grad_NT[rows, :width].to(self.device)).sum().backward()", REGISTERED),
    Mutation("engine-linearized-rows-misaligned", ET,
             "(lp * grad_NT[rows, :width].to(self.device)).sum().backward()",
             "(lp * grad_NT[:len(rows), :width].to(self.device)).sum().backward()", REGISTERED),
    Mutation("engine-linearized-temperature-ignored", ET,
             "targets_NT[rows, :width].to(self.device), temperature, layout=layout)",
             "targets_NT[rows, :width].to(self.device), 1.0, layout=layout)", REGISTERED),
    Mutation("engine-linearized-first-pass-temperature-ignored", ET,
             "logp_NT = self.logprobs(ids_NT, attn_NT, temperature=temperature, targets_NT=targets_NT,",
             "logp_NT = self.logprobs(ids_NT, attn_NT, temperature=1.0, targets_NT=targets_NT,", REGISTERED),
    Mutation("engine-init-adapter-ignored", ET, "self.model = load_peft_adapter(base, cfg.init_adapter)",
             "self.model = get_peft_model(base, lora_config(cfg))", ENGINE + TAMPER),
    Mutation("engine-sampler-without-lora", EM,
             "merged = merged + module.get_delta_weight(adapter).float()", "merged = merged", ENGINE),
    Mutation("engine-sampling-temperature-ignored", EM, "scaled_NV = scaled_NV / sampling.temperature",
             "scaled_NV = scaled_NV", ENGINE),
    # ---- recipes built on the loop
    Mutation("attack-kl-added", RL, 'reward = Reward({**r.terms, "kl": -reward_kl_beta(config)}, zscore=r.zscore)',
             'reward = Reward({**r.terms, "kl": reward_kl_beta(config)}, zscore=r.zscore)', ATTACK),
    Mutation("tamper-verdict-or", TS, 'if all(rel == "below" for rel in relations.values()):',
             'if any(rel == "below" for rel in relations.values()):', TAMPER),
    Mutation("tamper-verdict-ties-hold", TS, 'if defended["high"] < base["low"]:',
             'if defended["high"] <= base["low"]:', TAMPER),
    Mutation("tamper-attack-ignores-adapter", TR,
             'data["model"]["init_adapter"] = starts.defended.model.init_adapter if run.start == "adapter" else None',
             'data["model"]["init_adapter"] = None', TAMPER),
    Mutation("tamper-utility-ignores-adapter", TI,
             'for side, policy in (("base", defended.without_adapter()), ("defended", defended)):',
             'for side, policy in (("base", defended.without_adapter()), ("defended", defended.without_adapter())):',
             ("tests/experiments/test_tamper_utility.py",) + TAMPER),
    Mutation("tamper-heldout-compliance-exclusive", "purplerl/experiments/tamper/heldout.py",
             "row[key] >= compliance_at and not d", "row[key] > compliance_at and not d",
             ("tests/experiments/test_tamper_heldout.py",)),
    # ---- gradient routing and the adversarial recipe, through their own code (issue 34)
    Mutation("route-part-unscaled", RT, "engine.forward_backward(part, dataclasses.replace(loss, scale=share))",
             "engine.forward_backward(part, loss)", ROUTE),
    Mutation("route-hacks-train-retain", RT, "engine.use_adapters(BOTH, [FORGET] if hack else None)",
             "engine.use_adapters(BOTH, None)", ROUTE),
    Mutation("route-loss-metric-share-twice", RT, 'weight = 1.0 if key == "loss" else share', "weight = share",
             ROUTE),
    Mutation("adversarial-attacker-reward-kl-defenders", AV,
             "(attacker_beta(config) if in_reward else 0.0) * per_episode(attacker.kl_N, shape)",
             "(r.kl_beta if in_reward else 0.0) * per_episode(attacker.kl_N, shape)", ADVERSARIAL),
    Mutation("adversarial-attacker-loss-kl-defenders", AV,
             "beta = attacker_beta(config) if side == ATTACKER else config.reward.kl_beta",
             "beta = config.reward.kl_beta", ADVERSARIAL),
    Mutation("adversarial-defender-samples-with-attacker", "purplerl/recipes/adversarial/dialogue.py",
             "        engine.use_adapter(DEFENDER)\n", "        engine.use_adapter(ATTACKER)\n", ADVERSARIAL),
    Mutation("adversarial-asr-exclusive", AV, '"asr": float((unsafe_EK >= unsafe_at).float().mean())',
             '"asr": float((unsafe_EK > unsafe_at).float().mean())', ADVERSARIAL),
    Mutation("adversarial-episode-asr-exclusive", AV, "float((unsafe_EK >= unsafe_at).any(dim=1).float().mean())",
             "float((unsafe_EK > unsafe_at).any(dim=1).float().mean())", ADVERSARIAL),
    Mutation("sample-ignores-checkpoint", "purplerl/runs/sample.py",
             "policy = resolve_policy(cfg.sample.checkpoint, cfg.model, cfg.data)",
             "policy = resolve_policy(None, cfg.model, cfg.data)", ADAPTER),
    Mutation("eval-ignores-checkpoint", "purplerl/eval/run.py",
             "policy = resolve_policy(checkpoint, cfg.model, cfg.data)",
             "policy = resolve_policy(None, cfg.model, cfg.data)", ADAPTER),
    Mutation("policy-loads-without-adapter", PO, "engine = make_engine(self.model)",
             'engine = make_engine(self.model.model_copy(update={"init_adapter": None}))', ADAPTER),
    Mutation("policy-ignores-run-prompt-format", PO,
             "prompting = prompt.model_copy(update=_unset(prompt, run_prompt))", "prompting = prompt", PROMPTING),
    Mutation("policy-run-overrides-user", PO,
             "return {k: v for k, v in values.items() if k not in section.model_fields_set}", "return dict(values)",
             PROMPTING),
    # behaviours whose one-line bugs the suite missed before round 3 (each test written from the behaviour)
    Mutation("tamper-relation-lower-bound", "purplerl/experiments/tamper/stats.py",
             'if defended["low"] > base["high"]:', 'if defended["low"] > base["low"]:', TAMPER),
    Mutation("tamper-relation-touching", "purplerl/experiments/tamper/stats.py",
             'if defended["low"] > base["high"]:', 'if defended["low"] >= base["high"]:', TAMPER),
    Mutation("miner-keeps-blank-prompts", "purplerl/experiments/tamper/mining.py",
             "or refusal.refused(text) or not prompt.strip() or key in seen):",
             "or refusal.refused(text) or key in seen):", ("tests/experiments/test_tamper_mining.py",)),
    Mutation("collapse-empty-at-bound", "purplerl/train/stops.py",
             "if empty is not None and empty > bounds.max_empty_frac:",
             "if empty is not None and empty >= bounds.max_empty_frac:", ("tests/train/test_stops.py",)),
    Mutation("collapse-top-at-bound", "purplerl/train/stops.py",
             "if top is not None and top > bounds.max_top_share:",
             "if top is not None and top >= bounds.max_top_share:", ("tests/train/test_stops.py",)),
    Mutation("manifest-allows-dotdot", "purplerl/runs/checkpoints.py",
             'Path(name).is_absolute() or ".." in Path(name).parts:', "Path(name).is_absolute():",
             ("tests/train/test_checkpoint.py",)),
    Mutation("align-key-ignores-data", "purplerl/experiments/align.py",
             'blob = json.dumps({"data": alignment_data_hash(), ', 'blob = json.dumps({"data": None, ',
             ("tests/experiments/test_align.py",)),
    Mutation("noiser-weight-ignored", DF,
             "params = TokenNoiserParams(epsilon=d.noiser_epsilon, noise_weight=d.noiser_noise_weight)",
             "params = TokenNoiserParams(epsilon=d.noiser_epsilon)", ("tests/recipes/test_defend_tamper.py",)),
    Mutation("client-body-budget-off-by-one", "purplerl/rewards/client.py",
             "if frame + size > info.max_body_bytes:", "if frame + size >= info.max_body_bytes:",
             ("tests/rewards/test_reward_client.py",)),
    # ---- the pipeline: its gates, the rollback decision, the compliance metrics the safety gates read
    Mutation("pipeline-gate-min-read-as-max", PG, "passed = (lower is None or value >= lower)",
             "passed = (lower is None or value <= lower)", PIPELINE_GATES),
    Mutation("pipeline-gate-bounds-exclusive", PG,
             "passed = (lower is None or value >= lower) and (upper is None or value <= upper)",
             "passed = (lower is None or value > lower) and (upper is None or value < upper)", PIPELINE_GATES),
    Mutation("pipeline-gate-reference-side-ignored", PG, 'return float(measured.get(side, measured["mean"])), ""',
             'return float(measured["mean"]), ""', PIPELINE_GATES),
    Mutation("pipeline-failed-gate-passes", PR, "decision = failed if reasons else PASSED", "decision = PASSED",
             PIPELINE_RUN),
    Mutation("pipeline-rollback-keeps-failed-model", PR,
             "after = passed_model if decision == PASSED and passed_model is not None else position.model",
             "after = passed_model if passed_model is not None else position.model", PIPELINE_RUN),
    Mutation("compliance-threshold-exclusive", PM, "flags.append(float(score >= judge.params.threshold and",
             "flags.append(float(score > judge.params.threshold and", PIPELINE_MEASURE),
    Mutation("compliance-counts-degenerate-answers", PM,
             "judge.params.threshold and not degenerate(row[\"completion\"], MAX_REPETITION)))",
             "judge.params.threshold))", PIPELINE_MEASURE),
    # ---- engine capabilities and the launch API (issue 35)
    Mutation("capabilities-data-parallel-mixes", "purplerl/engines/capabilities.py",
             "        found -= {ADAPTER_MIXING}\n", "        found -= frozenset()\n",
             ("tests/engines/test_capabilities.py", "tests/recipes/test_route.py")),
    Mutation("capabilities-full-finetune-keeps-adapters", "purplerl/engines/capabilities.py",
             "        found -= ADAPTER_CAPABILITIES\n", "        found = found\n",
             ("tests/engines/test_capabilities.py", "tests/recipes/test_ppo.py")),
    Mutation("runner-skips-capability-check", "purplerl/train/runner.py", "    recipe.check_engine(config)\n",
             "    pass\n", ("tests/recipes/test_route.py", "tests/recipes/test_adversarial.py")),
    Mutation("launch-accepts-another-recipes-config", "purplerl/launch.py", "    if config.recipe != recipe.name:",
             "    if False:", ("tests/test_launch.py",)),
]


def snippet_problems(mutations: list[Mutation], root: Path) -> list[str]:
    """One line per mutation whose original snippet does not occur exactly once in its file."""
    problems = []
    for m in mutations:
        path = root / m.path
        count = path.read_text().count(m.original) if path.is_file() else -1
        if count != 1:
            where = "file missing" if count < 0 else f"found {count} times"
            problems.append(f"{m.name}: snippet in {m.path} {where}; update the mutation list")
    return problems
