"""The ``azure-lb`` check of ``coordinator doctor``: can the ``azure-lb`` action set this VM's admin state?

With each configured ``azure-lb`` action's own settings (its ``imds_url``, ``client_id``, ``arm_url`` and
``api_version``: what the agent uses), and the ARM client of the action (``coordinator.azure_arm``):

1. a token of the managed identity from IMDS;
2. ``GET`` of each backend address pool of ``backend_pools``, and whether ``backend_address`` is in it (by
   name or IP address, as the action looks for it);
3. the identity's own permissions on each load balancer of those pools, ``GET {lb}/providers/
   Microsoft.Authorization/permissions?api-version=2022-04-01`` (``Permissions_ListForResource``), and
   whether they grant ``Microsoft.Network/loadBalancers/backendAddressPools/write``.

Nothing is written. The verdict is ``coordinator.doctor.verdicts_admin_state.admin_state_verdict``. Skipped
when no ``azure-lb`` action is configured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

from coordinator.doctor.context import Context
from coordinator.doctor.outcome import Status, Verdict, worst
from coordinator.doctor.verdicts_admin_state import (
    PermissionsRead,
    PoolRead,
    admin_state_verdict,
    load_balancer_of,
)

if TYPE_CHECKING:
    from coordinator.azure_arm import ArmClient
    from coordinator.config import AzureLbActionConfig

__all__ = ["PERMISSIONS_API_VERSION", "check_admin_state"]

PERMISSIONS_API_VERSION = "2022-04-01"
_PERMISSIONS = "/providers/Microsoft.Authorization/permissions"
_MAX_PAGES = 10
# A pool that failed so: its load balancer's permissions are not asked (the failure already says it all).
_NOT_ASKED = ("unreachable", "forbidden", "token")


def check_admin_state(ctx: Context, transport: httpx.BaseTransport | None = None, *,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> Verdict:
    """The ``azure-lb`` check (``transport``, ``clock`` and ``sleep``: the network and the time, unless a test
    gives its own). One verdict for each ``azure-lb`` action; with several, the worst, their lines joined."""
    from coordinator.config import AzureLbActionConfig

    actions = [a for a in ctx.settings.actions if isinstance(a, AzureLbActionConfig)]
    if not actions:
        return Verdict(Status.SKIP, "not asked: no azure-lb action is configured")
    verdicts = [_check_action(ctx, action, transport, clock, sleep) for action in actions]
    if len(verdicts) == 1:
        return verdicts[0]
    status = worst(v.status for v in verdicts)
    fixes = list(dict.fromkeys(v.fix for v in verdicts if v.fix))
    return Verdict(status, "; ".join(v.summary for v in verdicts), "; ".join(fixes),
                   {"actions": [dict(v.details) for v in verdicts]})


def _check_action(ctx: Context, action: AzureLbActionConfig, transport: httpx.BaseTransport | None,
                  clock: Callable[[], float], sleep: Callable[[float], None]) -> Verdict:
    from coordinator.azure_arm import ArmClient, ArmError, ManagedIdentity

    who = f"user-assigned identity {action.client_id}" if action.client_id else "the system-assigned identity"
    timeout = ctx.remaining(min(action.timeout_seconds, 10.0))
    identity = ManagedIdentity(action.imds_url, client_id=action.client_id, timeout=timeout, clock=clock, sleep=sleep,
                               transport=transport)
    client = ArmClient(action.arm_url, identity, api_version=action.api_version, timeout=timeout, clock=clock,
                       sleep=sleep, transport=transport)
    deadline = clock() + ctx.remaining(20.0)
    token_error: str | None = None
    pools: list[PoolRead] = []
    permissions: list[PermissionsRead] = []
    try:
        try:
            identity.token(deadline)
        except ArmError as exc:
            token_error = str(exc)
        else:
            pools = [_read_pool(client, pool, action.backend_address, deadline) for pool in action.backend_pools]
            balancers: dict[str, str] = {}
            for pool in pools:
                balancers.setdefault(load_balancer_of(pool.pool_id).lower(), load_balancer_of(pool.pool_id))
            for key, lb_id in balancers.items():
                mine = [p for p in pools if load_balancer_of(p.pool_id).lower() == key]
                if not any(p.cause in _NOT_ASKED for p in mine):
                    permissions.append(_read_permissions(client, lb_id, deadline))
    finally:
        client.close()
        identity.close()
    return admin_state_verdict(action=action.name, who=who, imds_url=action.imds_url, arm_url=action.arm_url,
                               address=action.backend_address, token_error=token_error, pools=pools,
                               permissions=permissions)


def _read_pool(client: ArmClient, pool_id: str, address: str, deadline: float) -> PoolRead:
    from coordinator.azure_arm import ArmError, ArmRefused

    try:
        body = client.get_resource(pool_id, deadline)
    except ArmRefused as exc:
        return PoolRead(pool_id, error=f"{exc.status} {exc.code or 'error'}", status=exc.status, cause=exc.cause)
    except ArmError as exc:
        return PoolRead(pool_id, error=str(exc), cause=exc.cause)
    properties = body.get("properties")
    entries = properties.get("loadBalancerBackendAddresses") if isinstance(properties, dict) else None
    addresses: list[str] = []
    state: str | None = None
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        props = entry.get("properties") if isinstance(entry.get("properties"), dict) else {}
        assert isinstance(props, dict)
        name, ip = entry.get("name"), props.get("ipAddress")
        addresses.append(f"{name} ({ip})" if ip else str(name))
        if name == address or ip == address:
            state = str(props.get("adminState") or "None")
    return PoolRead(pool_id, addresses=tuple(addresses), admin_state=state)


def _read_permissions(client: ArmClient, lb_id: str, deadline: float) -> PermissionsRead:
    """The identity's permissions on ``lb_id``, every page (``nextLink``, on ARM's own host only)."""
    from coordinator.azure_arm import ArmError, error_excerpt

    url: str | None = client.base_url + lb_id + _PERMISSIONS
    params: dict[str, str] | None = {"api-version": PERMISSIONS_API_VERSION}
    entries: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    origin = _origin(client.base_url)
    pages = 0
    while url is not None and pages < _MAX_PAGES:
        pages += 1
        try:
            response = client.request("GET", url, params=params, deadline=deadline)
        except ArmError as exc:
            return PermissionsRead(lb_id, error=str(exc))
        if response.status_code != 200:
            return PermissionsRead(lb_id, error=f"{response.status_code} {error_excerpt(response)}")
        try:
            body = response.json()
        except ValueError:
            return PermissionsRead(lb_id, error="the answer is not JSON")
        values = body.get("value") if isinstance(body, dict) else None
        if not isinstance(values, list):
            return PermissionsRead(lb_id, error="the answer has no value list")
        entries.extend((_strings(v, "actions"), _strings(v, "notActions")) for v in values if isinstance(v, dict))
        link = body.get("nextLink")
        url, params = (link, None) if isinstance(link, str) and link and _origin(link) == origin else (None, None)
    seen = tuple(dict.fromkeys(a for actions, _ in entries for a in actions))
    return PermissionsRead(lb_id, permissions=tuple(entries), actions_seen=seen)


def _strings(value: dict[str, Any], key: str) -> tuple[str, ...]:
    items = value.get(key)
    return tuple(i for i in items if isinstance(i, str)) if isinstance(items, list) else ()


def _origin(url: str) -> tuple[str, str]:
    split = urlsplit(url)
    return split.scheme, split.netloc.lower()
