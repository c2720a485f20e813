"""Warnings about a valid configuration: drain waits against each type's notice and the load balancer's
probe lag, and environment variables that look like overrides but are not read; as ``check-config``
prints them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coordinator.cli import main
from coordinator.config import Settings, config_warnings, environment_warnings

ROOT = Path(__file__).parent.parent.parent
POOL = ("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/lb/"
        "backendAddressPools/pool")


def _settings(**options: Any) -> Settings:
    return Settings.model_validate({"cluster": "web", "state_file": None, **options})


def test_the_defaults_and_the_shipped_examples_draw_no_warning() -> None:
    from coordinator.config import load_settings

    assert config_warnings(_settings(), environ={}) == []
    for path in [ROOT / "deploy/coordinator.example.yaml", *sorted((ROOT / "deploy/examples").glob("*.yaml"))]:
        if "zookeeper-auth-tls" in path.name:
            continue  # reads password and certificate files at load time
        assert config_warnings(load_settings(path, environ={}), environ={}) == [], path


def test_a_preempt_wait_not_shorter_than_its_notice_warns() -> None:
    [warning] = config_warnings(_settings(drain={"wait_seconds_by_type": {"Preempt": 40}}), environ={})
    assert warning.startswith("drain.wait_seconds_by_type.Preempt (40 s) is not shorter than a Preempt's 30 s "
                              "of notice: a Preempt is then never approved early")
    # Without its own entry a Preempt gets the 35 s drain wait, computed from the probe.
    [dropped] = config_warnings(_settings(drain={"wait_seconds_by_type": {"Preempt": None}}), environ={})
    assert dropped.startswith("the drain wait (35 s: drain.probe_interval_seconds x drain.probe_threshold")
    # Approved at once, a Preempt waits for no drain: nothing to say.
    assert config_warnings(_settings(drain={"wait_seconds_by_type": {"Preempt": 40}},
                                     policy={"approval": {"Preempt": "immediately"}}), environ={}) == []


def test_a_drain_wait_shorter_than_the_probe_lag_warns() -> None:
    [warning] = config_warnings(_settings(drain={"wait_seconds": 20}), environ={})
    assert warning.startswith("drain.wait_seconds (20 s) is shorter than the load balancer's probe lag "
                              "(drain.probe_interval_seconds x drain.probe_threshold = 30 s): Freeze, Reboot, "
                              "Redeploy and Terminate are acknowledged while the load balancer still sends new flows")
    [one] = config_warnings(_settings(drain={"wait_seconds_by_type": {"Reboot": 10}}), environ={})
    assert one.startswith("drain.wait_seconds_by_type.Reboot (10 s) is shorter than") and ": Reboot is " in one
    # A faster probe covered by the wait is fine; the Preempt's 5 s is the documented choice either way.
    assert config_warnings(_settings(drain={"wait_seconds": 20, "probe_interval_seconds": 5}), environ={}) == []


def test_with_admin_state_only_the_fallback_wait_must_cover_the_probe_lag() -> None:
    action = {"type": "azure-lb", "backend_pools": [POOL], "backend_address": "web-0"}
    assert config_warnings(_settings(drain={"wait_seconds": 20}, actions=[action]), environ={}) == []
    [warning] = config_warnings(_settings(actions=[{**action, "fallback_wait_seconds": 10}]), environ={})
    assert warning.startswith("actions.0.fallback_wait_seconds (10 s) is shorter than the load balancer's probe lag")


def test_misnamed_overrides_are_named_with_the_name_they_need() -> None:
    warnings = environment_warnings({
        "COORDINATOR_ZOOKEEPER_HOSTS": "zk1:2181",
        "coordinator__drain__wait_seconds": "45",
        "Coordinator_Drain_Wait_Seconds_By_Type": "{Reboot: 60}",
        "COORDINATOR_SOMETHING": "x",
        "COORDINATOR__ZOOKEEPER__ROOT": "/am",  # an override: read, nothing to say
        "COORDINATOR_VM": "web-0",  # set by the agent for its commands
        "COORDINATORS": "x",
    })
    assert warnings == [
        "environment variable COORDINATOR_SOMETHING is ignored: overrides are named COORDINATOR__SECTION__OPTION, "
        "in capitals, with two underscores between the parts",
        "environment variable COORDINATOR_ZOOKEEPER_HOSTS is ignored: overrides are named "
        "COORDINATOR__SECTION__OPTION, in capitals, with two underscores between the parts; to set "
        "zookeeper.hosts, name it COORDINATOR__ZOOKEEPER__HOSTS",
        "environment variable Coordinator_Drain_Wait_Seconds_By_Type is ignored: overrides are named "
        "COORDINATOR__SECTION__OPTION, in capitals, with two underscores between the parts; to set "
        "drain.wait_seconds_by_type, name it COORDINATOR__DRAIN__WAIT_SECONDS_BY_TYPE",
        "environment variable coordinator__drain__wait_seconds is ignored: overrides are named "
        "COORDINATOR__SECTION__OPTION, in capitals, with two underscores between the parts; to set "
        "drain.wait_seconds, name it COORDINATOR__DRAIN__WAIT_SECONDS",
    ]


def _check_config(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["check-config", "--config", str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_config_prints_each_warning_and_still_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("cluster: web\nstate_file: null\ndrain:\n  wait_seconds_by_type: {Preempt: 40}\n")
    monkeypatch.setenv("COORDINATOR_ZOOKEEPER_HOSTS", "zk1:2181")
    code, out, err = _check_config(path, capsys)
    assert code == 0 and '"cluster": "web"' in out
    assert f"coordinator: {path}: warning: environment variable COORDINATOR_ZOOKEEPER_HOSTS is ignored" in err
    assert f"coordinator: {path}: warning: drain.wait_seconds_by_type.Preempt (40 s) is not shorter" in err
    assert err.rstrip().endswith("configuration is valid")


def test_check_config_names_a_misnamed_override_beside_the_error_it_may_explain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("state_file: null\n")
    monkeypatch.setenv("COORDINATOR_CLUSTER", "web")
    code, _, err = _check_config(path, capsys)
    assert code == 2 and "cluster: Field required" in err
    assert "warning: environment variable COORDINATOR_CLUSTER is ignored" in err and "COORDINATOR__CLUSTER" in err


def test_run_names_a_misnamed_override_beside_the_error_it_may_explain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``coordinator run`` says what check-config says: a misnamed override is never silent where the agent
    runs (a valid file with it is warned about in the agent's log at start, before the agent runs)."""
    path = tmp_path / "agent.yaml"
    path.write_text("state_file: null\n")
    monkeypatch.setenv("COORDINATOR_CLUSTER", "web")
    code = main(["run", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "cluster: Field required" in err
    assert "warning: environment variable COORDINATOR_CLUSTER is ignored" in err and "COORDINATOR__CLUSTER" in err


# --- the delivery ---------------------------------------------------------------------------------------


def test_unit_delivery_whose_unit_cannot_be_learnt_warns() -> None:
    [warning] = config_warnings(_settings(vm_name="web-0", imds={"delivery": "unit"}), environ={})
    assert warning.startswith("imds.delivery is unit, but imds.unit is not set and vm_name is, so the agent does not "
                              "read its unit from IMDS (a scale-set instance's placementGroupId): a VM speaks only "
                              "for events of a unit it knows, so unit-wide delivery helps nothing; set imds.unit")
    # A unit configured, or learnt from IMDS with the name (no vm_name), or another mode: nothing to say.
    assert config_warnings(_settings(vm_name="web-0", imds={"delivery": "unit", "unit": "as-web"}), environ={}) == []
    assert config_warnings(_settings(imds={"delivery": "unit"}), environ={}) == []
    assert config_warnings(_settings(vm_name="web-0", imds={"delivery": "named"}), environ={}) == []
    assert config_warnings(_settings(vm_name="web-0"), environ={}) == []


@pytest.mark.parametrize(("options", "said"), [
    ({"imds": {"unit": "pg0", "delivery": "unit"}}, "unit pg0, every event of the unit"),
    ({"imds": {"delivery": "named"}},
     "unit from IMDS (placementGroupId; unknown outside a scale set), only events naming this VM"),
    ({}, "unit from IMDS (placementGroupId; unknown outside a scale set), auto (every event of the unit once this "
         "VM's documents list an event naming other VMs and not it; until then only events naming it)"),
    ({"vm_name": "web-0", "imds": {"delivery": "unit"}},
     "unit unknown (vm_name is set and imds.unit is not), every event of the unit"),
])
def test_check_config_says_the_delivery_as_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: dict[str, Any], said: str
) -> None:
    import yaml

    from coordinator.config.advice import delivery_said

    assert delivery_said(_settings(**options)) == said
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"cluster": "web", "state_file": None, **options}))
    code, out, err = _check_config(path, capsys)
    assert code == 0 and '"cluster": "web"' in out
    lines = err.rstrip().splitlines()
    assert lines[-2:] == [f"coordinator: {path}: delivery: {said}", f"coordinator: {path}: configuration is valid"]
