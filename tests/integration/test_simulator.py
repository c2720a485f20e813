"""The IMDS simulator over real HTTP on loopback, run as a subprocess (``python -m coordinator.sim``).

Each test starts its own simulator on free ports (``imds_sim`` fixture) and waits on conditions with
deadlines, never for a fixed time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from coordinator.sim import SimControlError
from tests.plugins.simulator import RunningSimulator, SimulatorFactory

API = "2020-07-01"
METADATA = {"Metadata": "true"}
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        yield client


@pytest.fixture
def sim(imds_sim: SimulatorFactory) -> RunningSimulator:
    """Three VMs, no rate limit: for the tests that are not about the rate limit."""
    return imds_sim(vms=("vm0", "vm1", "vm2"), rate_limit=0)


@pytest.fixture(scope="module")
def idle_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSimulator]:
    """One simulator shared by the tests that only read and change nothing (no events, no faults)."""
    factory = SimulatorFactory(tmp_path_factory.mktemp("idle-imds-sim"))
    try:
        yield factory(vms=("vm0", "vm1", "vm2"), rate_limit=0)
    finally:
        factory.stop_all()


def get(http: httpx.Client, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return http.get(url, headers=METADATA if headers is None else headers)


def approve(http: httpx.Client, sim: RunningSimulator, vm: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(sim.url(vm), content=content, headers={**METADATA, "Content-Type": "application/json"})


# -- start, stop, ready file -----------------------------------------------------------------------


def test_subprocess_reports_its_urls_and_answers_health(imds_sim: SimulatorFactory) -> None:
    sim = imds_sim(vms=("vm0", "vm1"))
    assert sim.pid is not None
    assert set(sim.urls) == {"vm0", "vm1"}
    assert len({url for url in sim.urls.values()} | {sim.control_url}) == 3
    health = sim.control.healthz()
    assert health == {"status": "ok", "vms": sim.urls, "incarnation": 1}


def test_sigterm_stops_cleanly_and_removes_the_ready_file(imds_sim: SimulatorFactory) -> None:
    sim = imds_sim(vms=("vm0",))
    assert sim.stderr_path is not None
    ready_file = sim.stderr_path.parent / "ready.json"
    assert ready_file.exists()
    assert sim.stop() == 0
    assert not ready_file.exists()
    assert "IMDS simulator stopping" in sim.stderr()


def test_default_simulator_of_the_factory(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    assert set(imds_sim.urls) == {"vm0", "vm1", "vm2"}
    assert imds_sim.pid == imds_sim.default.pid
    response = get(http, imds_sim.default.url("vm1"))
    assert response.json() == {"DocumentIncarnation": 1, "Events": []}
    assert imds_sim.control.events()["incarnation"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vms", "vm0,bad/name"], "invalid VM name"),
        (["--vm", "vm0=127.0.0.1"], "expected HOST:PORT"),
        (["--vm", "vm0=127.0.0.1:0", "--vms", "VM0"], "given twice"),
        (["--base-port", "70000"], "out of range"),
    ],
)
def test_cli_refuses_bad_arguments_with_exit_status_2(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "coordinator.sim", "--control", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=20,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 2
    assert message in result.stderr


# -- request rules ---------------------------------------------------------------------------------


def test_missing_metadata_header_is_refused_with_the_imds_text(
    idle_sim: RunningSimulator, http: httpx.Client
) -> None:
    response = get(http, idle_sim.url("vm0"), headers={})
    assert response.status_code == 400
    assert response.json() == {"error": "Bad request. Required metadata header not specified"}
    assert get(http, idle_sim.url("vm0"), headers={"Metadata": "false"}).status_code == 400
    assert get(http, idle_sim.url("vm0"), headers={"Metadata": "True"}).status_code == 200


def test_x_forwarded_for_is_refused(idle_sim: RunningSimulator, http: httpx.Client) -> None:
    response = get(http, idle_sim.url("vm0"), headers={**METADATA, "X-Forwarded-For": "10.0.0.1"})
    assert response.status_code == 400
    assert "X-Forwarded-For" in response.json()["error"]


@pytest.mark.parametrize(
    "query", ["", "?api-version=%7Blatest%7D", "?api-version=2018-01-01", "?format=json"]
)
def test_missing_or_unknown_api_version_is_refused(
    idle_sim: RunningSimulator, http: httpx.Client, query: str
) -> None:
    response = get(http, idle_sim.urls["vm0"] + "/metadata/scheduledevents" + query)
    assert response.status_code == 400
    body = response.json()
    assert "api-version" in body["error"]
    assert "2020-07-01" in body["newest-versions"]


def test_every_documented_api_version_is_served(sim: RunningSimulator, http: httpx.Client) -> None:
    sim.control.schedule("Freeze", ["vm0"], duration_in_seconds=5)
    served = {}
    for version in ("2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", API):
        response = get(http, sim.url("vm0", api_version=version))
        assert response.status_code == 200, version
        served[version] = set(response.json()["Events"][0])
    assert "Description" not in served["2019-01-01"]
    assert "EventSource" not in served["2019-04-01"]
    assert "DurationInSeconds" not in served["2019-08-01"]
    assert {"Description", "EventSource", "DurationInSeconds"} <= served[API]


@pytest.mark.parametrize(
    "query", ["?api-version=2020-07-01&api-version=2020-07-01", "?api-version=2020-07-01&x=1&x=2"]
)
def test_duplicate_query_parameters_are_refused(
    idle_sim: RunningSimulator, http: httpx.Client, query: str
) -> None:
    response = get(http, idle_sim.urls["vm0"] + "/metadata/scheduledevents" + query)
    assert response.status_code == 400
    assert "Duplicate" in response.json()["error"]


def test_other_methods_are_refused_with_405(idle_sim: RunningSimulator, http: httpx.Client) -> None:
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        response = http.request(method, idle_sim.url("vm0"), headers=METADATA)
        assert response.status_code == 405, method
        assert response.headers["Allow"] == "GET, POST"
    response = http.post(idle_sim.url("vm0", "/metadata/instance/compute", "2021-02-01"), headers=METADATA)
    assert response.status_code == 405


def test_unknown_paths_are_404(idle_sim: RunningSimulator, http: httpx.Client) -> None:
    for path in ("/", "/metadata", "/metadata/scheduledevents/extra", "/metadata/identity/oauth2/token"):
        assert get(http, idle_sim.urls["vm0"] + path + "?api-version=" + API).status_code == 404, path


def test_rate_limit_is_five_per_second_per_vm(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    sim = imds_sim(vms=("vm0", "vm1"))
    codes = []
    for _ in range(20):
        codes.append(get(http, sim.url("vm0")).status_code)
        if codes[-1] == 429:
            break
    assert codes[:5] == [200] * 5
    assert codes[-1] == 429
    assert get(http, sim.url("vm1")).status_code == 200  # another VM has its own budget
    deadline = time.monotonic() + 3
    while get(http, sim.url("vm0")).status_code == 429:
        assert time.monotonic() < deadline, "vm0 still throttled after the window slid"
        time.sleep(0.05)
    throttled = [e for e in sim.control.log(kind="request") if e["status"] == 429]
    assert throttled and {e["vm"] for e in throttled} == {"vm0"}


# -- faults ----------------------------------------------------------------------------------------


def test_status_faults_are_served_then_cleared(sim: RunningSimulator, http: httpx.Client) -> None:
    sim.control.add_fault("status", vm="vm0", count=2, status=500)
    assert get(http, sim.url("vm0")).status_code == 500
    assert get(http, sim.url("vm1")).status_code == 200
    assert get(http, sim.url("vm0")).status_code == 500
    assert get(http, sim.url("vm0")).status_code == 200
    faults = sim.control.log(kind="fault")
    assert [(f["vm"], f["status"], f["remaining"]) for f in faults] == [("vm0", 500, 1), ("vm0", 500, 0)]

    sim.control.add_fault("status", count=None, status=503)
    assert {vm: get(http, sim.url(vm)).status_code for vm in sim.urls} == {"vm0": 503, "vm1": 503, "vm2": 503}
    assert sim.control.clear_faults() == 3
    assert {vm: get(http, sim.url(vm)).status_code for vm in sim.urls} == {"vm0": 200, "vm1": 200, "vm2": 200}


@pytest.mark.parametrize("status", [410, 429])
def test_retryable_status_faults(sim: RunningSimulator, http: httpx.Client, status: int) -> None:
    sim.control.add_fault("status", vm="vm2", status=status)
    assert get(http, sim.url("vm2")).status_code == status
    assert get(http, sim.url("vm2")).status_code == 200


def test_malformed_fault_answers_200_with_a_body_that_is_not_json(
    sim: RunningSimulator, http: httpx.Client
) -> None:
    sim.control.add_fault("malformed", vm="vm1")
    response = get(http, sim.url("vm1"))
    assert response.status_code == 200
    with pytest.raises(ValueError):
        json.loads(response.content)
    assert get(http, sim.url("vm1")).json()["DocumentIncarnation"] == 1


def test_drop_fault_closes_the_connection_without_an_answer(
    sim: RunningSimulator, http: httpx.Client
) -> None:
    sim.control.add_fault("drop", vm="vm0")
    with pytest.raises(httpx.TransportError):
        get(http, sim.url("vm0"))
    assert get(http, sim.url("vm0")).status_code == 200
    requests = [e for e in sim.control.log(kind="request") if e["vm"] == "vm0"]
    assert [e["status"] for e in requests] == [None, 200]


def test_delay_fault_answers_late(sim: RunningSimulator, http: httpx.Client) -> None:
    sim.control.add_fault("delay", vm="vm0", seconds=0.4)
    started = time.monotonic()
    assert get(http, sim.url("vm0")).status_code == 200
    assert time.monotonic() - started >= 0.4
    with pytest.raises(httpx.ReadTimeout):
        sim.control.add_fault("delay", vm="vm0", seconds=2)
        http.get(sim.url("vm0"), headers=METADATA, timeout=0.3)


def test_faults_hit_approvals_only_when_asked(sim: RunningSimulator, http: httpx.Client) -> None:
    eid = sim.control.schedule("Freeze", ["vm0"])["event_id"]
    sim.control.add_fault("status", vm="vm0", status=500, methods=["GET", "POST"])
    assert approve(http, sim, "vm0", {"StartRequests": [{"EventId": eid}]}).status_code == 500
    assert sim.control.event(eid)["status"] == "Scheduled"  # type: ignore[index]
    sim.control.add_fault("status", vm="vm0", status=500)  # GET only
    assert approve(http, sim, "vm0", {"StartRequests": [{"EventId": eid}]}).status_code == 200
    assert get(http, sim.url("vm0")).status_code == 500


def test_control_api_refuses_malformed_requests(sim: RunningSimulator) -> None:
    with pytest.raises(SimControlError) as error:
        sim.control.schedule("Freeze", ["vm0"], not_before=5)
    assert error.value.status == 400 and "not_before" in error.value.body
    with pytest.raises(SimControlError) as error:
        sim.control.add_fault("explode")
    assert error.value.status == 400
    with pytest.raises(SimControlError) as error:
        sim.control.add_fault("drop", vm="vm9")
    assert error.value.status == 404
    with pytest.raises(SimControlError) as error:
        sim.control.cancel("NO-SUCH-EVENT")
    assert error.value.status == 404
    assert sim.control.event("NO-SUCH-EVENT") is None


# -- approval and lifecycle ------------------------------------------------------------------------


def test_approval_is_logged_with_the_vm_of_the_port_it_came_to(
    sim: RunningSimulator, http: httpx.Client
) -> None:
    eid = sim.control.schedule("Freeze", ["vm0", "vm1"], duration_in_seconds=5)["event_id"]
    scheduled = get(http, sim.url("vm0")).json()
    assert scheduled["Events"][0]["EventStatus"] == "Scheduled"

    response = approve(http, sim, "vm2", {"StartRequests": [{"EventId": eid}]})
    assert (response.status_code, response.content) == (200, b"")

    [approval] = sim.control.log(kind="approval")
    assert (approval["vm"], approval["event_ids"], approval["accepted"], approval["status"]) == (
        "vm2",
        [eid],
        [eid],
        200,
    )
    started = sim.control.wait_for_transition(eid, "Started")
    assert started["reason"] == "approved"
    assert started["seq"] > approval["seq"]
    post = [e for e in sim.control.log(kind="request") if e["method"] == "POST"]
    assert [(e["vm"], e["path"], e["status"]) for e in post] == [("vm2", "/metadata/scheduledevents", 200)]

    for vm in ("vm0", "vm1", "vm2"):
        document = get(http, sim.url(vm)).json()
        assert document["DocumentIncarnation"] == scheduled["DocumentIncarnation"] + 1
        [event] = document["Events"]
        assert (event["EventId"], event["EventStatus"], event["NotBefore"]) == (eid, "Started", "")

    again = approve(http, sim, "vm1", {"StartRequests": [{"EventId": eid}], "DocumentIncarnation": 3})
    assert again.status_code == 200
    assert sim.control.log(kind="approval")[-1]["results"] == {eid: "already_started"}
    assert sim.control.event(eid)["approved_by"] == ["vm2", "vm1"]  # type: ignore[index]


MALFORMED_BODIES = [
    b"not json",
    b"[]",
    b"{}",
    b'{"StartRequests": {}}',
    b'{"StartRequests": [{"Id": "x"}]}',
    b'{"StartRequests": [], "DocumentIncarnation": "3"}',
    b"",
]


def test_malformed_approval_bodies_are_refused(idle_sim: RunningSimulator, http: httpx.Client) -> None:
    since = idle_sim.control.log()[-1]["seq"] if idle_sim.control.log() else 0
    for body in MALFORMED_BODIES:
        response = approve(http, idle_sim, "vm1", body)
        assert response.status_code == 400, body
        assert response.json()["error"].startswith("Bad request.")
    entries = idle_sim.control.log(since=since, kind="approval")
    assert [(e["vm"], e["status"]) for e in entries] == [("vm1", 400)] * len(MALFORMED_BODIES)


def test_answer_to_unknown_event_ids_is_configurable(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    lenient = imds_sim(vms=("vm0",), rate_limit=0)
    assert approve(http, lenient, "vm0", {"StartRequests": [{"EventId": "GONE"}]}).status_code == 200
    strict = imds_sim(vms=("vm0",), rate_limit=0, unknown_approval_status=400)
    response = approve(http, strict, "vm0", {"StartRequests": [{"EventId": "GONE"}]})
    assert response.status_code == 400
    assert "GONE" in response.json()["error"]


def test_ticker_starts_and_removes_events_without_any_request(
    sim: RunningSimulator, http: httpx.Client
) -> None:
    since = sim.control.log()[-1]["seq"] if sim.control.log() else 0
    event = sim.control.schedule("Preempt", ["vm1"], not_before_in=0.5, started_for=0.3)
    eid = event["event_id"]
    started = sim.control.wait_for_transition(eid, "Started", timeout=5, since=since)
    removed = sim.control.wait_for_transition(eid, None, timeout=5, since=since)
    assert started["reason"] == "not_before"
    assert removed["reason"] == "started_for_elapsed"
    assert removed["t"] - started["t"] >= 0.3
    assert sim.control.log(kind="request") == []
    assert get(http, sim.url("vm1")).json() == {"DocumentIncarnation": 4, "Events": []}


def test_hardware_failure_and_cancel_over_http(sim: RunningSimulator, http: httpx.Client) -> None:
    failed = sim.control.schedule("Reboot", ["vm2"], status="Started", started_for=60)
    pending = sim.control.schedule("Redeploy", ["vm0"])
    document = get(http, sim.url("vm0")).json()
    assert {e["EventId"]: e["EventStatus"] for e in document["Events"]} == {
        failed["event_id"]: "Started",
        pending["event_id"]: "Scheduled",
    }
    sim.control.cancel(pending["event_id"])
    events = sim.control.events()
    assert events["incarnation"] == 4
    assert [e["event_id"] for e in events["events"]] == [failed["event_id"]]
    assert sim.control.document("vm1") == get(http, sim.url("vm1")).json()


# -- compute metadata ------------------------------------------------------------------------------


def test_compute_metadata_per_vm(idle_sim: RunningSimulator, http: httpx.Client) -> None:
    for index, vm in enumerate(("vm0", "vm1", "vm2")):
        response = get(http, idle_sim.url(vm, "/metadata/instance/compute", "2021-02-01"))
        assert response.status_code == 200
        compute = response.json()
        assert compute["name"] == vm
        assert compute["vmScaleSetName"] == ""
        assert compute["platformFaultDomain"] == str(index % 2)
        assert compute["platformUpdateDomain"] == str(index % 5)
        assert compute["zone"] == ""
    assert get(http, idle_sim.url("vm0", "/metadata/instance/compute", None)).status_code == 400
    instance = get(http, idle_sim.url("vm1", "/metadata/instance", "2021-02-01")).json()
    assert instance["compute"]["name"] == "vm1"


def test_compute_metadata_of_scale_set_instances(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    sim = imds_sim(vms=("pool_0", "pool_1"), scale_set="pool", rate_limit=0)
    compute = get(http, sim.url("pool_1", "/metadata/instance/compute", "2021-02-01")).json()
    assert (compute["name"], compute["vmScaleSetName"]) == ("pool_1", "pool")


def test_in_process_variant_shares_the_model(
    imds_sim_inprocess: SimulatorFactory, http: httpx.Client
) -> None:
    sim = imds_sim_inprocess(vms=("vm0", "vm1"), rate_limit=0)
    assert sim.pid is None and sim.group is not None
    eid = sim.group.schedule("Freeze", ["vm1"])["event_id"]
    assert approve(http, sim, "vm0", {"StartRequests": [{"EventId": eid}]}).status_code == 200
    assert get(http, sim.url("vm1")).json()["Events"][0]["EventStatus"] == "Started"
    assert sim.group.log(kind="approval")[0]["vm"] == "vm0"
