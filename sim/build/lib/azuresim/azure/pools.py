"""Backend address pools: their control (create, another writer's write), ARM's GET and asynchronous PUT
(with the faults that hit an applied PUT, and 409 ``AnotherOperationInProgress``), the operations a PUT
starts (ending Succeeded, Failed or Canceled), and the data plane (effective admin states handed to
``on_effective``)."""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from azuresim.azure.answers import ADMIN_STATES, POOL_ID, ArmAnswer, EffectiveChange, arm_error, new_etag
from azuresim.azure.faults import FaultsMixin
from azuresim.azure.records import Address, Operation, Pool
from azuresim.errors import InvalidRequest

__all__ = ["PoolsMixin"]

# One logger for the whole Azure model.
log = logging.getLogger("azuresim.azure")


# What an operation that did not succeed answers in its ``error`` (the operation status's CloudError shape).
_ENDS = {"Failed": ("InternalServerError", "The operation on the backend address pool failed (simulated)."),
         "Canceled": ("Canceled", "Operation was canceled.")}


class PoolsMixin(FaultsMixin):
    """Pools, operations and the data plane; part of ``AzureModel`` (an applied PUT takes its faults)."""

    def add_pool(
        self, pool_id: str, addresses: Sequence[dict[str, Any]], location: str = "westeurope"
    ) -> dict[str, Any]:
        if not POOL_ID.match(pool_id):
            raise InvalidRequest("id must be a backend address pool resource id: /subscriptions/{sub}/resourceGroups/"
                                 "{rg}/providers/Microsoft.Network/loadBalancers/{lb}/backendAddressPools/{pool}")
        parsed = []
        for item in addresses:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                raise InvalidRequest("every address needs a name")
            state = item.get("admin_state", "None")
            if state not in ADMIN_STATES:
                raise InvalidRequest(f"admin_state must be one of {', '.join(ADMIN_STATES)}")
            parsed.append(Address(item["name"], str(item.get("ip_address", "")), state, state))
        with self._lock:
            pool = Pool(pool_id, location, parsed)
            self._pools[pool_id.lower()] = pool
            return self._pool_view(pool)

    def write_address(self, pool_id: str, address: str, admin_state: str) -> dict[str, Any]:
        """Another writer (the portal, another tool) changes one address at once: the etag changes."""
        if admin_state not in ADMIN_STATES:
            raise InvalidRequest(f"admin_state must be one of {', '.join(ADMIN_STATES)}")
        with self._lock:
            pool = self._pool(pool_id)
            entry = next((a for a in pool.addresses if a.name == address), None)
            if entry is None:
                raise InvalidRequest(f"pool has no address {address!r}")
            entry.admin_state = admin_state
            self._make_effective(pool, entry, admin_state)
            pool.etag = new_etag()
            pool.writes += 1
            view = self._pool_view(pool)
        self._deliver()
        return view

    def pools(self) -> list[dict[str, Any]]:
        with self._lock:
            self._settle()
            views = [self._pool_view(p) for p in self._pools.values()]
        self._deliver()
        return views

    def tick(self) -> list[EffectiveChange]:
        """Settle every operation that is due and hand the changes to ``on_effective``; returns them.

        Without it an operation would complete only when some request arrives: a load balancer driven by
        the effective states would then lag behind ARM's own answers by however long the clients wait."""
        with self._lock:
            self._settle()
        return self._deliver()

    def _put(self, pool: Pool, headers: dict[str, str], body: bytes, base_url: str) -> ArmAnswer:
        if_match = headers.get("if-match")
        if if_match is not None and if_match != "*" and if_match != pool.etag:
            return arm_error(412, "PreconditionFailed", "The condition specified using HTTP conditional header(s) "
                              "is not met.")
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return arm_error(400, "InvalidRequestFormat", "Cannot parse the request.")
        addresses, problem = self._addresses_of(data, pool)
        if problem is not None:
            return arm_error(400, "InvalidRequestFormat", problem)
        assert addresses is not None
        busy = self._busy(pool) if self.conflict_while_updating else None
        if busy is not None:
            return arm_error(409, "AnotherOperationInProgress", "Another operation on this or dependent resource is "
                              "in progress. To retrieve status of the operation use uri: "
                              f"{self._operation_url(busy, base_url)}.", {"Retry-After": str(self.retry_after)})
        # Applied from here on: the faults that wait for an applied PUT are used up.
        slow = self._take_fault("arm", "PUT", ("slow_operation",))
        end = self._take_fault("arm", "PUT", ("operation_end",))
        pool.addresses = addresses
        pool.etag = new_etag()
        pool.writes += 1
        pool.provisioning = "Updating"
        now = self._clock()
        due = now + (slow.seconds if slow is not None and slow.seconds is not None else self.async_seconds)
        # A pool's operations end in the order they were accepted: one is never done before an earlier one.
        due = max([due] + [o.due for o in self._operations.values() if o.pool_id == pool.id and not o.done])
        operation = Operation(str(uuid.uuid4()), pool.id, due, False, {a.name: a.admin_state for a in addresses},
                               end.end if end is not None and end.end is not None else "Succeeded")
        self._operations[operation.id] = operation
        self._settle()
        headers = {"Azure-AsyncOperation": self._operation_url(operation, base_url),
                   "Retry-After": str(self.retry_after)}
        answer = ArmAnswer(200, self._pool_resource(pool), headers)
        after = self._take_fault("arm", "PUT", ("lost_answer", "status_after_apply"))
        if after is None:
            return answer
        if after.kind == "lost_answer":
            return dataclasses.replace(answer, drop=after.seconds is None, delay=after.seconds or 0.0)
        return self._fault_answer(after, token=False)

    def _busy(self, pool: Pool) -> Operation | None:
        """An operation still in progress on ``pool`` or on another pool of its load balancer."""
        lb = pool.id.lower().rsplit("/backendaddresspools/", 1)[0] + "/"
        return next((o for o in self._operations.values() if not o.done and o.pool_id.lower().startswith(lb)), None)

    def _operation_url(self, operation: Operation, base_url: str) -> str:
        match = POOL_ID.match(operation.pool_id)
        pool = self._pools.get(operation.pool_id.lower())
        assert match is not None
        location = pool.location if pool is not None else "westeurope"
        return (f"{base_url}/subscriptions/{match.group('sub')}/providers/Microsoft.Network/locations/{location}/"
                f"operations/{operation.id}?api-version=2023-09-01")

    def _addresses_of(self, data: Any, pool: Pool) -> tuple[list[Address] | None, str | None]:
        if not isinstance(data, dict):
            return None, "The request body must be a JSON object."
        name = data.get("name")
        pool_name = pool.id.rsplit("/", 1)[1]
        if name is not None and name != pool_name:
            return None, f"The name in the body ({name}) does not match the pool in the URL ({pool_name})."
        properties = data.get("properties", {})
        if not isinstance(properties, dict):
            return None, "properties must be an object."
        items = properties.get("loadBalancerBackendAddresses", [])
        if not isinstance(items, list):
            return None, "properties.loadBalancerBackendAddresses must be an array."
        known = {a.name: a for a in pool.addresses}
        result = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                return None, "Every backend address needs a name."
            props = item.get("properties", {})
            if not isinstance(props, dict):
                return None, f"properties of backend address {item['name']} must be an object."
            state = props.get("adminState", "None")
            if state not in ADMIN_STATES:
                return None, (f"Value '{state}' of adminState of backend address {item['name']} is invalid: "
                              f"expected one of {', '.join(ADMIN_STATES)}.")
            before = known.get(item["name"])
            ip_address = str(props.get("ipAddress", before.ip_address if before else ""))
            result.append(Address(item["name"], ip_address, state, before.effective if before else "None"))
        return result, None

    def _operation(self, operation_id: str) -> ArmAnswer:
        operation = self._operations.get(operation_id)
        if operation is None:
            return arm_error(404, "NotFound", f"Operation {operation_id} not found.")
        if not operation.done:
            self._statuses["operation InProgress"] += 1
            return ArmAnswer(200, {"status": "InProgress"}, {"Retry-After": str(self.retry_after)})
        self._statuses[f"operation {operation.outcome}"] += 1
        if operation.outcome in _ENDS:
            code, message = _ENDS[operation.outcome]
            return ArmAnswer(200, {"status": operation.outcome, "error": {"code": code, "message": message}})
        return ArmAnswer(200, {"status": "Succeeded"})

    def _land(self) -> None:
        """Hand every stalled PUT that is due to its pool, in the order they are due, as if it arrived now:
        judged against the pool as it is (its ``If-Match`` above all), applied or refused. Nobody hears the
        answer: it is counted (``pool_put landed {status}``) and logged."""
        now = self._clock()
        while self._stalled and self._stalled[0].due <= now:
            stalled = self._stalled.pop(0)
            pool = self._pools.get(stalled.pool_id.lower())
            if pool is None:
                continue
            answer = self._put(pool, stalled.headers, stalled.body, stalled.base_url)
            self._statuses[f"pool_put landed {answer.status}"] += 1
            log.info("a stalled PUT reached pool %s: %s", pool.id.rsplit("/", 1)[-1], answer.status)

    def _settle(self) -> None:
        """Land the stalled PUTs that are due, then end every operation that is due, in the order they were
        accepted: the admin states of one that succeeds become effective (the data plane); one that fails or
        is canceled changes nothing there. A pool with no operation left is Succeeded again, or Failed if the
        last one to end did not succeed."""
        self._land()
        now = self._clock()
        for operation in self._operations.values():
            if operation.done or operation.due > now:
                continue
            operation.done = True
            pool = self._pools.get(operation.pool_id.lower())
            if pool is None:
                continue
            if operation.outcome == "Succeeded":
                for address in pool.addresses:
                    if address.name in operation.states:
                        self._make_effective(pool, address, operation.states[address.name])
            if not any(not o.done for o in self._operations.values() if o.pool_id == operation.pool_id):
                # The network specification's ProvisioningState has no Canceled: a canceled update is Failed.
                pool.provisioning = "Succeeded" if operation.outcome == "Succeeded" else "Failed"

    def _make_effective(self, pool: Pool, address: Address, state: str) -> None:
        """Set ``address``'s effective state (the lock is held), queueing the change if it is one."""
        if address.effective == state:
            return
        self._changes.append(EffectiveChange(pool.id, address.name, address.ip_address, address.effective, state,
                                             self._clock()))
        address.effective = state

    def _deliver(self) -> list[EffectiveChange]:
        """Hand the queued changes to ``on_effective``, outside the model's lock (the hook may do I/O, and
        ARM requests must not wait on it), in order. Raises nothing: a hook that raises is a bug, logged."""
        with self._deliver_lock:
            with self._lock:
                changes, self._changes = self._changes, []
            hook = self.on_effective
            if hook is not None:
                for change in changes:
                    try:
                        hook(change)
                    except Exception:
                        log.exception("bug in the effective admin state hook (pool %s, address %s)",
                                      change.pool_id, change.address)
            return changes

    def _pool(self, pool_id: str) -> Pool:
        pool = self._pools.get(pool_id.lower())
        if pool is None:
            raise InvalidRequest(f"no pool {pool_id!r}")
        return pool

    def _pool_resource(self, pool: Pool) -> dict[str, Any]:
        """The pool as ARM serves it (``BackendAddressPool`` of loadBalancer.json)."""
        match = POOL_ID.match(pool.id)
        assert match is not None
        return {
            "name": match.group("pool"),
            "id": pool.id,
            "etag": pool.etag,
            "type": "Microsoft.Network/loadBalancers/backendAddressPools",
            "properties": {
                "provisioningState": pool.provisioning,
                "loadBalancerBackendAddresses": [
                    {"name": a.name, "properties": {"ipAddress": a.ip_address, "adminState": a.admin_state}}
                    for a in pool.addresses
                ],
                "loadBalancingRules": [],
            },
        }

    @staticmethod
    def _pool_view(pool: Pool) -> dict[str, Any]:
        return {"id": pool.id, "etag": pool.etag, "provisioning_state": pool.provisioning, "writes": pool.writes,
                "admin_states": {a.name: a.admin_state for a in pool.addresses},
                "effective": {a.name: a.effective for a in pool.addresses}}
