"""``SimControl``: a small client for the simulator's control API, for tests and the demo."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx

__all__ = ["SimControl", "SimControlError"]

T = TypeVar("T")


class SimControlError(Exception):
    """The control API answered with an error status; ``status`` and ``body`` say which."""

    def __init__(self, message: str, *, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class SimControl:
    """Client of one simulator's control API (``http://host:port``).

    Every method raises ``SimControlError`` for an error answer and ``httpx.HTTPError`` when the
    simulator cannot be reached. Proxy settings of the environment are ignored.
    """

    def __init__(
        self, control_url: str, *, timeout: float = 5.0, transport: httpx.BaseTransport | None = None
    ):
        self.url = control_url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout, trust_env=False, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SimControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def healthz(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def schedule(self, event_type: str, resources: Sequence[str], **fields: Any) -> dict[str, Any]:
        """Create an event; ``fields`` as in ``SimulatedGroup.schedule``. Returns the event's view."""
        return self._call(
            "POST", "/events", json={"event_type": event_type, "resources": list(resources), **fields}
        )

    def cancel(self, event_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/events/{event_id}")

    def events(self) -> dict[str, Any]:
        """``{"incarnation": N, "approval_delay": S, "events": [view, ...]}``."""
        return self._call("GET", "/events")

    def event(self, event_id: str) -> dict[str, Any] | None:
        """The view of one current event, or None if it is gone."""
        try:
            return self._call("GET", f"/events/{event_id}")
        except SimControlError as exc:
            if exc.status == 404:
                return None
            raise

    def document(self, vm: str, api_version: str | None = None) -> dict[str, Any]:
        """What ``vm`` would be served, without counting against its rate limit or logging a request."""
        params = {"api-version": api_version} if api_version else None
        return self._call("GET", f"/document/{vm}", params=params)

    def log(self, since: int = 0, kind: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"since": since}
        if kind is not None:
            params["kind"] = kind
        entries: list[dict[str, Any]] = self._call("GET", "/log", params=params)["entries"]
        return entries

    def add_fault(
        self,
        kind: str,
        vm: str | None = None,
        count: int | None = 1,
        *,
        status: int | None = None,
        seconds: float | None = None,
        methods: Sequence[str] = ("GET",),
        field: str | None = None,
        **served: Any,
    ) -> list[dict[str, Any]]:
        """Queue a fault; ``served`` are the fields of a ``body`` fault (``body`` in base64, ``repeat``,
        ``content_type``, ``headers``, ``content_length``), sent as they are."""
        body: dict[str, Any] = {"kind": kind, "vm": vm, "count": count, "methods": list(methods), **served}
        if status is not None:
            body["status"] = status
        if seconds is not None:
            body["seconds"] = seconds
        if field is not None:
            body["field"] = field
        queued: list[dict[str, Any]] = self._call("POST", "/faults", json=body)["queued"]
        return queued

    def refuse(self, vm: str | None, seconds: float) -> list[dict[str, Any]]:
        """Make ``vm``'s port (None: every VM's) refuse connections for ``seconds`` of real time."""
        return self.add_fault("refuse", vm, seconds=seconds)

    def impact(self, event_id: str, seconds: float | None = None, pause: bool = False) -> dict[str, Any]:
        """A second impact on a Started event (``pause``: pause the named VMs' PIDs again)."""
        body: dict[str, Any] = {"pause": pause}
        if seconds is not None:
            body["seconds"] = seconds
        return self._call("POST", f"/events/{event_id}/impact", json=body)

    def rollout(
        self, event_type: str, groups: Sequence[Sequence[str]] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Back-to-back events, one per group (default: per fault domain); returns the rollout."""
        body: dict[str, Any] = {"event_type": event_type, **fields}
        if groups is not None:
            body["groups"] = [list(g) for g in groups]
        return self._call("POST", "/rollouts", json=body)

    def rollouts(self) -> list[dict[str, Any]]:
        rollouts: list[dict[str, Any]] = self._call("GET", "/rollouts")["rollouts"]
        return rollouts

    def vms(self) -> dict[str, Any]:
        """The group's layout: ``{"delivery": "unit" | "named", "vms": [{"name", "unit", "scale_set_name",
        "placement_group_id", "fault_domain", "update_domain", "zone"}, ...], "units": {UNIT: [VM, ...]}}``."""
        return self._call("GET", "/vms")

    def unit_of(self, vm: str) -> str:
        """The delivery unit of ``vm`` (``""``: the default unit); raises ``KeyError`` for a VM not in the group
        (compared case-insensitively, as the simulator does)."""
        for info in self.vms()["vms"]:
            if info["name"].lower() == vm.lower():
                unit: str = info["unit"]
                return unit
        raise KeyError(vm)

    def register_pids(self, vm: str, pids: Sequence[int]) -> dict[str, Any]:
        """Set the PIDs that stand for ``vm``: impacts pause or kill these, and nothing else."""
        return self._call("POST", f"/vms/{vm}/pids", json={"pids": list(pids)})

    def pids(self, vm: str) -> list[int]:
        pids: list[int] = self._call("GET", f"/vms/{vm}/pids")["pids"]
        return pids

    def skip_incarnation(self, by: int = 1, vm: str | None = None) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self._call("POST", "/incarnation/skip", json={"vm": vm, "by": by})["entries"]
        return entries

    def reset_incarnation(self, vm: str | None = None) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self._call("POST", "/incarnation/reset", json={"vm": vm})["entries"]
        return entries

    def replay(self) -> dict[str, Any]:
        """The replay's state: ``{"active", "index", "count", "interval", "at_end", "document"}``."""
        return self._call("GET", "/replay")

    def replay_next(self) -> dict[str, Any]:
        return self._call("POST", "/replay/next")

    def load_documents(self, documents: Sequence[Any], interval: float = 0.0) -> dict[str, Any]:
        return self._call("POST", "/replay", json={"documents": list(documents), "interval": interval})

    def load_timeline(self, steps: Sequence[Any]) -> int:
        pending: int = self._call("POST", "/replay", json={"timeline": list(steps)})["pending"]
        return pending

    def now(self) -> float:
        """The simulator's (simulated) clock, epoch seconds."""
        now: float = self.healthz()["now"]
        return now

    def faults(self) -> list[dict[str, Any]]:
        faults: list[dict[str, Any]] = self._call("GET", "/faults")["faults"]
        return faults

    def clear_faults(self, vm: str | None = None) -> int:
        params = {"vm": vm} if vm else None
        cleared: int = self._call("DELETE", "/faults", params=params)["cleared"]
        return cleared

    def wait_for(
        self,
        predicate: Callable[[SimControl], T | None],
        timeout: float = 10.0,
        interval: float = 0.05,
        message: str = "condition",
    ) -> T:
        """Call ``predicate(self)`` until it returns something truthy; return that value.

        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            value = predicate(self)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{message} not met within {timeout:g} s")
            time.sleep(interval)

    def wait_for_transition(
        self, event_id: str, to: str | None, timeout: float = 10.0, since: int = 0
    ) -> dict[str, Any]:
        """Wait for the log entry of ``event_id`` reaching ``to`` (None: removed); return it."""

        def found(control: SimControl) -> dict[str, Any] | None:
            for entry in control.log(since=since, kind="transition"):
                if entry["event_id"] == event_id and entry["to"] == to:
                    return entry
            return None

        return self.wait_for(found, timeout, message=f"event {event_id} reaching {to or 'removed'}")

    # -- managed identity and ARM (a simulator started with --arm) ------------------------------------------

    def add_identity(self, client_id: str, msi_res_id: str | None = None,
                     vms: Sequence[str] | None = None) -> dict[str, Any]:
        """A user-assigned identity, assigned to ``vms`` (None: every VM)."""
        return self._call("POST", "/identities", json={"client_id": client_id, "msi_res_id": msi_res_id,
                                                        "vms": None if vms is None else list(vms)})

    def expire_tokens(self) -> int:
        """Every token issued so far expires now."""
        expired: int = self._call("POST", "/identities/expire-tokens")["expired"]
        return expired

    def set_role(self, principal: str, role: str | None = None, roles: Sequence[str] | None = None) -> dict[str, Any]:
        """The role (``network-contributor``, ``reader``, ``scheduled-event-contributor``, ``none``), or roles, of an
        identity over every resource."""
        body: dict[str, Any] = {"principal": principal}
        if role is not None:
            body["role"] = role
        if roles is not None:
            body["roles"] = list(roles)
        return self._call("POST", "/arm/roles", json=body)

    def add_load_balancer(self, lb_id: str, probes: Sequence[dict[str, Any]],
                          location: str = "westeurope") -> dict[str, Any]:
        """A load balancer and its probes (``{"name", "protocol", "port", "interval_in_seconds",
        "number_of_probes", "probe_threshold", "request_path"}``); GET answers its pools too."""
        return self._call("POST", "/arm/loadbalancers", json={"id": lb_id, "probes": list(probes),
                                                               "location": location})

    def add_scale_set(self, scale_set_id: str, **settings: Any) -> dict[str, Any]:
        """A scale set; ``settings`` as ``POST /arm/scalesets`` takes them (``automatic_repairs``,
        ``terminate_notification``, ``os_image_notification``, ``scheduled_events_policy``, ``priority``,
        ``health_probe``, ``health_extension``, ``location``)."""
        return self._call("POST", "/arm/scalesets", json={"id": scale_set_id, **settings})

    def add_availability_set(self, availability_set_id: str, **settings: Any) -> dict[str, Any]:
        """An availability set in the simulated ARM (``scheduled_events_policy``)."""
        return self._call("POST", "/arm/availabilitysets", json={"id": availability_set_id, **settings})

    def add_vm_resource(self, vm_id: str, **settings: Any) -> dict[str, Any]:
        """A virtual machine (``priority``, ``scheduled_events_policy``, ``availability_set``, ``location``)."""
        return self._call("POST", "/arm/vms", json={"id": vm_id, **settings})

    def add_pool(
        self, pool_id: str, addresses: Sequence[dict[str, Any]], location: str = "westeurope"
    ) -> dict[str, Any]:
        """A backend address pool; ``addresses`` of ``{"name", "ip_address", "admin_state"}``."""
        return self._call("POST", "/arm/pools", json={"id": pool_id, "addresses": list(addresses),
                                                       "location": location})

    def pools(self) -> dict[str, dict[str, Any]]:
        """Every pool's view (``admin_states``, ``effective``, ``etag``, ``writes``...), by resource id."""
        return {pool["id"]: pool for pool in self._call("GET", "/arm/pools")["pools"]}

    def write_address(self, pool_id: str, address: str, admin_state: str) -> dict[str, Any]:
        """Another writer sets one address's admin state (the pool's etag changes)."""
        return self._call("POST", "/arm/pools/write", json={"id": pool_id, "address": address,
                                                             "admin_state": admin_state})

    def arm_calls(self) -> dict[str, Any]:
        """``{"calls": {kind: n}, "statuses": {"kind status": n}, "total_arm": n}``."""
        return self._call("GET", "/arm/calls")

    def add_azure_fault(self, target: str, kind: str = "status", *, status: int | None = None,
                        retry_after: int | None = None, count: int | None = 1,
                        methods: Sequence[str] = ("GET", "PUT"), seconds: float | None = None,
                        delay_seconds: float | None = None, end: str | None = None) -> dict[str, Any]:
        """A fault on the token endpoint (``target="token"``), on ARM (``"arm"``) or on the Resource Graph query
        (``"graph"``: ``status`` or ``unreachable`` only): ``kind`` ``status``,
        ``unreachable``, ``concurrent_write``, ``lost_answer`` (``delay_seconds``), ``status_after_apply``
        (``status``), ``slow_operation`` (``seconds``), ``operation_end`` (``end``) or ``stalled_write``
        (``seconds``)."""
        body: dict[str, Any] = {"target": target, "kind": kind, "count": count, "methods": list(methods)}
        optional = {"status": status, "retry_after": retry_after, "seconds": seconds, "delay_seconds": delay_seconds,
                    "end": end}
        body.update({name: value for name, value in optional.items() if value is not None})
        return self._call("POST", "/arm/faults", json=body)

    def azure_faults(self) -> list[dict[str, Any]]:
        """The faults queued on the token endpoint and ARM, in the order they will be used."""
        faults: list[dict[str, Any]] = self._call("GET", "/arm/faults")["faults"]
        return faults

    def clear_azure_faults(self) -> int:
        cleared: int = self._call("DELETE", "/arm/faults")["cleared"]
        return cleared

    def arm_settings(self, **settings: Any) -> dict[str, Any]:
        """Change ARM's settings (``conflict_while_updating``, ``async_seconds``, ``retry_after``); returns
        them all (none given: only reads them)."""
        if not settings:
            return self._call("GET", "/arm/settings")
        return self._call("POST", "/arm/settings", json=settings)

    def set_throttling(self, enabled: bool = True, **limits: Any) -> dict[str, Any]:
        """ARM's token buckets on (``read_capacity``, ``read_refill``, ``write_capacity``, ``write_refill``;
        the documented values by default) or off."""
        return self._call("POST", "/arm/throttling", json={"enabled": enabled, **limits})

    def throttling(self) -> dict[str, Any]:
        return self._call("GET", "/arm/throttling")

    def graph_settings(self, **settings: Any) -> dict[str, Any]:
        """Change the Resource Graph's settings (``page_size``, ``quota``, ``window_seconds``,
        ``keep_finished_seconds``); returns them all (none given: reads them, with every row kept)."""
        if not settings:
            return self._call("GET", "/arm/graph")
        return self._call("POST", "/arm/graph", json=settings)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._http.request(method, path, **kwargs)
        if response.is_error:
            raise SimControlError(
                f"{method} {path}: {response.status_code} {response.text[:500]}",
                status=response.status_code,
                body=response.text,
            )
        data: dict[str, Any] = response.json()
        return data
