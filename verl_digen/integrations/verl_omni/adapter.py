"""The trainer adapter: the surface verl-omni's TaskRunner calls, running verl-digen's runtime instead.

Imports only the standard library at import time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from .convert import to_run_config
from .entry import CHECKED_ENV

logger = logging.getLogger(__name__)

#: the package these classes are imported from (verl-omni loads the agent-loop manager by this name)
PUBLIC_MODULE = "verl_digen.integrations.verl_omni"
NULL_AGENT_LOOP_MANAGER = f"{PUBLIC_MODULE}.NullAgentLoopManager"


class NullAgentLoopManager:
    """Stands in for verl-omni's agent-loop manager: verl-digen's generator pool does the rollout."""

    __module__ = PUBLIC_MODULE  # verl-omni loads it by NULL_AGENT_LOOP_MANAGER, the package's public name

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> NullAgentLoopManager:
        return cls()


class DigenVerlOmniTrainer:
    """verl-omni trainer mode ``digen``: runs verl-digen's runtime (``DigenRuntime``) on the converted config.

    It provides the surface verl-omni's ``DiffusionTaskRunnerV1`` calls: ``__init__(config)``, ``init()``,
    ``get_llm_client()``, ``get_reward_handles()`` and ``fit(agent_loop_manager)``. verl-omni's
    rollout servers and agent loop are not started. The generator pool replaces them.
    """

    __module__ = PUBLIC_MODULE  # its public home (verl-omni's registry reports module.qualname)
    runtime_cls: Callable[..., Any] | None = None  # default: verl_digen.driver.runtime.DigenRuntime

    def __init__(self, config: Any) -> None:
        self.config = config
        # fails here, before any worker starts, on a bad config (normally entry_guard already did, in the driver)
        log = logger.debug if os.environ.get(CHECKED_ENV) else logger.warning
        self.run_config = to_run_config(config, log=log)
        self.dry_run = bool(self.run_config.trainer.dry_run)  # normally handled by entry_guard in the driver
        self.runtime: Any = None

    def init(self) -> None:
        """Route verl-omni's agent-loop construction to the null manager and build the runtime."""
        from omegaconf import DictConfig, open_dict

        if isinstance(self.config, DictConfig):
            with open_dict(self.config):
                rollout = self.config.actor_rollout_ref.rollout
                if rollout.get("agent") is None:
                    rollout.agent = {}
                rollout.agent.agent_loop_manager_class = NULL_AGENT_LOOP_MANAGER
        if self.dry_run:
            return
        runtime_cls = self.runtime_cls
        if runtime_cls is None:
            from verl_digen.driver.runtime import DigenRuntime as runtime_cls
        self.runtime = runtime_cls(self.run_config)

    def get_llm_client(self) -> None:
        return None

    def get_reward_handles(self) -> list[Any]:
        return []

    def fit(self, agent_loop_manager: Any = None) -> Any:
        """Run ``trainer.total_steps`` global steps with verl-digen's scheduler, then release the workers."""
        if self.dry_run:  # print the plan, train nothing
            from verl_digen.main import dry_run

            print(dry_run(self.run_config))
            return None
        if self.runtime is None:
            self.init()
        try:
            return self.runtime.fit()
        finally:
            self.runtime.shutdown()
