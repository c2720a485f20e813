"""The Azure Resource Manager (ARM) checks of ``coordinator doctor``: read the load balancer, the scale set
(or the VM) with this VM's managed identity, then judge each trap with a pure verdict of
``coordinator.doctor.verdicts_azure``. ``ArmOptions`` and ``AzureSeen`` are defined with the checks' shared
``Context`` in ``coordinator.doctor.context``, and importable from here too.

Which resources: the load balancers of the ``azure-lb`` action's pools (or ``--load-balancer``), and this
VM's scale set, or the VM itself, from IMDS's ``compute.resourceId`` (or ``--resource-id``). The checks
run when an ``azure-lb`` action is configured or ``--arm`` (``--arm-url``, ``--resource-id``,
``--load-balancer``) asks for them. ARM is only read (GET), through ``coordinator.azure_arm``, the client of
the ``azure-lb`` action. The ``azure`` check does the reading and says in one line what could not be read
(no identity, 403, 404); the others judge what was read, and are skipped when their resource was not.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from coordinator.config import ApprovalRule
from coordinator.doctor.context import ArmOptions, AzureSeen, Context
from coordinator.doctor.outcome import Status, Verdict
from coordinator.doctor.verdicts_azure import (
    LbProbe,
    auto_approve_verdict,
    lb_probe_verdict,
    repairs_verdict,
    spot_verdict,
    terminate_verdict,
)

if TYPE_CHECKING:
    from coordinator.config import AzureLbActionConfig

__all__ = ["ArmOptions", "AzureSeen", "check_approve", "check_azure", "check_probe", "check_repairs",
           "check_spot", "check_terminate", "scope_of"]

NETWORK_API_VERSION = "2023-09-01"
# The first Compute api-version with every field of scheduledEventsPolicy (allInstancesDown among them).
COMPUTE_API_VERSION = "2025-04-01"
DEFAULT_ARM_URL = "https://management.azure.com"
_SCALE_SET_VM = re.compile(r"^(?P<ss>/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
                           r"virtualMachineScaleSets/[^/]+)/virtualMachines/[^/]+$", re.IGNORECASE)
_SCALE_SET = re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/"
                        r"virtualMachineScaleSets/[^/]+$", re.IGNORECASE)
_VM = re.compile(r"^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Compute/virtualMachines/[^/]+$",
                 re.IGNORECASE)
_LB_OF = re.compile(r"^(?P<lb>/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/"
                    r"loadBalancers/[^/]+)(?:/.*)?$", re.IGNORECASE)
_AFTER_DRAIN = ("Freeze", "Reboot", "Redeploy", "Terminate")
_HEALTH_EXTENSIONS = ("applicationhealthlinux", "applicationhealthwindows")


def scope_of(resource_id: str) -> tuple[str, str | None]:
    """``("scale_set", id)`` for a scale set or one of its instances, ``("vm", id)`` for a VM, else
    ``("unknown", None)``."""
    match = _SCALE_SET_VM.match(resource_id)
    if match:
        return "scale_set", match.group("ss")
    if _SCALE_SET.match(resource_id):
        return "scale_set", resource_id
    if _VM.match(resource_id):
        return "vm", resource_id
    return "unknown", None


def _lb_action(ctx: Context) -> AzureLbActionConfig | None:
    from coordinator.config import AzureLbActionConfig

    return next((a for a in ctx.settings.actions if isinstance(a, AzureLbActionConfig)), None)


def _short(resource_id: str) -> str:
    parts = resource_id.strip("/").split("/")
    return "/".join(parts[7:]) if len(parts) > 7 else resource_id


def _agent_probe(ctx: Context) -> tuple[int, str]:
    from coordinator.httpserver import split_host_port

    return split_host_port(ctx.settings.probe.listen)[1], ctx.settings.probe.path


def check_azure(ctx: Context) -> Verdict:
    from coordinator.azure_arm import ArmClient, ArmError, ArmRefused, ManagedIdentity

    options: ArmOptions = ctx.arm
    action = _lb_action(ctx)
    if action is None and not options.enabled:
        return Verdict(Status.SKIP, "not asked: no azure-lb action, and no --arm (the ARM checks need Reader on the "
                       "scale set or VM and on the load balancer)")
    lbs = list(options.load_balancers)
    if not lbs and action is not None:
        for pool in action.backend_pools:
            match = _LB_OF.match(pool)
            if match and match.group("lb").lower() not in (lb.lower() for lb in lbs):
                lbs.append(match.group("lb"))
    seen = AzureSeen()
    resource_id = options.resource_id or ctx.compute_resource_id
    kind, scope = scope_of(resource_id) if resource_id else ("unknown", None)
    if kind == "scale_set":
        seen.scale_set_id = scope
    elif kind == "vm":
        seen.vm_id = scope
    elif resource_id:
        seen.errors.append(f"{resource_id!r} is neither a scale set (instance) nor a VM resource id")
    if not lbs and scope is None:
        ctx.azure = seen
        return Verdict(Status.SKIP, "nothing to read: no load balancer (azure-lb pools, --load-balancer) and no "
                       "scale set or VM id (IMDS compute.resourceId, --resource-id)")
    arm_url = options.arm_url or (action.arm_url if action is not None else DEFAULT_ARM_URL)
    # The token comes from where the agent gets it: the action's IMDS, else the agent's own.
    imds_url = action.imds_url if action is not None else ctx.settings.imds.url
    client_id = options.client_id or (action.client_id if action is not None else None)
    who = f"user-assigned identity {client_id}" if client_id else "the system-assigned identity"
    timeout = ctx.remaining(10.0)
    identity = ManagedIdentity(imds_url, client_id=client_id, timeout=timeout)
    client = ArmClient(arm_url, identity, api_version=NETWORK_API_VERSION, timeout=timeout)
    deadline = time.monotonic() + ctx.remaining(20.0)
    refused: list[int] = []
    try:
        def read(resource: str, api_version: str) -> dict[str, Any] | None:
            try:
                return client.get_resource(resource, deadline, api_version=api_version)
            except ArmRefused as exc:
                refused.append(exc.status)
                seen.errors.append(f"{_short(resource)}: {exc.status} {exc.code or 'error'}")
            except ArmError as exc:
                seen.errors.append(f"{_short(resource)}: {exc}")
            return None

        try:
            identity.token(deadline)
        except ArmError as exc:
            ctx.azure = seen
            return Verdict(Status.WARN, f"cannot read ARM: no token for {who}: {exc}",
                           "assign a managed identity to this VM (az vm identity assign / az vmss identity assign), "
                           "or set client_id of a user-assigned one; then give it Reader on the scale set (or VM) "
                           "and the load balancer", {"arm_url": arm_url, "error": str(exc)})
        for lb in lbs:
            body = read(lb, NETWORK_API_VERSION)
            if body is not None:
                seen.load_balancers[lb.lower()] = body
        if seen.scale_set_id:
            seen.scale_set = read(seen.scale_set_id, COMPUTE_API_VERSION)
            health = _health_probe_id(seen.scale_set)
            match = _LB_OF.match(health or "")
            if match and match.group("lb").lower() not in seen.load_balancers:
                body = read(match.group("lb"), NETWORK_API_VERSION)
                if body is not None:
                    seen.load_balancers[match.group("lb").lower()] = body
        if seen.vm_id:
            seen.vm = read(seen.vm_id, COMPUTE_API_VERSION)
            availability_set = _get(seen.vm, "properties", "availabilitySet", "id")
            if isinstance(availability_set, str) and availability_set:
                seen.availability_set_id = availability_set
                seen.availability_set = read(availability_set, COMPUTE_API_VERSION)
    finally:
        client.close()
        identity.close()
    ctx.azure = seen
    read_names = [f"load balancer {body.get('name') or _short(i)}" for i, body in seen.load_balancers.items()] + \
        [f"{what} {_short(i)}" for what, i, body in (("scale set", seen.scale_set_id, seen.scale_set),
                                                      ("VM", seen.vm_id, seen.vm),
                                                      ("availability set", seen.availability_set_id,
                                                       seen.availability_set)) if i and body]
    details = {"arm_url": arm_url, "identity": who, "read": read_names, "errors": seen.errors}
    if seen.errors:
        role = " (the role is missing: 403)" if 403 in refused else ""
        return Verdict(Status.WARN, f"with {who}, could not read {'; '.join(seen.errors)}{role}"
                       + (f"; read {', '.join(read_names)}" if read_names else ""),
                       "give this VM's identity Reader on the scale set (or VM) and on the load balancer: az role "
                       "assignment create --assignee-object-id PRINCIPAL_ID --role Reader --scope RESOURCE_ID",
                       details)
    return Verdict(Status.PASS, f"read {', '.join(read_names)} with {who}", details=details)


def _health_probe_id(scale_set: dict[str, Any] | None) -> str | None:
    profile = _get(scale_set, "properties", "virtualMachineProfile")
    probe = _get(profile, "networkProfile", "healthProbe", "id")
    return probe if isinstance(probe, str) else None


def _get(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _probes(seen: AzureSeen) -> list[LbProbe]:
    found = []
    for lb_id, body in seen.load_balancers.items():
        name = str(body.get("name") or _short(lb_id))
        for probe in _get(body, "properties", "probes") or []:
            props = probe.get("properties") if isinstance(probe, dict) else None
            if not isinstance(props, dict):
                continue
            threshold = props.get("probeThreshold") or props.get("numberOfProbes") or 1
            port = props.get("port")
            found.append(LbProbe(lb=name, name=str(probe.get("name")), protocol=str(props.get("protocol", "?")),
                                 port=port if isinstance(port, int) else None,
                                 interval=float(props.get("intervalInSeconds") or 15), threshold=int(threshold),
                                 request_path=props.get("requestPath"), ))
    return found


def _skip_unread(ctx: Context) -> Verdict | None:
    if ctx.azure is None:
        return Verdict(Status.SKIP, "not checked: ARM was not read (see the azure check)")
    return None


def check_probe(ctx: Context) -> Verdict:
    from coordinator.actions.connections import probe_wait_seconds

    skipped = _skip_unread(ctx)
    if skipped is not None:
        return skipped
    assert ctx.azure is not None
    if not ctx.azure.load_balancers:
        return Verdict(Status.SKIP, "not checked: no load balancer read (see the azure check)")
    drain = ctx.settings.drain
    action = _lb_action(ctx)
    if action is not None:
        wait = action.fallback_wait_seconds if action.fallback_wait_seconds is not None else \
            probe_wait_seconds(drain.probe_interval_seconds, drain.probe_threshold, drain.grace_seconds)
    else:
        waits = [drain.wait_for(t) for t in _AFTER_DRAIN
                 if ctx.settings.policy.approval.get(t, ApprovalRule.AFTER_DRAIN) is ApprovalRule.AFTER_DRAIN]
        wait = min(waits) if waits else drain.effective_wait
    port, path = _agent_probe(ctx)
    return lb_probe_verdict(probes=_probes(ctx.azure), port=port, path=path,
                            configured_interval=drain.probe_interval_seconds,
                            configured_threshold=drain.probe_threshold, probe_wait=wait, admin_state=action is not None)


def _scale_set_or_skip(ctx: Context, what: str) -> tuple[dict[str, Any] | None, Verdict | None]:
    skipped = _skip_unread(ctx)
    if skipped is not None:
        return None, skipped
    assert ctx.azure is not None
    if ctx.azure.scale_set is not None:
        return ctx.azure.scale_set, None
    if ctx.azure.scale_set_id is not None:
        return None, Verdict(Status.SKIP, "not checked: the scale set was not read (see the azure check)")
    return None, Verdict(Status.SKIP, f"not a scale set: {what} are a scale-set setting")


def check_repairs(ctx: Context) -> Verdict:
    scale_set, skipped = _scale_set_or_skip(ctx, "automatic repairs")
    if skipped is not None:
        return skipped
    assert scale_set is not None and ctx.azure is not None
    policy = _get(scale_set, "properties", "automaticRepairsPolicy") or {}
    port, path = _agent_probe(ctx)
    source: str | None = None
    drain_source = False
    unserved: str | None = None
    probe_id = _health_probe_id(scale_set)
    if probe_id is not None:
        probe_name = probe_id.rsplit("/", 1)[-1]
        probe = next((p for p in _probes(ctx.azure) if p.name.lower() == probe_name.lower()), None)
        source = f"load balancer probe {probe_name}"
        if probe is not None:
            source += f" ({probe.protocol} port {probe.port})"
            drain_source = probe.port == port
        else:
            source += " (not read)"
    for extension in _get(scale_set, "properties", "virtualMachineProfile", "extensionProfile", "extensions") or []:
        props = extension.get("properties") if isinstance(extension, dict) else None
        if not isinstance(props, dict) or str(props.get("type", "")).lower() not in _HEALTH_EXTENSIONS:
            continue
        settings = props.get("settings") if isinstance(props.get("settings"), dict) else {}
        assert isinstance(settings, dict)
        ext_port, ext_path = settings.get("port"), settings.get("requestPath") or "/"
        source = f"the Application Health extension ({settings.get('protocol', 'http')} port {ext_port} {ext_path})"
        drain_source = drain_source or (ext_port == port and ext_path == path)
        unserved = _unserved_health_path(ctx, ext_port, ext_path, (port, path))
    return repairs_verdict(enabled=bool(policy.get("enabled", False)), grace_period=policy.get("gracePeriod"),
                           repair_action=policy.get("repairAction"), health_source=source,
                           drain_probe_source=drain_source, unserved=unserved,
                           app_health=_app_health_endpoints(ctx))


def _app_health_ports(ctx: Context) -> set[int]:
    """The ports on which the agent answers its application health path: http.listen's, and
    app_health.listen's when set."""
    from coordinator.httpserver import split_host_port

    settings = ctx.settings
    ports = {split_host_port(settings.http.listen)[1]}
    if settings.app_health.listen is not None:
        ports.add(split_host_port(settings.app_health.listen)[1])
    return ports


