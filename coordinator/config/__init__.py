"""Configuration: one YAML file, validated once at start, with environment overrides.

Every option has a default except ``cluster``. An environment variable
``COORDINATOR__SECTION__FIELD=value`` overrides ``section.field`` (the field's type converts the text:
``true``, ``5`` and ``1.5`` where a boolean or a number is expected, while ``on`` stays ``on`` where a
string is; ``null`` is null, ``[...]`` and ``{...}`` are YAML lists and mappings). Errors name the field:
``zookeeper.session_timeout: Input should be greater than or equal to 4``.

The sections live in ``services`` (IMDS, ZooKeeper), ``policy``, ``drain``, ``actions`` and ``outputs``
(probe, admin listener, application health, logging) on the shared base of ``base``; ``settings`` holds the
whole model. Reading a file is ``loading``, with ``env`` (overrides) and ``wording`` (error messages);
``host`` checks this machine, ``advice`` warns of what a valid configuration may still get wrong (drain
waits against notices and the probe's lag, misnamed environment variables), ``redaction`` masks secrets
for display. Every public name is importable from here.
"""

from __future__ import annotations

from coordinator.config.actions import (
    ActionConfig,
    AzureLbActionConfig,
    CommandActionConfig,
    ConnectionsActionConfig,
    HAProxyActionConfig,
    WebhookActionConfig,
)
from coordinator.config.advice import config_warnings, environment_warnings
from coordinator.config.base import MINIMUM_NOTICE_SECONDS
from coordinator.config.drain import DrainConfig
from coordinator.config.env import ENV_PREFIX, apply_env, env_overrides, env_value, ignored_variables
from coordinator.config.host import host_problems
from coordinator.config.loading import decode_config, load_settings
from coordinator.config.outputs import ADMIN_PATHS, AppHealthConfig, HttpConfig, LoggingConfig, ProbeConfig
from coordinator.config.policy import ApprovalRule, ApproverMode, MaintenanceWindowConfig, PeersPolicy, PolicyConfig
from coordinator.config.redaction import REDACTED, redacted
from coordinator.config.services import (
    ImdsConfig,
    ZooKeeperAclConfig,
    ZooKeeperAuthConfig,
    ZooKeeperConfig,
    ZooKeeperTlsConfig,
)
from coordinator.config.settings import Settings

__all__ = [
    "ADMIN_PATHS",
    "ENV_PREFIX",
    "MINIMUM_NOTICE_SECONDS",
    "REDACTED",
    "ActionConfig",
    "AppHealthConfig",
    "ApprovalRule",
    "ApproverMode",
    "AzureLbActionConfig",
    "CommandActionConfig",
    "ConnectionsActionConfig",
    "DrainConfig",
    "HAProxyActionConfig",
    "HttpConfig",
    "ImdsConfig",
    "LoggingConfig",
    "MaintenanceWindowConfig",
    "PeersPolicy",
    "PolicyConfig",
    "ProbeConfig",
    "Settings",
    "WebhookActionConfig",
    "ZooKeeperAclConfig",
    "ZooKeeperAuthConfig",
    "ZooKeeperConfig",
    "ZooKeeperTlsConfig",
    "apply_env",
    "config_warnings",
    "decode_config",
    "env_overrides",
    "env_value",
    "environment_warnings",
    "host_problems",
    "ignored_variables",
    "load_settings",
    "redacted",
]
