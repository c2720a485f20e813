"""The verdicts of the Azure Resource Manager checks, from what ARM described: the load balancer's probe
against the drain wait, automatic repairs, terminate notifications, automatic approvals and Spot
priority. Pure functions, no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.doctor.outcome import Status, Verdict

__all__ = [
    "LONGEST_DRAIN_SECONDS",
    "LbProbe",
    "auto_approve_verdict",
    "iso_duration_seconds",
    "lb_probe_verdict",
    "repairs_verdict",
    "spot_verdict",
    "terminate_verdict",
]


#: A drain can last until NotBefore: the longest notice of an event type approved after a drain.
LONGEST_DRAIN_SECONDS = 900.0


def iso_duration_seconds(value: object) -> float | None:
    """Seconds of an ISO 8601 duration as ARM writes them (``PT10M``, ``PT1H30M``, ``PT90S``); None if not one."""
    if not isinstance(value, str):
        return None
    match = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", value.strip().upper())
    if match is None or not any(match.groups()):
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


@dataclass(frozen=True)
class LbProbe:
    """A load balancer health probe as ARM describes it (``Probe`` of loadBalancer.json)."""

    lb: str
    name: str
    protocol: str
    port: int | None
    interval: float  # intervalInSeconds (15 when absent)
    threshold: int  # probeThreshold, else numberOfProbes, else 1
    request_path: str | None = None


def lb_probe_verdict(*, probes: Sequence[LbProbe], port: int, path: str, configured_interval: float,
                     configured_threshold: int, probe_wait: float, admin_state: bool) -> Verdict:
    """The load balancer's probe against the agent's probe (``port``, ``path``) and the drain wait that
    relies on the probe (``probe_wait``: ``drain.wait_seconds``, or with admin state the azure-lb action's
    fallback wait). The load balancer stops new flows ``interval x threshold`` after the probe fails: a
    probe-based drain wait shorter than that acknowledges while new flows still arrive (FAIL). A Tcp probe
    never sees the agent's 503 (FAIL); a probe on another path, or ``drain.probe_*`` values that differ
    from the load balancer's, are a WARN."""
    details: dict[str, Any] = {"probes": [{"lb": p.lb, "name": p.name, "protocol": p.protocol, "port": p.port,
                                           "interval": p.interval, "threshold": p.threshold,
                                           "request_path": p.request_path} for p in probes],
                               "probe_wait": probe_wait, "admin_state": admin_state}
    mine = [p for p in probes if p.port == port]
    if not mine:
        listed = ", ".join(f"{p.lb}/{p.name} ({p.protocol} {p.port})" for p in probes) or "none"
        return Verdict(Status.WARN, f"no probe of the load balancer targets the agent's probe port {port} (probes: "
                       f"{listed}): draining by probe does not stop the load balancer's flows",
                       f"point the load balancer's health probe at port {port}, path {path} (probe.listen, "
                       "probe.path) and its load-balancing rules at that probe", details)
    probe = max(mine, key=lambda p: p.interval * p.threshold)
    lag = probe.interval * probe.threshold
    details.update(lag=lag, probe=probe.name)
    said = (f"{probe.lb}/{probe.name}: {probe.protocol} port {probe.port}, every {probe.interval:g} s, "
            f"threshold {probe.threshold}: new flows stop {lag:g} s after the probe fails")
    if probe.protocol.lower() == "tcp":
        return Verdict(Status.FAIL, f"{said}, but a Tcp probe only checks that the port accepts connections: the "
                       "agent's 503 never takes the VM out of rotation",
                       f"make the probe Http on port {probe.port} with requestPath {path}", details)
    wait_name = "the azure-lb action's fallback wait" if admin_state else "the drain wait"
    if probe_wait < lag:
        return Verdict(Status.FAIL, f"{said}; {wait_name} is {probe_wait:g} s: the VM is acknowledged drained while "
                       "the load balancer still sends it new flows",
                       f"set drain.probe_interval_seconds: {probe.interval:g} and drain.probe_threshold: "
                       f"{probe.threshold} (and drop drain.wait_seconds, or raise it to at least {lag:g} s"
                       + (", or fallback_wait_seconds" if admin_state else "") + ")", details)
    problems = []
    if probe.request_path is not None and probe.request_path != path:
        problems.append(f"it asks {probe.request_path}, the agent answers drains on {path}")
    if (probe.interval, probe.threshold) != (configured_interval, configured_threshold):
        problems.append(f"drain.probe_interval_seconds/probe_threshold say {configured_interval:g} s x "
                        f"{configured_threshold}")
    if problems:
        return Verdict(Status.WARN, f"{said}; " + "; ".join(problems),
                       f"set requestPath {path} on the probe and drain.probe_interval_seconds: {probe.interval:g}, "
                       f"drain.probe_threshold: {probe.threshold}", details)
    return Verdict(Status.PASS, f"{said}; {wait_name} ({probe_wait:g} s) covers it", details=details)


