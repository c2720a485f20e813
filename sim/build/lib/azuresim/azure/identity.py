"""Managed identities, their roles and tokens: the IMDS token endpoint
(``GET /metadata/identity/oauth2/token``), the authorization of an identity's ARM requests, and the
permissions ARM lists for the caller (``.../providers/Microsoft.Authorization/permissions``)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from typing import Any

from azuresim.azure.answers import (
    ARM_RESOURCES,
    IDENTITY_API_VERSIONS,
    ROLES,
    ArmAnswer,
    arm_error,
    dropped_answer,
)
from azuresim.azure.faults import FaultsMixin
from azuresim.azure.records import Identity, Token
from azuresim.errors import InvalidRequest

__all__ = ["ROLE_ACTIONS", "IdentityMixin"]

#: The actions each role allows, as ``Microsoft.Authorization/permissions`` lists them (``none``: nothing).
ROLE_ACTIONS = {"network-contributor": ("Microsoft.Network/*", "Microsoft.Authorization/*/read"),
                "reader": ("*/read",),
                "scheduled-event-contributor": ("Microsoft.Maintenance/scheduledevents/*",)}


class IdentityMixin(FaultsMixin):
    """Identities, roles and tokens; part of ``AzureModel`` (the token endpoint serves the token faults)."""

    def add_identity(self, client_id: str, msi_res_id: str | None = None,
                     vms: Sequence[str] | None = None) -> dict[str, Any]:
        """A user-assigned identity, assigned to ``vms`` (None: every VM)."""
        if not client_id:
            raise InvalidRequest("client_id must be a non-empty string")
        with self._lock:
            assigned = None if vms is None else frozenset(self._vm(v) for v in vms)
            identity = Identity(client_id, client_id, msi_res_id, str(uuid.uuid4()), assigned)
            self._identities = [i for i in self._identities if i.client_id.lower() != client_id.lower()]
            self._identities.append(identity)
            return self._identity_view(identity)

    def set_role(self, principal: str, role: str | None = None, roles: Sequence[str] | None = None) -> dict[str, Any]:
        """``principal``: a VM name (its system identity) or a user-assigned identity's client id; ``role`` one
        role, or ``roles`` several (``["network-contributor", "reader"]``), replacing what it held."""
        given = ([role] if role is not None else []) + list(roles or [])
        if not given or any(r not in ROLES for r in given):
            raise InvalidRequest(f"role (or every one of roles) must be one of {', '.join(ROLES)}")
        with self._lock:
            if not any(i.principal.lower() == principal.lower() for i in self._identities):
                raise InvalidRequest(f"no identity {principal!r}")
            held = frozenset(given) - {"none"} if len(given) > 1 else frozenset(given)
            self._roles[principal.lower()] = held
            return {"principal": principal, "role": given[0] if len(given) == 1 else None, "roles": sorted(held)}

    def expire_tokens(self) -> int:
        """Every token issued so far expires now (ARM then answers 401 ExpiredAuthenticationToken)."""
        with self._lock:
            now = self._clock()
            for token in self._tokens.values():
                token.expires_at = min(token.expires_at, now - 1)
            return len(self._tokens)

    # -- IMDS: /metadata/identity/oauth2/token ---------------------------------------------------------

    def token(self, vm: str, method: str, query: dict[str, str], metadata_header: bool) -> ArmAnswer:
        """IMDS's answer to a token request from ``vm`` (the rate limit and the path are checked before)."""
        with self._lock:
            answer = self._token(vm, method, query, metadata_header)
            self._calls["token"] += 1
            self._statuses[f"token {'dropped' if answer.drop else answer.status}"] += 1
            return answer

    def _token(self, vm: str, method: str, query: dict[str, str], metadata_header: bool) -> ArmAnswer:
        if self._take_fault("token", "GET", ("unreachable",)) is not None:
            return dropped_answer()
        if not metadata_header:
            return ArmAnswer(400, {"error": "invalid_request",
                                   "error_description": "Required metadata header not specified"})
        if method != "GET":
            return ArmAnswer(405, {"error": "invalid_request", "error_description": "Method not allowed"},
                             {"Allow": "GET"})
        version = query.get("api-version")
        if version not in IDENTITY_API_VERSIONS:
            return ArmAnswer(400, {"error": "invalid_request",
                                   "error_description": "Invalid or missing api-version (supported: "
                                   + ", ".join(IDENTITY_API_VERSIONS) + ")"})
        resource = query.get("resource")
        if not resource:
            return ArmAnswer(400, {"error": "invalid_request",
                                   "error_description": "Required query variable 'resource' is missing"})
        if resource not in ARM_RESOURCES:
            return ArmAnswer(400, {"error": "invalid_resource",
                                   "error_description": f"AADSTS500011: The resource principal named {resource} "
                                   "was not found in the tenant (the simulator issues tokens for ARM only)"})
        fault = self._take_fault("token", "GET", ("status",))
        if fault is not None:
            return self._fault_answer(fault, token=True)
        client_id = query.get("client_id") or query.get("object_id")
        msi_res_id = query.get("msi_res_id") or query.get("mi_res_id")
        identity = self._find_identity(vm, client_id, msi_res_id)
        if identity is None:
            # What IMDS answers for an identity the VM does not have (the Azure SDKs read 400 so).
            return ArmAnswer(400, {"error": "invalid_request", "error_description": "Identity not found"})
        now = self._clock()
        expires_in = int(self.token_lifetime)
        access = "sim." + secrets.token_urlsafe(24)
        self._tokens[access] = Token(identity, now + self.token_lifetime)
        return ArmAnswer(200, {
            "access_token": access,
            "client_id": identity.client_id,
            "expires_in": str(expires_in),
            "expires_on": str(int(now + self.token_lifetime)),
            "ext_expires_in": str(expires_in),
            "not_before": str(int(now)),
            "resource": resource,
            "token_type": "Bearer",
        })

    def _find_identity(self, vm: str, client_id: str | None, msi_res_id: str | None) -> Identity | None:
        mine = [i for i in self._identities if i.vms is None or vm in i.vms]
        if client_id:
            return next((i for i in mine if i.client_id.lower() == client_id.lower()), None)
        if msi_res_id:
            return next((i for i in mine if (i.msi_res_id or "").lower() == msi_res_id.lower()), None)
        system = [i for i in mine if i.msi_res_id is None and i.principal == vm]
        if system:
            return system[0]
        # No system identity: IMDS uses the only user-assigned one, and refuses to choose among several.
        return mine[0] if len(mine) == 1 else None

    def _permissions(self, method: str, identity: Identity) -> ArmAnswer:
        """``PermissionGetResult`` (authorization-RoleDefinitionsCalls.json, 2022-04-01): one ``Permission`` per
        role the caller holds (its roles hold over every scope); no role is needed to list one's own."""
        if method != "GET":
            return arm_error(405, "MethodNotAllowed", f"Permissions are listed by GET, not {method}.")
        value = [{"actions": list(ROLE_ACTIONS[role]), "notActions": [], "dataActions": [], "notDataActions": []}
                 for role in sorted(self._held(identity)) if role in ROLE_ACTIONS]
        return ArmAnswer(200, {"value": value})

    def _held(self, identity: Identity) -> frozenset[str]:
        return self._roles.get(identity.principal.lower(), frozenset({"network-contributor"}))

    def _may(self, identity: Identity, action: str) -> bool:
        roles = self._held(identity)
        return ("reader" in roles and action.endswith("/read")) or \
            ("network-contributor" in roles and action.startswith("Microsoft.Network/")) or \
            ("scheduled-event-contributor" in roles and action.startswith("Microsoft.Maintenance/scheduledevents/"))

    @staticmethod
    def _forbidden(identity: Identity, action: str, scope: str) -> ArmAnswer:
        return arm_error(403, "AuthorizationFailed",
                          f"The client '{identity.object_id}' with object id '{identity.object_id}' does not have "
                          f"authorization to perform action '{action}' over scope '{scope}' or the scope is invalid. "
                          "If access was recently granted, please refresh your credentials.")

    @staticmethod
    def _identity_view(identity: Identity) -> dict[str, Any]:
        return {"principal": identity.principal, "client_id": identity.client_id, "msi_res_id": identity.msi_res_id,
                "object_id": identity.object_id, "vms": None if identity.vms is None else sorted(identity.vms)}
