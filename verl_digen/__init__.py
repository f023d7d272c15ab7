"""verl-digen: disaggregated RL post-training for diffusion models, as a verl plugin."""

__version__ = "0.2.0"
