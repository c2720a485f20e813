"""The verdict of each ``coordinator doctor`` check, from what was observed: pure functions, no I/O.

Each takes plain values (what IMDS answered, the ACL read, the member info...) and returns a ``Verdict``:
PASS, WARN or FAIL with one line saying what was found and, unless PASS, one line saying what to do.
SKIP is for a check that did not run (``--skip``, a prerequisite that failed, or a check that needs
what is not built yet); it never changes the exit status.

This module gathers them under one name: ``Status``, ``Verdict`` and the exit status are in
``coordinator.doctor.outcome``; the verdicts of this machine alone (configuration, proxy, IMDS, clock) in
``coordinator.doctor.verdicts_local``, of ZooKeeper (connection, ACLs, session timeout) in
``coordinator.doctor.verdicts_zookeeper``, of the probe and the members in
``coordinator.doctor.verdicts_probe``, of this VM's delivery unit and mode in
``coordinator.doctor.verdicts_delivery``, of what ARM describes in ``coordinator.doctor.verdicts_azure``, and of
the ``azure-lb`` action's identity, pools and permissions in ``coordinator.doctor.verdicts_admin_state``.
"""

from __future__ import annotations

from coordinator.doctor.outcome import Status, Verdict, exit_status, worst
from coordinator.doctor.verdicts_admin_state import POOL_WRITE, PermissionsRead, PoolRead, admin_state_verdict, granted
from coordinator.doctor.verdicts_azure import (
    LONGEST_DRAIN_SECONDS,
    LbProbe,
    auto_approve_verdict,
    iso_duration_seconds,
    lb_probe_verdict,
    repairs_verdict,
    spot_verdict,
    terminate_verdict,
)
from coordinator.doctor.verdicts_delivery import agent_unit, delivery_verdict
from coordinator.doctor.verdicts_local import (
    CLOCK_FAIL_SECONDS,
    CLOCK_WARN_SECONDS,
    clock_verdict,
    config_verdict,
    imds_verdict,
    proxy_verdict,
)
from coordinator.doctor.verdicts_probe import ProbeAnswer, members_verdict, probe_verdict
from coordinator.doctor.verdicts_probe import is_loopback as is_loopback
from coordinator.doctor.verdicts_zookeeper import acl_verdict, session_verdict, zookeeper_verdict

__all__ = [
    "CLOCK_FAIL_SECONDS",
    "CLOCK_WARN_SECONDS",
    "LONGEST_DRAIN_SECONDS",
    "POOL_WRITE",
    "LbProbe",
    "PermissionsRead",
    "PoolRead",
    "ProbeAnswer",
    "Status",
    "Verdict",
    "acl_verdict",
    "admin_state_verdict",
    "agent_unit",
    "auto_approve_verdict",
    "clock_verdict",
    "config_verdict",
    "delivery_verdict",
    "exit_status",
    "granted",
    "imds_verdict",
    "iso_duration_seconds",
    "lb_probe_verdict",
    "members_verdict",
    "probe_verdict",
    "proxy_verdict",
    "repairs_verdict",
    "session_verdict",
    "spot_verdict",
    "terminate_verdict",
    "worst",
    "zookeeper_verdict",
]
