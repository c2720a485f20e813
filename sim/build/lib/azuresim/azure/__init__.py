"""The Azure side a VM's agent reaches besides Scheduled Events: managed-identity tokens from IMDS, and
Azure Resource Manager (ARM) load balancer backend address pools. A small, honest model (see
``docs/simulator.md``, "Managed identity and ARM"):

* **Identities.** Every VM of the group has a system-assigned identity (unless disabled); user-assigned
  identities (a ``client_id`` and an ``msi_res_id``) are added through the control API and assigned to some
  or all VMs. ``token(vm, client_id, msi_res_id, resource)`` answers what
  ``GET /metadata/identity/oauth2/token`` answers: an opaque access token for ``https://management.azure.com/``
  with ``expires_in``/``expires_on`` as strings, as IMDS sends them. Tokens last ``token_lifetime`` real
  seconds.
* **Roles.** Each identity (its principal: ``vm0`` for vm0's system identity, the client id for a
  user-assigned one) holds roles over every resource: ``network-contributor`` (read and write of
  ``Microsoft.Network`` resources, nothing of ``Microsoft.Compute``; the default), ``reader`` (read of
  everything) or ``none``; ``network-contributor`` and ``reader`` together read everything and write pools.
* **Backend address pools**, by resource id, with their ``loadBalancerBackendAddresses`` (name, IP address,
  ``adminState``), an ``etag`` that changes on every write and a ``provisioningState``. A PUT replaces the
  addresses (read-only fields sent back are ignored), is checked against ``If-Match``, and completes
  asynchronously: the answer carries ``Azure-AsyncOperation``, whose status reads ``InProgress`` until
  ``async_seconds`` have passed since the PUT, then ``Succeeded`` (unless a fault says otherwise). The
  pool's new content is what GET answers from the PUT on (``provisioningState`` ``Updating`` until the
  operation succeeds); its *effective* admin states, the data plane, change only when the operation
  succeeds.
* **Load balancers, scale sets and VMs, read only** (what ``coordinator doctor`` reads): a load balancer
  with its health probes (``LoadBalancer`` and ``Probe`` of loadBalancer.json, its ``backendAddressPools``
  the pools above under its id), a virtual machine scale set (``VirtualMachineScaleSet`` of
  virtualMachineScaleSet.json: ``automaticRepairsPolicy``, ``scheduledEventsPolicy``,
  ``virtualMachineProfile.priority``, ``.scheduledEventsProfile``, ``.networkProfile.healthProbe`` and an
  Application Health extension) and a virtual machine (``priority``, ``scheduledEventsPolicy``), created
  through the control API and served by GET.
* **The data plane**: an address's *effective* admin state changes when the operation that set it is due
  (``tick()``, called by the simulator server's ARM ticker, settles due operations on time even when no
  client asks), or at once for a control-API write. Every change is handed to ``on_effective`` (an
  ``EffectiveChange``), outside the model's lock, one at a time and in the order the changes happened:
  what a load balancer's data plane would apply (``azuresim.lb_haproxy`` applies it to HAProxy).
* **Permissions**: ``GET {scope}/providers/Microsoft.Authorization/permissions`` (a resource group, or a
  resource in it) lists the caller's own permissions from its roles (``Permission`` of
  authorization-RoleDefinitionsCalls.json).
* **Faults** (``add_fault``, each for the next ``count`` requests): status answers (429 with
  ``Retry-After``, 500...) on the token endpoint or on ARM; ``unreachable`` (the connection closed without
  an answer); ``concurrent_write``: another writer changes the pool just before the next PUT, whose
  ``If-Match`` then fails with 412; and ARM at its worst, for PUTs that are applied: ``lost_answer`` (no
  answer, or one after ``delay_seconds``), ``status_after_apply`` (500, 502, 503, 504), ``slow_operation``
  (the operation takes ``seconds``) and ``operation_end`` (it ends ``Failed`` or ``Canceled``: nothing
  changes in the data plane, the pool is ``Failed``).
* **Settings** (``configure``): ``conflict_while_updating`` (a PUT while an operation of the pool's load
  balancer is in progress is 409 ``AnotherOperationInProgress``), ``async_seconds``, ``retry_after``; and
  **throttling** (``set_throttling``): ARM's token buckets per subscription, reads and writes apart, off
  by default.

Time is real (wall clock) seconds: tokens expire, and operations complete, in the client's time.

Layout: ``answers`` (answers, errors, api-versions and resource ids), ``records`` (pools, operations,
resources, identities, tokens, faults, throttling's buckets, and the state the model's parts share),
``faults``, ``throttle`` (ARM's token buckets), ``identity`` (identities, roles, permissions and the token
endpoint), ``pools`` (pools, operations and the data plane), ``resources`` (load balancers, scale sets and
VMs) and ``model`` (``AzureModel``, ARM's entry point).
"""

from __future__ import annotations

from azuresim.azure.answers import (
    ADMIN_STATES,
    ARM_API_VERSIONS,
    ARM_RESOURCES,
    AUTHORIZATION_API_VERSIONS,
    COMPUTE_API_VERSIONS,
    IDENTITY_API_VERSIONS,
    LB_ID,
    POOL_ID,
    PRIORITIES,
    PROBE_PROTOCOLS,
    REPAIR_ACTIONS,
    ROLES,
    SCALE_SET_ID,
    VM_ID,
    ArmAnswer,
    EffectiveChange,
)
from azuresim.azure.answers import arm_error as arm_error
from azuresim.azure.answers import new_etag as new_etag
from azuresim.azure.answers import resource_kind_of as resource_kind_of
from azuresim.azure.faults import FAULT_KINDS, OPERATION_ENDS
from azuresim.azure.identity import ROLE_ACTIONS
from azuresim.azure.model import AzureModel

__all__ = [
    "ADMIN_STATES",
    "ARM_API_VERSIONS",
    "ARM_RESOURCES",
    "AUTHORIZATION_API_VERSIONS",
    "COMPUTE_API_VERSIONS",
    "FAULT_KINDS",
    "IDENTITY_API_VERSIONS",
    "LB_ID",
    "OPERATION_ENDS",
    "POOL_ID",
    "PRIORITIES",
    "PROBE_PROTOCOLS",
    "REPAIR_ACTIONS",
    "ROLES",
    "ROLE_ACTIONS",
    "SCALE_SET_ID",
    "VM_ID",
    "ArmAnswer",
    "AzureModel",
    "EffectiveChange",
]
