"""Deprecated: ``verl_digen.trainer`` was split by job in 0.2 and its modules are aliases until 0.3.

The driver is ``verl_digen.driver``, the run config and its validation ``verl_digen.config``, and what a
run reports ``verl_digen.reporting``; in code "trainer" now names the trainer pool only. Importing an old
path (e.g. ``verl_digen.trainer.runtime``) warns once and gives the new module itself, so patches and
``isinstance`` checks written against it keep working. ``MOVED`` maps every old module to its new home.
"""

from __future__ import annotations

import importlib
import sys
import warnings

MOVED = {
    "config": "verl_digen.config.schema",
    "errors": "verl_digen.config.errors",
    "checks": "verl_digen.config.checks",
    "user_inputs": "verl_digen.config.user_inputs",
    "memory": "verl_digen.config.memory",
    "plan": "verl_digen.config.plan",
    "planning": "verl_digen.config.planning",
    "metrics": "verl_digen.reporting.metrics",
    "metric_names": "verl_digen.reporting.metric_names",
    "run_log": "verl_digen.reporting.run_log",
    "plots": "verl_digen.reporting.plots",
    "progress": "verl_digen.reporting.progress",
    "trace_stream": "verl_digen.reporting.trace_stream",
    "runtime": "verl_digen.driver.runtime",
    "ray_backend": "verl_digen.driver.ray_backend",
    "stopping": "verl_digen.driver.stopping",
    "faults": "verl_digen.driver.faults",
    "pools": "verl_digen.driver.pools",
    "probe": "verl_digen.driver.probe",
    "accumulator": "verl_digen.driver.accumulator",
    "completions": "verl_digen.driver.completions",
    "validation": "verl_digen.driver.validation",
    "local": "verl_digen.driver.local",
}


def alias(old: str) -> None:
    """Make module ``old`` (``verl_digen.trainer.<name>``) the module it moved to, with a warning."""
    new = MOVED[old.rsplit(".", 1)[1]]
    warnings.warn(f"{old} moved to {new}; the old path is removed in verl-digen 0.3", DeprecationWarning,
                  stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
