"""The whole configuration (``Settings``): its sections, the group's and the VM's names, the state file,
and the rules between fields of different sections.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator, model_validator

from coordinator.config.actions import (
    ActionConfig,
    AzureLbActionConfig,
    CommandActionConfig,
    WebhookActionConfig,
)
from coordinator.config.base import Section, reads_stand_in, stand_ins_of
from coordinator.config.drain import DrainConfig
from coordinator.config.outputs import AppHealthConfig, HttpConfig, LoggingConfig, ProbeConfig
from coordinator.config.policy import PolicyConfig
from coordinator.config.services import ImdsConfig, ZooKeeperConfig
from coordinator.errors import InvalidName
from coordinator.names import normalize_vm_name
from coordinator.support.hostos import default_state_file

__all__ = ["Settings"]


class Settings(Section):
    cluster: str = Field(description="Name of the VM group; one ZooKeeper chroot per cluster")
    vm_name: str | None = Field(
        None, description="This VM's name as it appears in Resources; default: learned from IMDS"
    )
    imds: ImdsConfig = ImdsConfig()
    zookeeper: ZooKeeperConfig = ZooKeeperConfig()
    policy: PolicyConfig = PolicyConfig()
    drain: DrainConfig = DrainConfig()
    probe: ProbeConfig = ProbeConfig()
    http: HttpConfig = HttpConfig()
    app_health: AppHealthConfig = AppHealthConfig()
    logging: LoggingConfig = LoggingConfig()
    actions: list[ActionConfig] = Field(
        default_factory=list,
        description="Drain actions after the health probe, in order; recovery runs them in reverse",
    )
    state_file: Path | None = Field(
        default_factory=default_state_file,
        description="Where the drain state survives restarts and reboots (null: not kept); default "
        "/var/lib/coordinator/state.json, on Windows %ProgramData%\\coordinator\\state.json",
    )
    done_retention_seconds: float = Field(
        7 * 24 * 3600.0, ge=0, description="How long the leader keeps records of finished events"
    )

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        try:
            return normalize_vm_name(value)
        except InvalidName as exc:
            raise ValueError(str(exc).replace("VM name", "cluster name")) from None

    @field_validator("vm_name")
    @classmethod
    def _vm_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return normalize_vm_name(value)
        except InvalidName as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _timing(self, info: ValidationInfo) -> Settings:
        problems = self.cross_field_problems(stand_ins_of(info))
        if problems:
            raise ValueError("\n  ".join(problems))  # one line each in the report
        return self

    def cross_field_problems(self, stand_ins: Collection[str] = ()) -> list[str]:
        """Every rule between fields that this configuration breaks, each message naming its fields. A rule
        that reads one of ``stand_ins`` (options whose invalid value was taken out, a default standing in
        for it) is not judged: its verdict would be about the default, not the file."""
        problems = []

        def judged(*options: str) -> bool:
            return not reads_stand_in(stand_ins, *options)

        # A session must outlive a few polls, or one slow cycle costs the leader its session.
        if self.zookeeper.session_timeout < 3 * self.imds.poll_interval \
                and judged("zookeeper.session_timeout", "imds.poll_interval"):
            problems.append(
                "zookeeper.session_timeout must be at least 3 x imds.poll_interval "
                f"({self.zookeeper.session_timeout:g} < 3 x {self.imds.poll_interval:g})"
            )
        if self.imds.backoff_max_seconds < self.imds.poll_interval \
                and judged("imds.backoff_max_seconds", "imds.poll_interval"):
            problems.append(
                "imds.backoff_max_seconds must be at least imds.poll_interval "
                f"({self.imds.backoff_max_seconds:g} < {self.imds.poll_interval:g})"
            )
        # Taking a bad action out can hide a shared name, never make one up: no stand-in to fear here.
        names = [a.name for a in self.actions
                 if isinstance(a, CommandActionConfig | WebhookActionConfig | AzureLbActionConfig)]
        if len(names) != len(set(names)):
            problems.append("actions: two actions share a name: " + ", ".join(sorted(names)))
        if self.zookeeper.operation_timeout >= self.zookeeper.session_timeout \
                and judged("zookeeper.operation_timeout", "zookeeper.session_timeout"):
            problems.append("zookeeper.operation_timeout must be shorter than zookeeper.session_timeout")
        grace = self.policy.absent_peer_grace_seconds
        drain = self.drain
        longest_wait = max([drain.effective_wait, *drain.wait_seconds_by_type.values()])
        longest_inputs = [option for event_type, wait in drain.waits().items() if wait == longest_wait
                          for option in drain.wait_inputs(event_type)]
        if drain.effective_wait == longest_wait:
            longest_inputs += drain.effective_wait_inputs()
        if grace is not None and grace < longest_wait \
                and judged("policy.absent_peer_grace_seconds", *longest_inputs):
            problems.append(
                f"policy.absent_peer_grace_seconds ({grace:g}) must be at least the longest drain wait "
                f"({longest_wait:g}): a VM cut off from ZooKeeper drains itself that long before its peers "
                "stop waiting for it"
            )
        if _same_socket(self.probe.listen, self.http.listen) and judged("probe.listen", "http.listen"):
            problems.append(
                f"probe.listen and http.listen must be different ports ({self.probe.listen} and "
                f"{self.http.listen}): the health probe and the admin endpoints each need their own listener"
            )
        health = self.app_health
        idle_cycles = 3 * max(5.0, 2 * self.imds.poll_interval)  # the loop's longest quiet gap, three times
        if health.stuck_after_seconds < idle_cycles \
                and judged("app_health.stuck_after_seconds", "imds.poll_interval"):
            problems.append(
                f"app_health.stuck_after_seconds ({health.stuck_after_seconds:g}) must be at least three idle "
                f"cycles of the agent's loop ({idle_cycles:g} s: 3 x max(5, 2 x imds.poll_interval)): a quiet "
                "loop is not a stuck one"
            )
        if health.path == self.probe.path and judged("app_health.path", "probe.path"):
            problems.append(
                f"app_health.path and probe.path must differ (both {health.path}): the admin listener serves "
                "both, and the load balancer's drain probe must keep its own answer"
            )
        if health.listen is not None:
            for option, other in (("probe.listen", self.probe.listen), ("http.listen", self.http.listen)):
                if _same_socket(health.listen, other) and judged("app_health.listen", option):
                    problems.append(
                        f"app_health.listen and {option} must be different ports ({health.listen} and {other}): "
                        "the application health endpoint's own listener cannot share theirs (leave "
                        "app_health.listen null to serve it on http.listen)"
                    )
        return problems


def _same_socket(a: str, b: str) -> bool:
    """Whether two HOST:PORT listeners would collide: one port, and one host or a wildcard on either side."""
    host_a, _, port_a = a.rpartition(":")
    host_b, _, port_b = b.rpartition(":")
    wildcard = ("", "0.0.0.0", "::", "[::]", "*")
    return int(port_a) == int(port_b) != 0 and (host_a == host_b or host_a in wildcard or host_b in wildcard)
