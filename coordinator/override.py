"""``coordinator approve EVENT_ID --reason TEXT``: an operator vouches for the VMs an event names that run no
agent (a VM outside the product, a dead agent), so that the event is approved early all the same.

The group never approves such an event early: its approver would wait for an acknowledgement that no agent
will write, its VMs drain just in time, and it starts at NotBefore. The command:

1. reads the group as an agent does and refuses, in one line, unless the event has an open record, some VM
   it names runs no agent, approvals are not paused, the maintenance windows of the
   configuration allow it now, and its rule allows an early approval;
2. writes the operator's word into the record (``Store.vouch``: who, when, why, for which VMs). From then on
   the group treats the event as it treats one whose missing VMs are absent past the grace: the leader
   admits it through the budget, the VMs with an agent drain and acknowledge, and their approver approves
   it through its gate and its fenced POST, marking the VMs vouched for that ever ran an agent out of
   rotation first. The approval names them, the operator and the reason (``status``, ``--history``);
3. when no VM the event names runs an agent, nobody in the group may be able to send it (its VMs' IMDS
   shows it to them, and maybe to no agent): the command then records the approval through the store's
   gate itself (``Store.approve_vouched``) and sends it through this VM's IMDS (``StartRequests``, when its
   document shows the event), fenced as an agent's POST is (``snapshot.approval_fence``: half a session
   timeout since the gate, the connection, the pause read again, the windows, before each attempt), or
   through the Maintenance resource provider's ``acknowledge`` API from outside the group (``--via
   maintenance --resource ID``, a managed identity's or the Azure CLI's token).

It needs an agent's identity in ZooKeeper (``--config`` of an agent): operators may not write records.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.config import ApprovalRule
from coordinator.errors import ImdsError, StoreError
from coordinator.models import EventType
from coordinator.names import normalize_event_id
from coordinator.snapshot import Policy, approval_fence, pause_holds, rule_for, window_holds
from coordinator.store.base import ApprovalOutcome, ClusterView, EventRecord, Pause, Store, WriteResult

if TYPE_CHECKING:
    from coordinator.config import Settings
    from coordinator.imds import ImdsClient
    from coordinator.models import ScheduledEvent

__all__ = ["MAINTENANCE_API_VERSION", "OverrideRefused", "Vouching", "acknowledge_via_maintenance", "approve_by_hand",
           "command", "post_via_imds", "vouching"]

log = logging.getLogger(__name__)

MAINTENANCE_API_VERSION = "2025-11-01"  # Microsoft.Maintenance, stable: scheduledevents/{id}/acknowledge


class OverrideRefused(Exception):
    """The approval is refused, or could not be sent; the message says why, in one line."""


@dataclass(frozen=True)
class Vouching:
    """What an operator's approval of ``record`` stands on: the acks of ``required``, and the operator's word
    for ``vouched`` (the VMs it names that run no agent)."""

    record: EventRecord
    required: tuple[str, ...]
    vouched: tuple[str, ...]
    # An operator's approval recorded before, whose POST did not go through: its record may have been marked
    # done since (the leader closes an approved record that names no VM with an agent); it is sent again.
    resend: bool = False


def vouching(view: ClusterView, event_id: str, policy: Policy, now: float,
             event: ScheduledEvent | None = None) -> Vouching:
    """Whether the operator may vouch for the VMs of ``event_id`` that run no agent, on the group's ``view``
    now, and for which; raises ``OverrideRefused`` saying why not. ``event``: as a document shows it, for its
    rule (the record's type alone says it is known)."""
    key = normalize_event_id(event_id)
    record = view.records.get(key)
    if record is None:
        raise OverrideRefused(f"event {key} has no record in the group: the VMs that see it publish it (is it "
                              "this group's, and is it still in IMDS?)")
    if record.done_at is not None:
        before = record.closed.approval if record.closed is not None else None
        if before is not None and before.vouched and not any(vm in view.members for vm in record.resources):
            return Vouching(record, (), tuple(before.vouched), resend=True)
        raise OverrideRefused(f"event {key} is over: its record was marked done")
    vouched = tuple(sorted(vm for vm in record.resources if vm not in view.members))
    required = tuple(sorted(vm for vm in record.resources if vm in view.members))
    if not vouched:
        raise OverrideRefused(f"every VM event {key} names runs an agent: the group approves it itself once they "
                              "acknowledge (coordinator status says what holds it)")
    paused = pause_holds(view.paused)
    if paused is not None:
        raise OverrideRefused(f"{paused} (coordinator resume lifts it)")
    closed = window_holds(policy, now)
    if closed is not None:
        raise OverrideRefused(f"{closed} of the configuration (policy.maintenance_windows)")
    never = (rule_for(event, policy) if event is not None else policy.approval.get(record.event_type)) \
        is ApprovalRule.NEVER
    if never or record.event_type not in {t.value for t in EventType}:
        raise OverrideRefused(f"the policy never approves a {record.event_type} early (policy.approval)")
    return Vouching(record, required, vouched)


def approve_by_hand(store: Store, vouch: Vouching, *, by: str, reason: str, now: float) -> None:
    """Record the operator's approval through the store's gate; raises ``OverrideRefused`` if it refuses."""
    try:
        result = store.approve_vouched(vouch.record.event_id, by, vouch.required, vouch.vouched, reason=reason, at=now)
    except StoreError as exc:
        raise OverrideRefused(f"the approval could not be recorded: {exc}") from None
    if result.outcome is not ApprovalOutcome.APPROVED:
        raise OverrideRefused(f"the gate refused it: {result.reason}")


def post_via_imds(imds: ImdsClient, event_id: str, fence: Callable[[], str]) -> None:
    """POST the approval through this VM's IMDS, ``fence`` asked before every attempt (its words: why not)."""
    from coordinator.errors import ImdsFenced

    why: list[str] = []

    def allowed() -> bool:
        why[:] = [fence()]
        return not why[0]

    try:
        imds.approve([event_id], fence=allowed)
    except ImdsFenced:
        raise OverrideRefused(f"recorded, not sent: {why[0] if why else 'fenced'}; the event starts at NotBefore, "
                              "or run the command again") from None
    except ImdsError as exc:
        raise OverrideRefused(f"recorded, but IMDS did not take it: {exc}; run the command again") from None


def acknowledge_via_maintenance(request: Callable[[str, str], tuple[int, str]], arm_url: str, resource_id: str,
                                event_id: str) -> str:
    """POST ``acknowledge`` of ``event_id`` on ``resource_id`` (a VM, scale set or availability set) to the
    Maintenance resource provider; ``request(method, url)`` sends it with a token and answers (status, body).
    Returns ARM's answer (``Successfully Approved``); raises ``OverrideRefused`` with ARM's error."""
    url = (f"{arm_url.rstrip('/')}{resource_id}/providers/Microsoft.Maintenance/scheduledevents/{event_id}/acknowledge"
           f"?api-version={MAINTENANCE_API_VERSION}")
    status, body = request("POST", url)
    try:
        answer = json.loads(body) if body else {}
    except ValueError:
        answer = {}
    if status == 200:
        value = answer.get("value") if isinstance(answer, dict) else None
        return str(value) if value else "acknowledged"
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    code = error.get("code", "") if isinstance(error, dict) else ""
    message = error.get("message", body[:200]) if isinstance(error, dict) else body[:200]
    hint = " (the identity needs the Scheduled Event Contributor role on it)" if status == 403 else ""
    raise OverrideRefused(f"recorded, but the Maintenance API answered {status} {code}: {message}{hint}; the event "
                          "starts at NotBefore, or run the command again")


def command(args: argparse.Namespace) -> int:
    """``coordinator approve``: exit 0 once the approval is recorded and sent, 1 if refused or not sent, 2 for
    a bad command line or configuration."""
    from coordinator.control import operator_name
    from coordinator.errors import ConfigError
    from coordinator.groupstatus.options import group_settings
    from coordinator.runtime import policy_from

    try:
        settings = group_settings(args, "approve")
    except ConfigError as exc:
        print(f"coordinator: {exc}", file=sys.stderr)
        return 2
    if not args.reason.strip():
        print("coordinator: approve: --reason must say why the VMs vouched for may be hit", file=sys.stderr)
        return 2
    if args.via == "maintenance" and not args.resource:
        print("coordinator: approve: --via maintenance needs --resource ID (the VM, scale set or availability set "
              "the event is of)", file=sys.stderr)
        return 2
    try:
        _approve(args, settings, policy_from(settings), operator_name())
    except OverrideRefused as exc:
        print(f"coordinator: approve: {exc}", file=sys.stderr)
        return 1
    return 0


def _approve(args: argparse.Namespace, settings: Settings, policy: Policy, by: str) -> None:
    from coordinator.imds import ImdsClient
    from coordinator.store.zookeeper import ZooKeeperStore

    zk = settings.zookeeper.client_options()
    store = ZooKeeperStore(zk.hosts, settings.zookeeper.root, settings.cluster, session_timeout=zk.session_timeout,
                           operation_timeout=settings.zookeeper.operation_timeout, auth_data=zk.auth_data, tls=zk.tls,
                           create_layout=False)
    imds = ImdsClient(settings.imds.url, api_version=settings.imds.api_version,
                      request_timeout=settings.imds.request_timeout, max_attempts=2) if args.via == "imds" else None
    try:
        try:
            store.start()
            view = store.read_view(settings.vm_name or "operator")
        except StoreError as exc:
            raise OverrideRefused(f"cannot read the group: {exc}") from None
        vouch = vouching(view, args.event_id, policy, time.time())
        reason = args.reason.strip()
        if vouch.resend:
            print(f"event {vouch.record.event_id}: approved by hand before; the approval is sent again", flush=True)
            _send(args, settings, policy, store, imds, vouch, by, time.monotonic())
            return
        try:
            written = store.vouch(vouch.record.event_id, vouch.vouched, by=by, reason=reason, at=time.time())
        except StoreError as exc:
            raise OverrideRefused(f"the word could not be recorded: {exc}") from None
        if written is WriteResult.MISSING:
            raise OverrideRefused(f"event {vouch.record.event_id} is over: its record is gone or marked done")
        key = vouch.record.event_id
        print(f"event {key} ({vouch.record.event_type} of {', '.join(vouch.record.resources)}): {by} vouches for "
              f"{', '.join(vouch.vouched)} (no agent): {reason}"
              + ("" if written is WriteResult.DONE else " (a word was given before: the first is kept)"), flush=True)
        log.warning("event %s: %s vouches for %s: %s", key, by, ", ".join(vouch.vouched), reason)
        if vouch.required and vouch.record.approval is not None:
            print(f"approved already, by {vouch.record.approval.by}: nothing more to do")
            return
        if vouch.required:
            print(f"the group approves it once {', '.join(vouch.required)} "
                  f"{'has' if len(vouch.required) == 1 else 'have'} drained and acknowledged: through its budget, "
                  f"by its own approver (coordinator status --config {args.config} shows it)")
            return
        # No VM it names runs an agent: approve it here, through the gate (found there if recorded before: a
        # POST that did not go through is sent again), and send it.
        checked = time.monotonic()
        # Refused before anything is recorded if this VM cannot send it.
        event = _in_document(imds, key) if imds is not None else None
        approve_by_hand(store, vouch, by=by, reason=reason, now=time.time())
        _send(args, settings, policy, store, imds, vouch, by, checked, event)
    finally:
        store.stop()
        if imds is not None:
            imds.close()


def _send(args: argparse.Namespace, settings: Settings, policy: Policy, store: Store, imds: ImdsClient | None,
          vouch: Vouching, by: str, checked: float, event: ScheduledEvent | None = None) -> None:
    """Send the recorded approval: through this VM's IMDS (``event`` as its document showed it, read now when
    not given), or the Maintenance API; fenced as an agent's POST (``snapshot.approval_fence``) before every
    attempt through IMDS, and once before the Maintenance API's (a resent approval: its checks are not new)."""
    def fence(since: float) -> str:
        try:
            paused: Pause | str | None = store.read_pause()
        except StoreError as exc:
            paused = str(exc)
        return approval_fence(policy, mono=time.monotonic(), now=time.time(), checked_at=since,
                              granted=store.granted_session_timeout, connection=store.connection_state,
                              paused=paused, peers_confirmed_at=None)

    if imds is not None:
        shown = event if event is not None else _in_document(imds, vouch.record.event_id)
        post_via_imds(imds, shown.event_id, lambda: fence(checked))
        print(f"approved through this VM's IMDS: Azure starts it within seconds (recorded as approved by {by})")
        return
    refused = fence(time.monotonic())
    if refused:
        raise OverrideRefused(f"recorded, not sent: {refused}")
    answer = _maintenance(args, settings, vouch.record.event_id)
    print(f"approved through the Maintenance API on {args.resource}: {answer}")


def _in_document(imds: ImdsClient, event_id: str) -> ScheduledEvent:
    """The event as this VM's IMDS document shows it (its id as IMDS spells it: it is sent back as is)."""
    try:
        document = imds.get_document()
    except (ImdsError, ValueError) as exc:
        raise OverrideRefused(f"cannot read this VM's IMDS document: {exc}") from None
    key = normalize_event_id(event_id)
    event = next((e for e in document.events if e.event_id.upper() == key), None)
    if event is None:
        raise OverrideRefused(f"this VM's IMDS document does not show event {key} (another delivery unit, or "
                              "delivery to the VMs it names only): run it on a VM that sees it, or with --via "
                              "maintenance --resource ID")
    if not event.is_scheduled:
        raise OverrideRefused(f"event {key} is {event.event_status} already: nothing to approve")
    return event


def _maintenance(args: argparse.Namespace, settings: Settings, event_id: str) -> str:
    """The Maintenance API's ``acknowledge``, with a managed identity (this VM's IMDS) or an Azure CLI token."""
    import httpx

    from coordinator.azure_arm import ArmError, ManagedIdentity
    from coordinator.azure_graph import CliToken, GraphError

    if args.auth == "cli":
        try:
            token = CliToken().token(time.monotonic() + 60.0)
        except GraphError as exc:
            raise OverrideRefused(str(exc)) from None
    else:
        identity = ManagedIdentity(settings.imds.url, timeout=10.0)
        try:
            token = identity.token(time.monotonic() + 20.0)
        except ArmError as exc:
            raise OverrideRefused(f"no managed-identity token: {exc} (or use --auth cli)") from None
        finally:
            identity.close()

    def request(method: str, url: str) -> tuple[int, str]:
        try:
            response = httpx.request(method, url, headers={"Authorization": f"Bearer {token}"}, json={},
                                     timeout=20.0, trust_env=False)
        except httpx.HTTPError as exc:
            raise OverrideRefused(f"recorded, but the Maintenance API is unreachable: {exc}; run the command "
                                  "again") from None
        return response.status_code, response.text

    return acknowledge_via_maintenance(request, args.arm_url, args.resource, event_id)
