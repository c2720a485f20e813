"""The verdict of ``coordinator doctor``'s ``azure-lb`` check, from what the check read with the action's own
identity: whether a token came, each configured backend address pool as ARM answered it, and the
identity's own permissions on each load balancer. Pure functions, no I/O.

The permissions are those of ``Permissions_ListForResource`` (Azure/azure-rest-api-specs,
``specification/authorization/resource-manager/Microsoft.Authorization/stable/2022-04-01/authorization-
Permissions.json``): one ``{"actions", "notActions"}`` per role the identity holds there. An action is
granted when one of them lists it in ``actions`` (``*`` matching any run of characters, case ignored, as
ARM matches) and not in that same entry's ``notActions``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.doctor.outcome import Status, Verdict, worst

__all__ = ["POOL_WRITE", "PermissionsRead", "PoolRead", "admin_state_verdict", "granted", "load_balancer_of"]

#: What the ``azure-lb`` action writes (read-modify-write of the whole pool).
POOL_WRITE = "Microsoft.Network/loadBalancers/backendAddressPools/write"
_LB = re.compile(r"^(/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/loadBalancers/[^/]+)",
                 re.IGNORECASE)
_UNREACHABLE = ("unreachable",)
_REFUSED = (401, 403)


def load_balancer_of(pool_id: str) -> str:
    """The load balancer resource id of a backend address pool id (the pool id itself when it is not one)."""
    match = _LB.match(pool_id)
    return match.group(1) if match else pool_id


def _pattern(action: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in action.split("*")), re.IGNORECASE)


def _matches(patterns: Iterable[object], action: str) -> bool:
    return any(isinstance(p, str) and _pattern(p).fullmatch(action) is not None for p in patterns)


def granted(permissions: Iterable[tuple[Sequence[str], Sequence[str]]], action: str) -> bool:
    """Whether ``action`` is granted by one of ``permissions`` (``(actions, notActions)`` each): listed, by
    name or wildcard, in its actions and not in its own notActions."""
    return any(_matches(actions, action) and not _matches(not_actions, action) for actions, not_actions in permissions)


@dataclass(frozen=True)
class PoolRead:
    """One configured pool as ARM answered it. Read: ``error`` is None, ``addresses`` lists its backend
    addresses (name, and IP address when it has one) and ``admin_state`` this VM's (None: not in the pool).
    Not read: ``error`` says why, ``status`` is ARM's refusal (None when ARM did not answer), ``cause`` the
    ``ArmError``'s."""

    pool_id: str
    error: str | None = None
    status: int | None = None
    cause: str | None = None
    addresses: tuple[str, ...] = ()
    admin_state: str | None = None

    @property
    def short(self) -> str:
        parts = self.pool_id.strip("/").split("/")
        return f"{parts[7]}/{parts[9]}" if len(parts) >= 10 else self.pool_id


@dataclass(frozen=True)
class PermissionsRead:
    """The identity's permissions on one load balancer: ``(actions, notActions)`` per entry, or why they
    could not be read (``error``; ``permissions`` is then None)."""

    lb_id: str
    permissions: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] | None = None
    error: str | None = None
    actions_seen: tuple[str, ...] = ()  # every action the entries grant, for the summary

    @property
    def write(self) -> bool | None:
        return None if self.permissions is None else granted(self.permissions, POOL_WRITE)


def _role_fix(lb_id: str) -> str:
    return (f"give it Network Contributor on the load balancer {lb_id}: az role assignment create "
            "--assignee-object-id PRINCIPAL_ID --assignee-principal-type ServicePrincipal --role "
            f"\"Network Contributor\" --scope {lb_id} (PRINCIPAL_ID: the principalId az vm identity show, or az vmss "
            "identity show, gives)")


