"""The fallback is visible: an action that held by a fallback is reported with outcome ``fallback`` (not
``ok``), the ``azure-lb`` action's failures to use ARM are counted by cause in
``coordinator_admin_state_failures_total``, and the runtime hands the action that counter."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from coordinator.actions import ActionContext, ProbeAction, ProbeState, run_drain, run_recover
from coordinator.config import AzureLbActionConfig, load_settings
from coordinator.errors import ActionError
from coordinator.metrics import ACTION_OUTCOMES, ADMIN_STATE_CAUSES, Metrics

POOL = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg/providers/Microsoft.Network/"
        "loadBalancers/lb/backendAddressPools/web")
CTX = ActionContext("vm0", ())


class Timings:
    def __init__(self) -> None:
        self.actions: list[tuple[str, str, str]] = []
        self.jobs: list[tuple[str, str]] = []

    def action_done(self, phase: str, action: str, outcome: str, seconds: float) -> None:
        self.actions.append((phase, action, outcome))

    def job_done(self, phase: str, outcome: str, seconds: float) -> None:
        self.jobs.append((phase, outcome))


class FallsBack:
    name = "lb"
    always_recover = False

    def __init__(self, said: str | None = "lb drain fell back to the health probe alone: 403") -> None:
        self.said = said

    def drain(self, ctx: ActionContext) -> str | None:
        return self.said

    def recover(self, ctx: ActionContext) -> None:
        raise ActionError("lb: still Down")


def test_an_action_that_held_by_a_fallback_is_reported_as_fallback_and_its_job_as_ok() -> None:
    timings = Timings()
    said = run_drain([ProbeAction(ProbeState()), FallsBack()], CTX, timings=timings)
    assert said == ("lb drain fell back to the health probe alone: 403",)
    assert timings.actions == [("drain", "probe", "ok"), ("drain", "lb", "fallback")]
    assert timings.jobs == [("drain", "ok")]


def test_an_action_that_returned_nothing_or_failed_is_ok_or_failed_as_before() -> None:
    timings = Timings()
    assert run_drain([FallsBack(None)], CTX, timings=timings) == ()
    with pytest.raises(ActionError):
        run_recover([FallsBack()], CTX, timings=timings)
    assert timings.actions == [("drain", "lb", "ok"), ("recover", "lb", "failed")]
    assert {outcome for _, _, outcome in timings.actions} <= set(ACTION_OUTCOMES)


def test_the_fallback_outcome_reaches_the_action_histogram() -> None:
    metrics = Metrics(CollectorRegistry())
    run_drain([FallsBack()], CTX, timings=metrics)
    get = metrics.registry.get_sample_value
    assert get("coordinator_action_duration_seconds_count", {"phase": "drain", "action": "lb",
                                                             "outcome": "fallback"}) == 1
    assert get("coordinator_action_duration_seconds_count", {"phase": "drain", "action": "lb", "outcome": "ok"}) is None
    assert get("coordinator_job_duration_seconds_count", {"phase": "drain", "outcome": "ok"}) == 1


def _failures(metrics: Metrics, cause: str) -> float | None:
    return metrics.registry.get_sample_value("coordinator_admin_state_failures_total", {"cause": cause})


def test_admin_state_failures_are_counted_by_cause_and_unknown_causes_fold_into_other() -> None:
    metrics = Metrics(CollectorRegistry())
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE coordinator_admin_state_failures_total counter" in text  # declared before any failure
    assert "# HELP coordinator_admin_state_failures_total Times the azure-lb action could not set" in text
    assert _failures(metrics, "forbidden") is None  # no azure-lb action: no series
    metrics.admin_state_expected()
    assert all(_failures(metrics, cause) == 0 for cause in ADMIN_STATE_CAUSES)  # increase() sees the first
    metrics.admin_state_failed("forbidden")
    metrics.admin_state_failed("forbidden")
    metrics.admin_state_failed("unreachable")
    metrics.admin_state_failed("something new")
    assert (_failures(metrics, "forbidden"), _failures(metrics, "unreachable"), _failures(metrics, "other")) == \
        (2, 1, 1)
    assert _failures(metrics, "something new") is None


def _settings(tmp_path: Path) -> Any:
    path = tmp_path / "c.yaml"
    path.write_text(f"cluster: web\nvm_name: vm0\nstate_file: null\nactions:\n  - type: azure-lb\n"
                    f"    backend_pools: [{POOL}]\n    backend_address: vm0\n")
    return load_settings(path, environ={})


def test_the_runtime_hands_each_azure_lb_action_the_failure_counter(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import coordinator.actions.azure_lb as azure_lb
    from coordinator.runtime import build_actions

    built: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, *args: Any, **options: Any) -> None:
            built.append(options)
            self.name = args[0]

    monkeypatch.setattr(azure_lb, "AzureLbAction", Recorder)
    settings = _settings(tmp_path)
    assert isinstance(settings.actions[0], AzureLbActionConfig)
    metrics = Metrics(CollectorRegistry())
    build_actions(settings, on_admin_state_failure=metrics.admin_state_failed)
    assert len(built) == 1 and built[0]["on_failure"] == metrics.admin_state_failed
    build_actions(settings)
    assert built[1]["on_failure"] is None


class _NoRole:
    """ARM as an identity without a role on the pool meets it: 403 on every read."""

    def get_resource(self, resource_id: str, deadline: float, **options: Any) -> dict[str, Any]:
        from coordinator.azure_arm import ArmRefused

        raise ArmRefused(f"GET {resource_id}: 403 AuthorizationFailed: no role", 403, "AuthorizationFailed")


def test_the_cause_label_takes_every_cause_arm_errors_have_and_other() -> None:
    from coordinator.azure_arm import ARM_CAUSES

    assert (*ARM_CAUSES, "other") == ADMIN_STATE_CAUSES


def test_a_drain_that_falls_back_and_a_recovery_that_fails_count_their_cause() -> None:
    from coordinator.actions.azure_lb import ArmClient, ArmError, AzureLbAction

    metrics = Metrics(CollectorRegistry())
    metrics.admin_state_expected()
    action = AzureLbAction("azure-lb", [POOL], "vm0", cast(ArmClient, _NoRole()),
                           on_failure=metrics.admin_state_failed)
    assert run_drain([action], CTX, timings=metrics)
    with pytest.raises(ArmError) as failed:
        run_recover([action], CTX, timings=metrics)
    assert failed.value.outside_vm is True
    assert _failures(metrics, "forbidden") == 2
    assert sum(_failures(metrics, cause) or 0 for cause in ADMIN_STATE_CAUSES) == 2
