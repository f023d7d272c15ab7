"""The driver of a training run: ``DigenRuntime`` (pools, worker groups, the executor loop on the Ray
backend, step reports, checkpoints, validation, stopping) and what it is made of, plus the
single-process reference loop (``local.py``). Data path of one step: action -> ``Completion`` (a typed
result, ``completions.py``) -> ``StepAccumulator`` (``accumulator.py``) -> step report."""