def _app_health_endpoints(ctx: Context) -> str:
    """Where the agent answers as health for repairs, for a fix: ``port 9110 /apphealth``."""
    return " or ".join(f"port {p} {ctx.settings.app_health.path}" for p in sorted(_app_health_ports(ctx)))


def _unserved_health_path(ctx: Context, port: Any, path: str, probe: tuple[int, str]) -> str | None:
    """When the Application Health extension asks one of the agent's own ports (the probe's, ``probe``
    from ``_agent_probe``; the HTTP server's; the application health listener's) for a path the agent does
    not answer there as health, where the agent does answer (for the fix); None when it asks the right
    path or another program."""
    settings = ctx.settings
    probe_port, probe_path = probe
    app_ports = _app_health_ports(ctx)
    if port not in app_ports | {probe_port}:
        return None  # another program's endpoint: not the agent's to judge
    if port in app_ports and path == settings.app_health.path:
        return None
    if port == probe_port and path == probe_path:
        return None  # the drain probe: judged against the grace period
    return _app_health_endpoints(ctx)


def check_terminate(ctx: Context) -> Verdict:
    scale_set, skipped = _scale_set_or_skip(ctx, "terminate notifications")
    if skipped is not None:
        return skipped
    events = _get(scale_set, "properties", "virtualMachineProfile", "scheduledEventsProfile") or {}
    terminate = events.get("terminateNotificationProfile") if isinstance(events, dict) else None
    image = events.get("osImageNotificationProfile") if isinstance(events, dict) else None
    enabled = isinstance(terminate, dict) and terminate.get("enable", True) is not False
    os_image = None
    if isinstance(image, dict):
        os_image = f"on ({image.get('notBeforeTimeout', 'PT15M')})" if image.get("enable", True) is not False \
            else "off"
    settings = ctx.settings
    tick = settings.zookeeper.tick_seconds
    lapse = max(settings.zookeeper.session_timeout, ctx.granted or 0.0, 2 * tick) + tick
    return terminate_verdict(enabled=enabled,
                             not_before_timeout=terminate.get("notBeforeTimeout") if isinstance(terminate, dict)
                             else None,
                             drain_wait=settings.drain.wait_for("Terminate"), lapse=lapse, os_image=os_image)


