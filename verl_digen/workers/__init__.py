"""Ray worker layer (generator, TSP actor, TAG hybrid, weight sync).

Kept import-free on purpose: verl imports ``verl_digen.workers.platform_cpu`` through its plugin entry
point on every ``import verl``, which runs this file; import the submodules directly.
"""
