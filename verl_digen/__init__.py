"""verl-digen: disaggregated RL post-training for diffusion models, as a verl plugin."""

__version__ = "0.1.0"