def repairs_verdict(*, enabled: bool, grace_period: str | None, repair_action: str | None,
                    health_source: str | None, drain_probe_source: bool,
                    longest_drain: float = LONGEST_DRAIN_SECONDS, unserved: str | None = None,
                    app_health: str | None = None) -> Verdict:
    """Automatic instance repairs against the longest possible drain. A drain can last until NotBefore
    (``longest_drain``: 15 min for a Freeze or a Reboot whose early approval a peer blocks); when the
    repairs' health source is the drain probe (``drain_probe_source``: the scale set's health probe, or the
    Application Health extension, on the agent's probe port), a drained VM looks unhealthy all that time,
    and a grace period shorter than that lets the scale set repair (replace, by default) a VM in the
    middle of planned maintenance: FAIL. ``health_source`` describes the source (None: none found).
    ``unserved``: the Application Health extension asks one of the agent's own ports for a path the agent
    does not answer as health (say why): it reads 404, the VM is Unhealthy for ever, and repairs replace it
    once the grace runs out, maintenance or not: FAIL with repairs on, WARN without. ``app_health``: where
    the agent answers as health for repairs (``port 9110 /apphealth``; None: named by its options), the
    source the fixes lead with, as docs/deployment-azure.md advises; a longer grace period comes second."""
    endpoint = app_health or "app_health.path on http.listen"
    grace = iso_duration_seconds(grace_period) if grace_period is not None else 600.0
    details = {"enabled": enabled, "grace_period": grace_period, "grace_seconds": grace,
               "repair_action": repair_action, "health_source": health_source,
               "drain_probe_source": drain_probe_source, "longest_drain": longest_drain, "unserved": unserved}
    if unserved is not None:
        fix = f"point the extension's requestPath at the agent's application health endpoint ({unserved})"
        if not enabled:
            return Verdict(Status.WARN, f"{health_source} is not a health endpoint of the agent: every VM reads "
                           "Unhealthy (automatic repairs are off)", fix, details)
        return Verdict(Status.FAIL, f"automatic repairs read {health_source}, which is not a health endpoint of "
                       f"the agent: every VM reads Unhealthy and is {(repair_action or 'Replace').lower()}d once the "
                       "grace period runs out", fix, details)
    if not enabled:
        return Verdict(Status.PASS, "automatic repairs are off: a drained VM is never repaired", details=details)
    action = (repair_action or "Replace").lower()
    if grace is None:
        return Verdict(Status.WARN, f"automatic repairs are on with a grace period ARM wrote as {grace_period!r}, "
                       "which cannot be read", "check automaticRepairsPolicy.gracePeriod (ISO 8601, PT10M to PT90M)",
                       details)
    need = max(longest_drain, 600.0)
    fix_grace = f"PT{math.ceil(need / 60) + 5:d}M"
    if health_source is None:
        return Verdict(Status.WARN, f"automatic repairs are on (grace {_minutes(grace)}, {action}) but no health "
                       "source was found (no networkProfile.healthProbe, no Application Health extension)",
                       "give the scale set a health source that a drain does not fail (the Application Health "
                       f"extension on the agent's application health endpoint, {endpoint}), or turn automatic "
                       "repairs off", details)
    if not drain_probe_source:
        return Verdict(Status.PASS, f"automatic repairs are on (grace {_minutes(grace)}, {action}), with health from "
                       f"{health_source}, not from the drain probe: a drain does not make the VM unhealthy",
                       details=details)
    said = (f"automatic repairs read {health_source}, which is the drain probe, with a grace period of "
            f"{_minutes(grace)}")
    if grace < need:
        return Verdict(Status.FAIL, f"{said}: a drain can last until NotBefore ({_minutes(need)} for a Freeze or a "
                       f"Reboot), so a drained VM can be {action}d in the middle of planned maintenance",
                       "take the repairs' health source off the drain probe: point the Application Health "
                       f"extension at the agent's application health endpoint ({endpoint}), Healthy while "
                       "drained (docs/deployment-azure.md); else raise automaticRepairsPolicy.gracePeriod to "
                       f"{fix_grace} (az vmss update --set automaticRepairsPolicy.gracePeriod={fix_grace})", details)
    return Verdict(Status.PASS, f"{said}, longer than the longest drain ({_minutes(need)}): a drained VM is not "
                   "repaired during maintenance", details=details)


