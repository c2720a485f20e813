"""The pure verdicts of ``coordinator doctor``'s ARM checks, and how a resource id is scoped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordinator.doctor.azure import scope_of
from coordinator.doctor.verdicts import (
    LbProbe,
    Status,
    Verdict,
    auto_approve_verdict,
    iso_duration_seconds,
    lb_probe_verdict,
    repairs_verdict,
    spot_verdict,
    terminate_verdict,
)

SUB = "/subscriptions/s/resourceGroups/rg/providers"


@pytest.mark.parametrize(("text", "seconds"), [
    ("PT10M", 600), ("PT1H30M", 5400), ("PT90S", 90), ("P1D", 86400), ("pt15m", 900), ("PT0.5S", 0.5),
    ("10M", None), ("PT", None), ("", None), (None, None), (600, None),
])
def test_iso_durations_as_arm_writes_them(text: object, seconds: float | None) -> None:
    assert iso_duration_seconds(text) == seconds


def test_scope_of_a_scale_set_instance_is_its_scale_set() -> None:
    assert scope_of(f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/3") == \
        ("scale_set", f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/web")
    vm = f"{SUB}/Microsoft.Compute/virtualMachines/vm0"
    assert scope_of(vm) == ("vm", vm)
    assert scope_of("/subscriptions/s") == ("unknown", None)


def _probe(**changes: object) -> LbProbe:
    fields: dict[str, object] = {"lb": "lb", "name": "p", "protocol": "Http", "port": 8090, "interval": 5.0,
                                 "threshold": 2, "request_path": "/health"}
    fields.update(changes)
    return LbProbe(**fields)  # type: ignore[arg-type]


def _lb(probes: list[LbProbe], wait: float = 15.0, interval: float = 5.0, threshold: int = 2) -> Verdict:
    return lb_probe_verdict(probes=probes, port=8090, path="/health", configured_interval=interval,
                            configured_threshold=threshold, probe_wait=wait, admin_state=False)


def test_a_probe_whose_lag_the_wait_covers_passes() -> None:
    verdict = _lb([_probe()])
    assert verdict.status is Status.PASS and "new flows stop 10 s after" in verdict.summary
    assert verdict.details["lag"] == 10.0


def test_a_drain_wait_shorter_than_interval_times_threshold_fails() -> None:
    verdict = _lb([_probe(interval=15.0, threshold=3)], wait=35.0, interval=15.0, threshold=3)
    assert verdict.status is Status.FAIL and "still sends it new flows" in verdict.summary
    assert "drain.probe_threshold: 3" in verdict.fix and "at least 45 s" in verdict.fix


def test_a_tcp_probe_never_sees_the_503() -> None:
    verdict = _lb([_probe(protocol="Tcp", request_path=None)])
    assert verdict.status is Status.FAIL and "Tcp probe" in verdict.summary and "Http" in verdict.fix


def test_no_probe_on_the_agents_port_warns() -> None:
    verdict = _lb([_probe(port=80)])
    assert verdict.status is Status.WARN and "port 8090" in verdict.summary


def test_another_path_or_other_drain_values_warn() -> None:
    assert _lb([_probe(request_path="/")]).status is Status.WARN
    other = _lb([_probe()], interval=15.0, threshold=2)
    assert other.status is Status.WARN and "15 s x 2" in other.summary


def test_the_slowest_probe_on_the_port_counts() -> None:
    verdict = _lb([_probe(name="fast"), _probe(name="slow", interval=10.0)], wait=15.0)
    assert verdict.status is Status.FAIL and verdict.details["probe"] == "slow"


def test_repairs_off_pass() -> None:
    assert repairs_verdict(enabled=False, grace_period=None, repair_action=None, health_source=None,
                           drain_probe_source=False).status is Status.PASS


def test_a_ten_minute_grace_on_the_drain_probe_fails() -> None:
    verdict = repairs_verdict(enabled=True, grace_period="PT10M", repair_action="Replace",
                              health_source="load balancer probe p", drain_probe_source=True)
    assert verdict.status is Status.FAIL and "10 min" in verdict.summary and "replaced" in verdict.summary
    assert "gracePeriod=PT20M" in verdict.fix


def test_no_grace_means_arms_default_ten_minutes() -> None:
    verdict = repairs_verdict(enabled=True, grace_period=None, repair_action=None,
                              health_source="load balancer probe p", drain_probe_source=True)
    assert verdict.status is Status.FAIL and verdict.details["grace_seconds"] == 600.0


def test_a_grace_longer_than_the_longest_drain_passes() -> None:
    verdict = repairs_verdict(enabled=True, grace_period="PT30M", repair_action="Restart",
                              health_source="load balancer probe p", drain_probe_source=True)
    assert verdict.status is Status.PASS and "longer than the longest drain (15 min)" in verdict.summary


def test_repairs_from_another_health_source_pass_and_without_one_warn() -> None:
    other = repairs_verdict(enabled=True, grace_period="PT10M", repair_action=None,
                            health_source="the Application Health extension (http port 8091 /app)",
                            drain_probe_source=False)
    assert other.status is Status.PASS and "not from the drain probe" in other.summary
    none = repairs_verdict(enabled=True, grace_period="PT10M", repair_action=None, health_source=None,
                           drain_probe_source=False)
    assert none.status is Status.WARN and "no health source" in none.summary


def test_an_extension_asking_the_agent_for_a_path_it_does_not_serve_fails_with_repairs_and_warns_without() -> None:
    source = "the Application Health extension (http port 8090 /)"
    on = repairs_verdict(enabled=True, grace_period="PT30M", repair_action=None, health_source=source,
                         drain_probe_source=False, unserved="port 9110 /apphealth")
    assert on.status is Status.FAIL and "every VM reads Unhealthy and is replaced" in on.summary
    assert on.fix == ("point the extension's requestPath at the agent's application health endpoint "
                      "(port 9110 /apphealth)")
    off = repairs_verdict(enabled=False, grace_period=None, repair_action=None, health_source=source,
                          drain_probe_source=False, unserved="port 9110 /apphealth")
    assert off.status is Status.WARN


def test_an_unreadable_grace_warns() -> None:
    assert repairs_verdict(enabled=True, grace_period="ten minutes", repair_action=None, health_source="x",
                           drain_probe_source=True).status is Status.WARN


def test_terminate_notifications_off_warn() -> None:
    verdict = terminate_verdict(enabled=False, not_before_timeout=None, drain_wait=35.0, lapse=32.0)
    assert verdict.status is Status.WARN and "without a Terminate event" in verdict.summary
    assert "--enable-terminate-notification true" in verdict.fix


def test_terminate_notice_against_the_drain_wait_and_a_lost_agent() -> None:
    assert terminate_verdict(enabled=True, not_before_timeout="PT10M", drain_wait=35.0, lapse=32.0).status \
        is Status.PASS
    # 5 minutes when the profile gives no notBeforeTimeout.
    short = terminate_verdict(enabled=True, not_before_timeout=None, drain_wait=300.0, lapse=32.0)
    assert short.status is Status.FAIL and "5 min of notice" in short.summary
    lost = terminate_verdict(enabled=True, not_before_timeout="PT5M", drain_wait=280.0, lapse=32.0)
    assert lost.status is Status.WARN and "lost agent" in lost.summary


def test_os_image_notifications_are_reported() -> None:
    verdict = terminate_verdict(enabled=True, not_before_timeout="PT15M", drain_wait=35.0, lapse=32.0,
                                os_image="on (PT15M)")
    assert "OS image notifications on (PT15M)" in verdict.summary


def test_automatic_approvals_warn_and_name_the_setting() -> None:
    assert auto_approve_verdict(reboot=False, redeploy=None, resource="scale set web").status is Status.PASS
    verdict = auto_approve_verdict(reboot=True, redeploy=True, resource="scale set web")
    assert verdict.status is Status.WARN and "never appear as Scheduled" in verdict.summary
    assert "userInitiatedReboot.automaticallyApprove=false" in verdict.fix
    assert "userInitiatedRedeploy.automaticallyApprove=false" in verdict.fix


@pytest.mark.parametrize(("priority", "status"), [(None, Status.PASS), ("Regular", Status.PASS),
                                                  ("Spot", Status.WARN), ("Low", Status.WARN)])
def test_spot_warns(priority: str | None, status: Status) -> None:
    verdict = spot_verdict(priority=priority, resource="VM vm0")
    assert verdict.status is status
    if status is Status.WARN:
        assert "Preempt with 30 s of notice" in verdict.summary and verdict.fix


def test_repairs_reading_the_drain_probe_lead_with_the_application_health_endpoint() -> None:
    verdict = repairs_verdict(enabled=True, grace_period="PT10M", repair_action="Replace",
                              health_source="load balancer probe p", drain_probe_source=True,
                              app_health="port 9110 /apphealth")
    assert verdict.status is Status.FAIL
    assert verdict.fix.startswith("take the repairs' health source off the drain probe: point the Application "
                                  "Health extension at the agent's application health endpoint (port 9110 /apphealth)")
    assert verdict.fix.index("/apphealth") < verdict.fix.index("gracePeriod")


def test_the_repairs_check_names_where_this_configuration_serves_application_health(tmp_path: Path) -> None:
    from coordinator.config import Settings
    from coordinator.doctor.azure import AzureSeen, check_repairs
    from coordinator.doctor.context import Context

    lb = f"{SUB}/Microsoft.Network/loadBalancers/lb"
    scale_set = {"properties": {
        "automaticRepairsPolicy": {"enabled": True, "gracePeriod": "PT10M"},
        "virtualMachineProfile": {"networkProfile": {"healthProbe": {"id": f"{lb}/probes/drain"}}},
    }}
    balancer = {"name": "lb", "properties": {"probes": [
        {"name": "drain", "properties": {"protocol": "Http", "port": 8090, "requestPath": "/health"}}]}}
    settings = Settings.model_validate({"cluster": "web", "state_file": None, "http": {"listen": "127.0.0.1:9200"},
                                        "app_health": {"listen": "127.0.0.1:9111"}})
    ctx = Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 5,
                  azure=AzureSeen(load_balancers={lb.lower(): balancer}, scale_set=scale_set,
                                  scale_set_id=f"{SUB}/Microsoft.Compute/virtualMachineScaleSets/web"))
    verdict = check_repairs(ctx)
    assert verdict.status is Status.FAIL
    assert "application health endpoint (port 9111 /apphealth or port 9200 /apphealth)" in verdict.fix
