"""verl-digen's rollout through vLLM-Omni: what crosses the engine boundary and how a batch is stepped.

``request`` builds a micro-batch's prompts and sampling settings, ``output`` turns the engine's outputs back
into ``Trajectories``, ``policy`` wraps an engine's transformer in the adapter that knows its timestep
convention and packing, and ``stepper`` runs a request batch through ``rollout.denoise``. None of them
imports vllm: they run (and are tested) on any machine. ``pipelines`` holds the RL pipeline classes the engine
installs (``custom_pipeline_args``); it imports vllm-omni and is imported only inside the engine's processes.
"""