def terminate_verdict(*, enabled: bool | None, not_before_timeout: str | None, drain_wait: float,
                      lapse: float, os_image: str | None = None) -> Verdict:
    """Scale-set terminate notifications (``scheduledEventsProfile.terminateNotificationProfile``). Off
    (the default): a scale-in or a delete terminates the VM without a Terminate event, so nothing drains
    it: WARN. On: ``notBeforeTimeout`` (5 to 15 minutes; 5 when not given) is the Terminate's notice; it
    must exceed the drain wait (FAIL otherwise) and, to approve early after a lost agent, the session's
    lapse plus the drain wait (WARN otherwise). ``os_image``: the OS-image notification profile, reported."""
    notice = iso_duration_seconds(not_before_timeout) if not_before_timeout is not None else 300.0
    details = {"enabled": bool(enabled), "not_before_timeout": not_before_timeout, "notice_seconds": notice,
               "drain_wait": drain_wait, "lapse": lapse, "os_image_notification": os_image}
    image = f"; OS image notifications {os_image}" if os_image else ""
    if not enabled:
        return Verdict(Status.WARN, "terminate notifications are off: a scale-in or delete terminates this VM "
                       f"without a Terminate event, so it is not drained first{image}",
                       "enable them: az vmss update --enable-terminate-notification true "
                       "--terminate-notification-time 10 (minutes; terminateNotificationProfile)",
                       details)
    if notice is None:
        return Verdict(Status.WARN, f"terminate notifications are on with a notBeforeTimeout ARM wrote as "
                       f"{not_before_timeout!r}, which cannot be read{image}",
                       "check terminateNotificationProfile.notBeforeTimeout (ISO 8601, PT5M to PT15M)", details)
    said = f"terminate notifications are on, {_minutes(notice)} of notice"
    if notice <= drain_wait:
        return Verdict(Status.FAIL, f"{said}, not more than the Terminate drain wait ({drain_wait:g} s): the VM is "
                       f"terminated before it counts as drained{image}",
                       "raise notBeforeTimeout (az vmss update --terminate-notification-time 10) or lower "
                       "drain.wait_seconds_by_type.Terminate", details)
    if notice <= lapse + drain_wait:
        return Verdict(Status.WARN, f"{said}: after a lost agent ({lapse:g} s for its session to lapse) plus the "
                       f"drain wait ({drain_wait:g} s) a Terminate starts at NotBefore unapproved{image}",
                       "raise notBeforeTimeout (az vmss update --terminate-notification-time 10)", details)
    return Verdict(Status.PASS, f"{said}, beyond the drain wait ({drain_wait:g} s) even after a lost agent{image}",
                   details=details)


def auto_approve_verdict(*, reboot: bool | None, redeploy: bool | None, resource: str, command: str,
                         all_down: bool | None = None) -> Verdict:
    """``scheduledEventsPolicy`` of the scale set, availability set or VM (``resource``):
    ``userInitiatedReboot`` / ``userInitiatedRedeploy`` with ``automaticallyApprove`` true make Azure
    approve those events itself, so they appear as Started with no Scheduled phase and hit a serving VM:
    FAIL, with the ``command`` (``az vmss update ...``, ``az vm update ...``) that turns each off.
    ``allInstancesDown.automaticallyApprove`` (``all_down``; absent means Azure's default, true) lets Azure
    start an event at once when it judges every instance down, when no agent runs to approve it: said on
    the PASS line; false warns, since such an event then waits its whole notice with nothing serving."""
    details = {"user_initiated_reboot": reboot, "user_initiated_redeploy": redeploy,
               "all_instances_down": all_down, "resource": resource}
    auto = [name for name, on in (("reboot", reboot), ("redeploy", redeploy)) if on]
    if auto:
        listed = " and ".join(f"user-initiated {name}s" for name in auto)
        settings = " ".join(f"scheduledEventsPolicy.userInitiated{name.capitalize()}.automaticallyApprove=false"
                            for name in auto)
        return Verdict(Status.FAIL, f"{resource}: {listed} are approved by Azure at once: their events appear as "
                       "Started with no Scheduled phase, so nothing drains and they hit a VM while it serves",
                       f"{command} --set {settings}", details)
    if all_down is False:
        return Verdict(Status.WARN, f"{resource}: user-initiated reboots and redeploys wait for approval, but "
                       "allInstancesDown.automaticallyApprove is false: an event while every instance is down (no "
                       "agent left to approve it) waits its whole notice with nothing serving",
                       f"{command} --set scheduledEventsPolicy.allInstancesDown.automaticallyApprove=true", details)
    return Verdict(Status.PASS, f"{resource}: user-initiated reboots and redeploys wait for approval (no "
                   "automaticallyApprove); Azure starts an event at once when it judges every instance down "
                   "(allInstancesDown, the default)", details=details)


def spot_verdict(*, priority: str | None, resource: str) -> Verdict:
    """Spot (or the older Low) priority: evictions come as a Preempt with 30 s of notice, which an early
    approval cannot usefully shorten: WARN."""
    details = {"priority": priority, "resource": resource}
    if (priority or "Regular").lower() not in ("spot", "low"):
        return Verdict(Status.PASS, f"{resource}: {priority or 'Regular'} priority: no eviction", details=details)
    return Verdict(Status.WARN, f"{resource}: {priority} priority: an eviction comes as a Preempt with 30 s of "
                   "notice, too short to drain and approve early usefully",
                   "use Regular priority for VMs that must drain before maintenance, or accept evictions with "
                   "drain.wait_seconds_by_type.Preempt (5 s)", details)
