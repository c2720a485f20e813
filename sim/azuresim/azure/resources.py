"""Read-only resources: load balancers with their probes, scale sets and virtual machines, created through
the control API and served by ARM's GET as the REST specification shapes them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from azuresim.azure.answers import (
    AVAILABILITY_SET_ID,
    LB_ID,
    PRIORITIES,
    PROBE,
    PROBE_PROTOCOLS,
    REPAIR_ACTIONS,
    SCALE_SET_ID,
    VM_ID,
    ArmAnswer,
    arm_error,
    duration_seconds,
)
from azuresim.azure.identity import IdentityMixin
from azuresim.azure.pools import PoolsMixin
from azuresim.azure.records import Identity, Resource
from azuresim.errors import InvalidRequest

__all__ = ["ResourcesMixin"]


class ResourcesMixin(PoolsMixin, IdentityMixin):
    """Load balancers, scale sets and VMs; part of ``AzureModel`` (a load balancer serves its pools, and a GET
    is authorized by the caller's roles)."""

    def add_load_balancer(self, lb_id: str, probes: Sequence[dict[str, Any]],
                          location: str = "westeurope") -> dict[str, Any]:
        """A load balancer with its health probes: ``{"name", "protocol" (Http, Https, Tcp), "port",
        "interval_in_seconds" (default 15), "number_of_probes", "probe_threshold", "request_path"}``."""
        if not LB_ID.match(lb_id):
            raise InvalidRequest("id must be a load balancer resource id: /subscriptions/{sub}/resourceGroups/{rg}/"
                                 "providers/Microsoft.Network/loadBalancers/{lb}")
        parsed = [self._probe_config(item) for item in probes]
        if len({p["name"].lower() for p in parsed}) != len(parsed):
            raise InvalidRequest("two probes have the same name")
        return self._add_resource(lb_id, location, self._lb_resource, {"probes": parsed})

    def add_scale_set(self, scale_set_id: str, location: str = "westeurope", **settings: Any) -> dict[str, Any]:
        """A virtual machine scale set; ``settings`` (all optional): ``automatic_repairs`` ``{"enabled",
        "grace_period" (ISO 8601, PT10M to PT90M), "repair_action"}``, ``terminate_notification`` ``{"enable",
        "not_before_timeout" (PT5M to PT15M)}``, ``os_image_notification`` ``{"enable", "not_before_timeout"}``,
        ``scheduled_events_policy`` ``{"user_initiated_reboot": bool, "user_initiated_redeploy": bool,
        "all_instances_down": bool}``, ``priority`` (Regular, Low, Spot), ``health_probe`` (a load balancer
        probe's id) and
        ``health_extension`` ``{"protocol", "port", "request_path"}`` (the Application Health extension)."""
        if not SCALE_SET_ID.match(scale_set_id):
            raise InvalidRequest("id must be a scale set resource id: /subscriptions/{sub}/resourceGroups/{rg}/"
                                 "providers/Microsoft.Compute/virtualMachineScaleSets/{name}")
        known = {"automatic_repairs", "terminate_notification", "os_image_notification", "scheduled_events_policy",
                 "priority", "health_probe", "health_extension"}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise InvalidRequest(f"unknown scale set setting(s) {', '.join(unknown)}")
        config = {k: v for k, v in settings.items() if v is not None}
        repairs = config.get("automatic_repairs")
        if repairs is not None:
            self._check_object(repairs, "automatic_repairs", {"enabled", "grace_period", "repair_action"})
            grace = repairs.get("grace_period")
            if grace is not None:
                seconds = duration_seconds(grace) if isinstance(grace, str) else None
                if seconds is None or not 600 <= seconds <= 5400:
                    raise InvalidRequest("automatic_repairs.grace_period must be an ISO 8601 duration from PT10M to "
                                         "PT90M (what ARM accepts)")
            if repairs.get("repair_action", "Replace") not in REPAIR_ACTIONS:
                raise InvalidRequest(f"automatic_repairs.repair_action must be one of {', '.join(REPAIR_ACTIONS)}")
        for key, bounds in (("terminate_notification", (300, 900)), ("os_image_notification", (900, 900))):
            profile = config.get(key)
            if profile is None:
                continue
            self._check_object(profile, key, {"enable", "not_before_timeout"})
            timeout = profile.get("not_before_timeout")
            if timeout is not None:
                seconds = duration_seconds(timeout) if isinstance(timeout, str) else None
                if seconds is None or not bounds[0] <= seconds <= bounds[1]:
                    raise InvalidRequest(f"{key}.not_before_timeout must be an ISO 8601 duration from "
                                         f"PT{bounds[0] // 60}M to PT{bounds[1] // 60}M")
        self._check_policy(config.get("scheduled_events_policy"))
        if config.get("priority", "Regular") not in PRIORITIES:
            raise InvalidRequest(f"priority must be one of {', '.join(PRIORITIES)}")
        probe = config.get("health_probe")
        if probe is not None and (not isinstance(probe, str) or not PROBE.match(probe)):
            raise InvalidRequest("health_probe must be a load balancer probe's resource id (.../loadBalancers/{lb}/"
                                 "probes/{probe})")
        extension = config.get("health_extension")
        if extension is not None:
            self._check_object(extension, "health_extension", {"protocol", "port", "request_path"})
            if extension.get("protocol", "http") not in ("http", "https", "tcp"):
                raise InvalidRequest("health_extension.protocol must be http, https or tcp")
        return self._add_resource(scale_set_id, location, self._scale_set_resource, config)

    def add_vm(self, vm_id: str, location: str = "westeurope", *, priority: str | None = None,
               scheduled_events_policy: dict[str, Any] | None = None,
               availability_set: str | None = None) -> dict[str, Any]:
        """A virtual machine (not of a scale set): its ``priority`` and ``scheduled_events_policy``
        (``{"user_initiated_reboot": bool, "user_initiated_redeploy": bool}``)."""
        if not VM_ID.match(vm_id):
            raise InvalidRequest("id must be a virtual machine resource id: /subscriptions/{sub}/resourceGroups/{rg}/"
                                 "providers/Microsoft.Compute/virtualMachines/{name}")
        if (priority or "Regular") not in PRIORITIES:
            raise InvalidRequest(f"priority must be one of {', '.join(PRIORITIES)}")
        self._check_policy(scheduled_events_policy)
        config = {"priority": priority, "scheduled_events_policy": scheduled_events_policy,
                  "availability_set": availability_set}
        given = {k: v for k, v in config.items() if v is not None}
        return self._add_resource(vm_id, location, self._vm_resource, given)

    def add_availability_set(self, availability_set_id: str, location: str = "westeurope", *,
                             scheduled_events_policy: dict[str, Any] | None = None) -> dict[str, Any]:
        """An availability set and its ``scheduled_events_policy`` (one policy for every VM of the set)."""
        if not AVAILABILITY_SET_ID.match(availability_set_id):
            raise InvalidRequest("id must be an availability set resource id: /subscriptions/{sub}/resourceGroups/"
                                 "{rg}/providers/Microsoft.Compute/availabilitySets/{name}")
        self._check_policy(scheduled_events_policy)
        given = {} if scheduled_events_policy is None else {"scheduled_events_policy": scheduled_events_policy}
        return self._add_resource(availability_set_id, location, self._availability_set_resource, given)

    def approves_user_event(self, event_type: str, vms: Sequence[tuple[str, str]]) -> bool:
        """Whether ``scheduledEventsPolicy`` approves, at once, a user-initiated ``event_type`` (Reboot or
        Redeploy) of every one of ``vms`` (``(name, scale set name or "")``): a scale-set instance by its
        scale set's policy, any other VM by its availability set's if it is in one (one policy for every VM
        of a set), else by its own. A VM the simulated ARM does not hold has no policy: not approved."""
        key = {"Reboot": "user_initiated_reboot", "Redeploy": "user_initiated_redeploy"}.get(event_type)
        if key is None or not vms:
            return False
        with self._lock:
            by_kind_name: dict[tuple[str, str], Resource] = {}
            for resource in self._resources.values():
                for kind, pattern in (("vmss", SCALE_SET_ID), ("vm", VM_ID), ("avset", AVAILABILITY_SET_ID)):
                    match = pattern.match(resource.id)
                    if match is not None:
                        by_kind_name[(kind, match.group("name").lower())] = resource
            for name, scale_set in vms:
                holder = by_kind_name.get(("vmss", scale_set.lower())) if scale_set else None
                if holder is None and not scale_set:
                    vm = by_kind_name.get(("vm", name.lower()))
                    avset = vm.config.get("availability_set") if vm is not None else None
                    holder = self._resources.get(avset.lower()) if isinstance(avset, str) else vm
                policy = holder.config.get("scheduled_events_policy") if holder is not None else None
                if not isinstance(policy, dict) or policy.get(key) is not True:
                    return False
            return True

    def resources(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"id": r.id, "location": r.location, "config": r.config} for r in self._resources.values()]

    def _add_resource(self, resource_id: str, location: str, build: Callable[[Resource], dict[str, Any]],
                      config: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            resource = Resource(resource_id, location, build, config)
            self._resources[resource_id.lower()] = resource
            return {"id": resource.id, "location": location, "config": config}

    @staticmethod
    def _check_object(value: Any, name: str, keys: set[str]) -> None:
        if not isinstance(value, dict):
            raise InvalidRequest(f"{name} must be an object")
        unknown = sorted(set(value) - keys)
        if unknown:
            raise InvalidRequest(f"{name}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(keys))})")

    def _check_policy(self, policy: Any) -> None:
        if policy is None:
            return
        self._check_object(policy, "scheduled_events_policy",
                           {"user_initiated_reboot", "user_initiated_redeploy", "all_instances_down"})
        if not all(isinstance(v, bool) for v in policy.values()):
            raise InvalidRequest("scheduled_events_policy values must be true or false")

    @staticmethod
    def _probe_config(item: Any) -> dict[str, Any]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise InvalidRequest("every probe needs a name")
        known = {"name", "protocol", "port", "interval_in_seconds", "number_of_probes", "probe_threshold",
                 "request_path"}
        unknown = sorted(set(item) - known)
        if unknown:
            raise InvalidRequest(f"probe {item['name']}: unknown field(s) {', '.join(unknown)}")
        protocol = item.get("protocol", "Http")
        if protocol not in PROBE_PROTOCOLS:
            raise InvalidRequest(f"probe protocol must be one of {', '.join(PROBE_PROTOCOLS)}")
        port = item.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidRequest("probe port must be 1 to 65535")
        interval = item.get("interval_in_seconds", 15)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 5:
            raise InvalidRequest("interval_in_seconds must be an integer >= 5 (the specification's minimum)")
        for key in ("number_of_probes", "probe_threshold"):
            value = item.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidRequest(f"{key} must be an integer >= 1")
        path = item.get("request_path")
        if protocol == "Tcp" and path is not None:
            raise InvalidRequest("request_path is not allowed for a Tcp probe")
        if protocol != "Tcp" and not (isinstance(path, str) and path.startswith("/")):
            raise InvalidRequest("an Http or Https probe needs a request_path starting with /")
        return {"name": item["name"], "protocol": protocol, "port": port, "interval_in_seconds": interval,
                "number_of_probes": item.get("number_of_probes"), "probe_threshold": item.get("probe_threshold"),
                "request_path": path}

    def _read_resource(self, method: str, path: str, kind: str, identity: Identity) -> ArmAnswer:
        """GET of a load balancer, one of its probes, a scale set or a VM."""
        if method != "GET":
            return arm_error(405, "MethodNotAllowed", f"The simulator serves only GET of this resource, not {method}.")
        probe = PROBE.match(path)
        top = probe.group("lb") if probe else path
        action = {"lb": "Microsoft.Network/loadBalancers/read", "probe": "Microsoft.Network/loadBalancers/probes/read",
                  "scale_set": "Microsoft.Compute/virtualMachineScaleSets/read",
                  "availability_set": "Microsoft.Compute/availabilitySets/read",
                  "vm": "Microsoft.Compute/virtualMachines/read"}[kind]
        if not self._may(identity, action):
            return self._forbidden(identity, action, path)
        resource = self._resources.get(top.lower())
        if resource is None:
            parts = top.strip("/").split("/")
            return arm_error(404, "ResourceNotFound", f"The Resource '{parts[5]}/{parts[6]}/{parts[7]}' under "
                              f"resource group '{parts[3]}' was not found. For more details please go to "
                              "https://aka.ms/ARMResourceNotFoundFix")
        body = resource.build(resource)
        if probe is None:
            return ArmAnswer(200, body)
        found = next((p for p in body["properties"]["probes"] if p["name"].lower() == probe.group("probe").lower()),
                     None)
        if found is None:
            return arm_error(404, "NotFound", f"Resource {path} not found.")
        return ArmAnswer(200, found)

    def _lb_resource(self, lb: Resource) -> dict[str, Any]:
        """``LoadBalancer`` of loadBalancer.json: its probes, and the pools under its id."""
        match = LB_ID.match(lb.id)
        assert match is not None
        pools = [self._pool_resource(p) for p in self._pools.values() if p.id.lower().startswith(lb.id.lower() + "/")]
        probes = []
        for item in lb.config["probes"]:
            properties: dict[str, Any] = {"provisioningState": "Succeeded", "protocol": item["protocol"],
                                          "port": item["port"], "intervalInSeconds": item["interval_in_seconds"],
                                          "loadBalancingRules": []}
            for key, name in (("number_of_probes", "numberOfProbes"), ("probe_threshold", "probeThreshold"),
                              ("request_path", "requestPath")):
                if item[key] is not None:
                    properties[name] = item[key]
            probes.append({"name": item["name"], "id": f"{lb.id}/probes/{item['name']}", "etag": lb.etag,
                           "type": "Microsoft.Network/loadBalancers/probes", "properties": properties})
        return {"name": match.group("lb"), "id": lb.id, "etag": lb.etag, "type": "Microsoft.Network/loadBalancers",
                "location": lb.location, "sku": {"name": "Standard", "tier": "Regional"},
                "properties": {"provisioningState": "Succeeded", "resourceGuid": lb.unique_id,
                               "frontendIPConfigurations": [], "backendAddressPools": pools, "probes": probes,
                               "loadBalancingRules": [], "inboundNatRules": [], "outboundRules": []}}

    @staticmethod
    def _policy_resource(policy: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for key, name in (("user_initiated_reboot", "userInitiatedReboot"),
                          ("user_initiated_redeploy", "userInitiatedRedeploy"),
                          ("all_instances_down", "allInstancesDown")):
            if key in policy:
                body[name] = {"automaticallyApprove": policy[key]}
        return body

    def _scale_set_resource(self, scale_set: Resource) -> dict[str, Any]:
        """``VirtualMachineScaleSet`` of virtualMachineScaleSet.json, the parts configured (absent ones are left
        out, as ARM leaves out what was never set)."""
        match = SCALE_SET_ID.match(scale_set.id)
        assert match is not None
        config = scale_set.config
        profile: dict[str, Any] = {"osProfile": {"computerNamePrefix": match.group("name")[:9]},
                                   "networkProfile": {}}
        if "priority" in config:
            profile["priority"] = config["priority"]
            if config["priority"] in ("Spot", "Low"):
                profile["evictionPolicy"] = "Deallocate"
                profile["billingProfile"] = {"maxPrice": -1}
        if "health_probe" in config:
            profile["networkProfile"]["healthProbe"] = {"id": config["health_probe"]}
        events: dict[str, Any] = {}
        for key, name in (("terminate_notification", "terminateNotificationProfile"),
                          ("os_image_notification", "osImageNotificationProfile")):
            if key in config:
                item = config[key]
                events[name] = {k: v for k, v in (("notBeforeTimeout", item.get("not_before_timeout")),
                                                  ("enable", item.get("enable"))) if v is not None}
        if events:
            profile["scheduledEventsProfile"] = events
        if "health_extension" in config:
            extension = config["health_extension"]
            settings = {"protocol": extension.get("protocol", "http"), "port": extension.get("port")}
            if extension.get("request_path") is not None:
                settings["requestPath"] = extension["request_path"]
            profile["extensionProfile"] = {"extensions": [{
                "name": "HealthExtension",
                "properties": {"publisher": "Microsoft.ManagedServices", "type": "ApplicationHealthLinux",
                               "typeHandlerVersion": "2.0", "autoUpgradeMinorVersion": True, "settings": settings,
                               "provisioningState": "Succeeded"}}]}
        properties: dict[str, Any] = {"provisioningState": "Succeeded", "uniqueId": scale_set.unique_id,
                                      "orchestrationMode": "Uniform", "upgradePolicy": {"mode": "Manual"},
                                      "singlePlacementGroup": True, "virtualMachineProfile": profile}
        if "automatic_repairs" in config:
            repairs = config["automatic_repairs"]
            properties["automaticRepairsPolicy"] = {
                "enabled": bool(repairs.get("enabled", False)), "gracePeriod": repairs.get("grace_period", "PT10M"),
                "repairAction": repairs.get("repair_action", "Replace")}
        if "scheduled_events_policy" in config:
            properties["scheduledEventsPolicy"] = self._policy_resource(config["scheduled_events_policy"])
        return {"name": match.group("name"), "id": scale_set.id, "type": "Microsoft.Compute/virtualMachineScaleSets",
                "location": scale_set.location, "etag": scale_set.etag.removeprefix("W/").strip('"'),
                "sku": {"name": "Standard_D2s_v5", "tier": "Standard", "capacity": 3}, "properties": properties}

    def _availability_set_resource(self, availability_set: Resource) -> dict[str, Any]:
        """``AvailabilitySet`` of availabilitySet.json: its fault and update domain counts, its VMs (those
        added with this ``availability_set``) and ``scheduledEventsPolicy``."""
        match = AVAILABILITY_SET_ID.match(availability_set.id)
        assert match is not None
        members = [{"id": r.id} for r in self._resources.values()
                   if str(r.config.get("availability_set", "")).lower() == availability_set.id.lower()]
        properties: dict[str, Any] = {"platformFaultDomainCount": 2, "platformUpdateDomainCount": 5,
                                      "virtualMachines": members}
        if "scheduled_events_policy" in availability_set.config:
            policy = availability_set.config["scheduled_events_policy"]
            properties["scheduledEventsPolicy"] = self._policy_resource(policy)
        return {"name": match.group("name"), "id": availability_set.id, "type": "Microsoft.Compute/availabilitySets",
                "location": availability_set.location, "sku": {"name": "Aligned"}, "properties": properties}

    def _vm_resource(self, vm: Resource) -> dict[str, Any]:
        """``VirtualMachine`` of virtualMachine.json: ``priority``, ``scheduledEventsPolicy``, the availability set."""
        match = VM_ID.match(vm.id)
        assert match is not None
        config = vm.config
        properties: dict[str, Any] = {"provisioningState": "Succeeded", "vmId": vm.unique_id,
                                      "hardwareProfile": {"vmSize": "Standard_D2s_v5"}}
        if "priority" in config:
            properties["priority"] = config["priority"]
            if config["priority"] in ("Spot", "Low"):
                properties["evictionPolicy"] = "Deallocate"
        if "scheduled_events_policy" in config:
            properties["scheduledEventsPolicy"] = self._policy_resource(config["scheduled_events_policy"])
        if "availability_set" in config:
            properties["availabilitySet"] = {"id": config["availability_set"]}
        return {"name": match.group("name"), "id": vm.id, "type": "Microsoft.Compute/virtualMachines",
                "location": vm.location, "properties": properties}