def admin_state_verdict(*, action: str, who: str, imds_url: str, arm_url: str, address: str,
                        token_error: str | None, pools: Sequence[PoolRead],
                        permissions: Sequence[PermissionsRead]) -> Verdict:
    """Whether the ``azure-lb`` action named ``action`` can set ``address`` in its pools with ``who`` (the
    identity, as a phrase): FAIL when no token (naming the identity and IMDS), ARM unreachable (naming
    ``arm_url``), a pool refused (403: the role, with the command that assigns it), not found (404), without
    the address (listing those it has), or ``POOL_WRITE`` not granted on a load balancer; WARN when a pool
    could not be read for another reason (throttled, 5xx: run again) or the permissions could not be read
    (the write right not verified); PASS otherwise."""
    details: dict[str, Any] = {
        "action": action, "identity": who, "imds_url": imds_url, "arm_url": arm_url, "address": address,
        "token_error": token_error,
        "pools": [{"id": p.pool_id, "read": p.error is None, "error": p.error, "status": p.status, "cause": p.cause,
                   "addresses": list(p.addresses), "admin_state": p.admin_state} for p in pools],
        "permissions": [{"load_balancer": p.lb_id, "write": p.write, "error": p.error} for p in permissions],
    }
    if token_error is not None:
        return Verdict(Status.FAIL, f"{action}: no token for {who} from IMDS at {imds_url}: {token_error}",
                       "assign a managed identity to this VM (az vm identity assign, or az vmss identity assign for "
                       "a scale set), or set the action's client_id to a user-assigned identity this VM has; then "
                       "give it Network Contributor on the load balancer", details)
    problems: list[tuple[Status, str, str]] = []
    unreachable = [p for p in pools if p.cause in _UNREACHABLE]
    if unreachable:
        problems.append((Status.FAIL, f"ARM at {arm_url} cannot be reached from this VM ({unreachable[0].error})",
                         f"open outbound HTTPS from this VM to {arm_url} (network security group rules, firewall or "
                         "route table: service tag AzureResourceManager; HTTPS_PROXY and NO_PROXY in the agent's "
                         "environment), or correct the action's arm_url"))
    for pool in pools:
        if pool.error is None or pool in unreachable:
            continue
        lb_id = load_balancer_of(pool.pool_id)
        if pool.status in _REFUSED:
            problems.append((Status.FAIL, f"{who} may not read pool {pool.short} ({pool.error}): the identity lacks "
                             "a role that may read/write the pool", _role_fix(lb_id)))
        elif pool.status == 404:
            problems.append((Status.FAIL, f"pool {pool.short} not found ({pool.error})",
                             f"check the action's backend_pools against the pools there: {_pool_list(lb_id)}"))
        else:
            problems.append((Status.WARN, f"could not read pool {pool.short}: {pool.error}",
                             "run coordinator doctor again; if it lasts, see the runbook's \"Admin state failing\""))
    for pool in pools:
        if pool.error is None and pool.admin_state is None:
            listed = ", ".join(pool.addresses) or "none"
            problems.append((Status.FAIL, f"backend address {address} is not in pool {pool.short} (its addresses: "
                             f"{listed})", "set the action's backend_address to this VM's address in the pool (its "
                             "name or IP address), or add this VM to the pool"))
    for perm in permissions:
        if perm.write is False:
            problems.append((Status.FAIL, f"{who} may not write the pools of load balancer {_name(perm.lb_id)}: "
                             f"{POOL_WRITE} is not granted there (granted: {_listed(perm.actions_seen)})",
                             _role_fix(perm.lb_id)))
        elif perm.write is None:
            problems.append((Status.WARN, f"whether {who} may write the pools of load balancer {_name(perm.lb_id)} "
                             f"was not verified: its permissions could not be read ({perm.error})",
                             "give the identity Microsoft.Authorization/permissions/read on the load balancer "
                             "(Network Contributor includes it), or check its role assignments there by hand"))
    if problems:
        status = worst(p[0] for p in problems)
        fixes = list(dict.fromkeys(p[2] for p in problems))
        return Verdict(status, f"{action}: " + "; ".join(p[1] for p in problems), "; ".join(fixes), details)
    states = ", ".join(f"{p.short} (admin state {p.admin_state})" for p in pools)
    return Verdict(Status.PASS, f"{action}: {who} got a token, read {address} in pool(s) {states}, and may write them "
                   f"({POOL_WRITE} granted)", details=details)


def _pool_list(lb_id: str) -> str:
    parts = lb_id.strip("/").split("/")
    if len(parts) >= 8:
        return f"az network lb address-pool list -g {parts[3]} --lb-name {parts[7]} -o table"
    return f"the load balancer {lb_id}"


def _name(lb_id: str) -> str:
    return lb_id.rstrip("/").rsplit("/", 1)[-1]


def _listed(actions: Sequence[str]) -> str:
    if not actions:
        return "nothing"
    shown = ", ".join(actions[:5])
    return shown + (f" and {len(actions) - 5} more" if len(actions) > 5 else "")