def _compute(ctx: Context) -> tuple[str, dict[str, Any] | None, Verdict | None]:
    skipped = _skip_unread(ctx)
    if skipped is not None:
        return "", None, skipped
    seen = ctx.azure
    assert seen is not None
    if seen.scale_set is not None:
        return f"scale set {_short(seen.scale_set_id or '')}", seen.scale_set, None
    if seen.vm is not None:
        return f"VM {_short(seen.vm_id or '')}", seen.vm, None
    why = "was not read (see the azure check)" if seen.scale_set_id or seen.vm_id else \
        "is not known (no IMDS compute.resourceId, no --resource-id)"
    return "", None, Verdict(Status.SKIP, f"not checked: this VM's scale set or VM {why}")


def check_approve(ctx: Context) -> Verdict:
    name, body, skipped = _compute(ctx)
    if skipped is not None:
        return skipped
    assert ctx.azure is not None
    seen = ctx.azure
    # One policy for every VM of a set: a VM in an availability set is judged by the set's (and its own).
    policies = [_get(body, "properties", "scheduledEventsPolicy") or {}]
    if seen.scale_set is None and seen.availability_set is not None:
        policies.append(_get(seen.availability_set, "properties", "scheduledEventsPolicy") or {})
        name = f"{name} in availability set {_short(seen.availability_set_id or '')}"

    def setting(key: str) -> bool | None:
        values = [_get(policy, key, "automaticallyApprove") for policy in policies]
        return True if True in values else False if False in values else None

    if seen.scale_set is not None:
        command = f"az vmss update --ids {seen.scale_set_id}"
    elif seen.availability_set is not None:
        command = f"az vm availability-set update --ids {seen.availability_set_id}"
    else:
        command = f"az vm update --ids {seen.vm_id}"
    return auto_approve_verdict(reboot=setting("userInitiatedReboot") is True,
                                redeploy=setting("userInitiatedRedeploy") is True,
                                all_down=setting("allInstancesDown"), resource=name, command=command)


def check_spot(ctx: Context) -> Verdict:
    name, body, skipped = _compute(ctx)
    if skipped is not None:
        return skipped
    assert ctx.azure is not None
    priority = _get(body, "properties", "virtualMachineProfile", "priority") if ctx.azure.scale_set is not None \
        else _get(body, "properties", "priority")
    return spot_verdict(priority=priority if isinstance(priority, str) else None, resource=name)
