"""The defaults and accepted names that the run config shares with the torch layers below it (algo,
rollout, rewards), in one torch-free module (as ``dtypes.py`` is for dtypes): ``import verl_digen.config``
and a dry run read them without importing torch. Each torch module re-exports its own from here, so code
keeps importing them where they belong (``algo.loss.CLIP_RANGE``, ``algo.sde.SDE_KINDS``, ...)."""

from __future__ import annotations

# -- algo.loss ---------------------------------------------------------------------------------------
#: the default clip range of the importance ratio: verl's PPO default, which a run's ``actor.clip_ratio``
#: also starts from (Flow-GRPO and verl-omni's diffusion actor use 1e-4; the converter carries theirs)
CLIP_RANGE = 0.2

# -- algo.sde ----------------------------------------------------------------------------------------
SDE_KINDS = ("flow_grpo", "dance_grpo", "cps", "ode")
#: how a transition's log-prob is computed: the Gaussian log-density, or flow_grpo/verl-omni's CPS form
LOG_PROB_KINDS = ("gaussian", "squared_error")

# -- algo.selection ----------------------------------------------------------------------------------
SELECTION_KINDS = ("first_k", "random_k", "window")

# -- algo.advantages ---------------------------------------------------------------------------------
STD_SCOPES = ("group", "batch")
STD_ESTIMATORS = ("population", "unbiased")

# -- rollout.sampler ---------------------------------------------------------------------------------
#: the default sampling steps and trained steps, which a run's ``rollout.num_steps`` / ``rollout.train_steps``
#: also start from: the tiny CPU run's (Flow-GRPO trains 9 of 10 on real models)
NUM_STEPS = 6
TRAIN_STEPS = 4

# -- rewards.registry --------------------------------------------------------------------------------
#: The reward a tiny random-weight model learns within a few GRPO steps: the final-latent mean moves
#: directly with the policy output (no decoder in between) and is monotone, so it cannot saturate.
DEFAULT_LEARNABLE_REWARD = "latent_mean"

# -- reporting.run_log -------------------------------------------------------------------------------
#: the console log's forms: a block per step, or one line per step for cluster logs (``trainer.log_format``)
LOG_FORMATS = ("block", "line")
