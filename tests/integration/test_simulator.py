"""The IMDS simulator over real HTTP on loopback, run as a subprocess (``python -m azuresim``).

Each test starts its own simulator on free ports (``imds_sim`` fixture) and waits on conditions with
deadlines, never for a fixed time.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from azuresim import SimControlError
from coordinator.models import parse_not_before
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
    assert {k: health[k] for k in ("status", "vms", "incarnation", "time_scale", "replay")} == {
        "status": "ok",
        "vms": sim.urls,
        "incarnation": 1,
        "time_scale": 1.0,
        "replay": False,
    }
    assert abs(health["now"] - time.time()) < 5


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


def assert_refused(args: list[str], message: str) -> None:
    """The simulator's command line, given ``args``, exits with status 2 and says ``message``."""
    result = subprocess.run(
        [sys.executable, "-m", "azuresim", "--control", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=20,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 2
    assert message in result.stderr


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
    assert_refused(args, message)


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
    # /metadata/identity/oauth2/token is served now (tests/integration/test_simulator_azure.py).
    for path in ("/", "/metadata", "/metadata/scheduledevents/extra", "/metadata/identity/oauth2/other"):
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


def test_body_fault_serves_exact_bytes_over_http_until_cleared(sim: RunningSimulator, http: httpx.Client) -> None:
    raw = "{\"DocumentIncarnation\": 1, \"Events\": []}".encode("utf-16")
    sim.control.add_fault(
        "body", vm="vm2", count=None, body=base64.b64encode(raw).decode(), repeat=2, status=503,
        content_type="text/html", headers={"X-Served-By": "fault"},
    )
    for _ in range(2):
        response = get(http, sim.url("vm2"))
        assert response.status_code == 503 and response.content == raw * 2
        assert response.headers["Content-Type"] == "text/html" and response.headers["X-Served-By"] == "fault"
    assert sim.control.clear_faults("vm2") == 1
    assert get(http, sim.url("vm2")).json()["DocumentIncarnation"] == 1
    # A declared length beyond the bytes sent: the answer is cut short and the connection closed.
    sim.control.add_fault("body", vm="vm2", body=base64.b64encode(b"{}").decode(), content_length=10)
    with pytest.raises(httpx.TransportError):
        get(http, sim.url("vm2"))
    assert get(http, sim.url("vm2")).status_code == 200


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


# -- time scale, first call, idle reset ------------------------------------------------------------


def test_time_scale_runs_the_documented_notice_in_real_seconds(
    imds_sim: SimulatorFactory, http: httpx.Client
) -> None:
    sim = imds_sim(vms=("vm0",), rate_limit=0, time_scale=60, started_for=30)
    assert sim.control.healthz()["time_scale"] == 60
    event = sim.control.schedule("Preempt", ["vm0"])  # 30 s of notice: half a real second
    assert event["not_before"] - event["created_at"] == pytest.approx(30, abs=1)
    served = get(http, sim.url("vm0")).json()["Events"][0]
    assert served["NotBefore"] == event["not_before_text"]  # rendered in the simulated clock
    started = sim.control.wait_for_transition(event["event_id"], "Started", timeout=5)
    removed = sim.control.wait_for_transition(event["event_id"], None, timeout=5)
    assert started["reason"] == "not_before"
    assert started["sim_t"] >= event["not_before"]
    assert removed["sim_t"] - started["sim_t"] >= 30
    assert 0.4 <= removed["t"] - started["t"] < 3  # 30 simulated seconds are half a real second


def test_not_before_in_real_time_under_a_time_scale(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    sim = imds_sim(vms=("vm0",), rate_limit=0, time_scale=60, extra_args=["--not-before-clock", "real"])
    before = time.time()
    sim.control.schedule("Freeze", ["vm0"])  # 900 simulated seconds: 15 real ones
    served = parse_not_before(get(http, sim.url("vm0")).json()["Events"][0]["NotBefore"])
    assert served is not None
    assert before + 14 <= served.timestamp() <= time.time() + 17


def test_first_call_is_held_per_vm_and_scaled(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    sim = imds_sim(vms=("vm0", "vm1"), rate_limit=0, time_scale=100, extra_args=["--first-call-delay", "60"])
    for vm in ("vm0", "vm1"):
        started = time.monotonic()
        assert get(http, sim.url(vm)).status_code == 200
        assert time.monotonic() - started >= 0.6, vm
    started = time.monotonic()
    assert get(http, sim.url("vm0")).status_code == 200
    assert time.monotonic() - started < 0.5
    enabled = sim.control.log(kind="service")
    assert [(e["vm"], e["action"], e["delay"]) for e in enabled] == [("vm0", "enabled", 60), ("vm1", "enabled", 60)]


def test_idle_vm_gets_a_low_incarnation_again(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    sim = imds_sim(vms=("vm0",), rate_limit=0, time_scale=100, extra_args=["--idle-reset-after", "30"])
    sim.control.schedule("Freeze", ["vm0"], not_before_in=86400 * 7)
    sim.control.schedule("Freeze", ["vm0"], not_before_in=86400 * 7)
    assert get(http, sim.url("vm0")).json()["DocumentIncarnation"] == 3
    last = sim.control.now()
    sim.control.wait_for(lambda c: c.now() >= last + 31, timeout=5, message="30 idle simulated seconds")
    document = get(http, sim.url("vm0")).json()
    assert document["DocumentIncarnation"] == 1
    assert len(document["Events"]) == 2
    assert [e["action"] for e in sim.control.log(kind="service")] == ["enabled", "reset", "enabled"]


def test_incarnation_skip_and_reset_over_http(sim: RunningSimulator, http: httpx.Client) -> None:
    sim.control.schedule("Freeze", ["vm0"])
    [entry] = sim.control.skip_incarnation(by=2, vm="vm1")
    assert entry["served"] == 4
    assert get(http, sim.url("vm1")).json()["DocumentIncarnation"] == 4
    assert get(http, sim.url("vm0")).json()["DocumentIncarnation"] == 2
    assert [e["served"] for e in sim.control.reset_incarnation()] == [1, 1, 1]
    assert {get(http, sim.url(vm)).json()["DocumentIncarnation"] for vm in sim.urls} == {1}


# -- more faults -----------------------------------------------------------------------------------


def test_refused_port_is_closed_then_listens_again_on_the_same_port(
    sim: RunningSimulator, http: httpx.Client
) -> None:
    assert get(http, sim.url("vm0")).status_code == 200  # a keep-alive connection is open now
    started = time.monotonic()
    sim.control.refuse("vm0", 1.0)
    deadline = time.monotonic() + 5
    while True:  # the refusal starts within a moment; a cut keep-alive connection may show first
        try:
            get(http, sim.url("vm0"))
        except httpx.ConnectError as exc:
            assert "refused" in str(exc).lower()
            break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "vm0 kept accepting connections"
        time.sleep(0.02)
    assert get(http, sim.url("vm1")).status_code == 200  # other VMs are untouched
    deadline = time.monotonic() + 10
    while True:
        try:
            assert get(http, sim.url("vm0")).status_code == 200
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "vm0 never listened again"
            time.sleep(0.05)
    assert time.monotonic() - started >= 1.0
    assert sim.control.healthz()["vms"]["vm0"] == sim.urls["vm0"]
    faults = [e["fault"] for e in sim.control.log(kind="fault") if e["vm"] == "vm0"]
    assert faults == ["refuse", "refuse_ended"]


@pytest.mark.parametrize(("field", "kind"), [("DocumentIncarnation", str), ("Resources", str), ("Events", str)])
def test_wrong_type_fault_serves_a_field_of_the_wrong_type(
    sim: RunningSimulator, http: httpx.Client, field: str, kind: type
) -> None:
    sim.control.schedule("Freeze", ["vm0", "vm1"])
    sim.control.add_fault("wrong_type", vm="vm0", field=field)
    body = get(http, sim.url("vm0")).json()
    value = body[field] if field != "Resources" else body["Events"][0]["Resources"]
    assert isinstance(value, kind)
    assert isinstance(get(http, sim.url("vm0")).json()["DocumentIncarnation"], int)


# -- impacts on real processes ---------------------------------------------------------------------


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat: S sleeping, T stopped, Z zombie."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process of our own for the simulator to pause and kill."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.kill()
    process.wait(5)


def test_freeze_impact_stops_and_continues_a_registered_process(
    sim: RunningSimulator, sleeper: subprocess.Popen[bytes]
) -> None:
    assert sim.control.register_pids("vm1", [sleeper.pid]) == {"vm": "vm1", "pids": [sleeper.pid]}
    assert sim.control.pids("vm1") == [sleeper.pid]
    event = sim.control.schedule("Freeze", ["vm1"], status="Started", impact_seconds=0.5, started_for=30)
    sim.control.wait_for(lambda c: process_state(sleeper.pid) == "T", timeout=2, message="the process stopped")
    sim.control.wait_for(lambda c: process_state(sleeper.pid) != "T", timeout=5, message="the process continued")
    signals = [(e["pid"], e["signal"], e["result"]) for e in sim.control.log(kind="signal")]
    assert signals == [(sleeper.pid, "SIGSTOP", "sent"), (sleeper.pid, "SIGCONT", "sent")]
    # A second impact while Started: logged, the event stays Started, and the process pauses again.
    entry = sim.control.impact(event["event_id"], seconds=0.3, pause=True)
    assert entry["reason"] == "second"
    sim.control.wait_for(lambda c: len(c.log(kind="signal")) == 4, timeout=5, message="second pause over")
    assert sim.control.event(event["event_id"])["status"] == "Started"  # type: ignore[index]
    assert sleeper.poll() is None


def test_reboot_impact_kills_a_registered_process(sim: RunningSimulator, sleeper: subprocess.Popen[bytes]) -> None:
    sim.control.register_pids("vm2", [sleeper.pid])
    eid = sim.control.schedule("Reboot", ["vm2"], not_before_in=300)["event_id"]
    assert sleeper.poll() is None  # Scheduled: nothing happens
    with httpx.Client(trust_env=False) as client:
        client.post(sim.url("vm0"), json={"StartRequests": [{"EventId": eid}]}, headers=METADATA)
    assert sleeper.wait(5) == -signal.SIGKILL
    assert sim.control.pids("vm2") == []
    [entry] = sim.control.log(kind="signal")
    assert (entry["vm"], entry["signal"], entry["event_id"]) == ("vm2", "SIGKILL", eid)


def test_pids_are_checked(sim: RunningSimulator) -> None:
    for pids, status in (([1], 400), (["x"], 400), ([sim.pid], 400)):
        with pytest.raises(SimControlError) as error:
            sim.control.register_pids("vm0", pids)  # type: ignore[arg-type]
        assert error.value.status == status, pids
    with pytest.raises(SimControlError) as error:
        sim.control.register_pids("vm9", [12345])
    assert error.value.status == 404
    eid = sim.control.schedule("Freeze", ["vm0"])["event_id"]
    with pytest.raises(SimControlError) as error:
        sim.control.impact(eid)
    assert error.value.status == 400


# -- more events -----------------------------------------------------------------------------------


def test_rollout_over_http_follows_the_fault_domains(sim: RunningSimulator) -> None:
    # No pause: an event stays Started until its impact is over, and this test is about the sequence.
    rollout = sim.control.rollout("Freeze", not_before_in=0.2, started_for=0.2, duration_in_seconds=0)
    assert rollout["groups"] == [["vm0", "vm2"], ["vm1"]]  # fault domain i % 2
    first = rollout["event"]["event_id"]
    removed = sim.control.wait_for_transition(first, None, timeout=5)
    second = sim.control.wait_for(
        lambda c: [e for e in c.log(kind="transition") if e["to"] == "Scheduled" and e["event_id"] != first],
        timeout=5,
        message="the second event",
    )[0]
    assert second["resources"] == ["vm1"]
    assert second["seq"] > removed["seq"]
    sim.control.wait_for(lambda c: c.rollouts()[0]["done"], timeout=5, message="the rollout to end")


def test_gpu_event_reaches_only_the_named_vm(sim: RunningSimulator, http: httpx.Client) -> None:
    sim.control.schedule("Freeze", ["vm1"], deliver_to_named_only=True)
    assert [len(get(http, sim.url(vm)).json()["Events"]) for vm in ("vm0", "vm1", "vm2")] == [0, 1, 0]


def test_delivery_units_over_http(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    """Two placement groups of one scale set: an event reaches the VMs of its unit only, any of them approves
    it, and each instance's compute metadata names its placement group."""
    pool = ("pool_0", "pool_1", "pool_2", "pool_3")
    sim = imds_sim(vms=pool, scale_set="pool", rate_limit=0, extra_args=["--units", "pool_0,pool_1/pool_2,pool_3"])
    layout = sim.control.vms()
    assert layout["delivery"] == "unit"
    assert layout["units"] == {"pg0": ["pool_0", "pool_1"], "pg1": ["pool_2", "pool_3"]}
    assert sim.control.unit_of("POOL_3") == "pg1"
    compute = [get(http, sim.url(vm, "/metadata/instance/compute", "2021-02-01")).json() for vm in pool]
    assert [c["placementGroupId"] for c in compute] == ["pg0", "pg0", "pg1", "pg1"]
    eid = sim.control.schedule("Freeze", ["pool_3"])["event_id"]
    assert [len(get(http, sim.url(vm)).json()["Events"]) for vm in pool] == [0, 0, 1, 1]
    assert approve(http, sim, "pool_2", {"StartRequests": [{"EventId": eid}]}).status_code == 200
    assert get(http, sim.url("pool_3")).json()["Events"][0]["EventStatus"] == "Started"
    assert sim.control.event(eid)["approved_by"] == ["pool_2"]  # type: ignore[index]
    with pytest.raises(SimControlError) as error:
        sim.control.schedule("Reboot", ["pool_1", "pool_2"])
    assert error.value.status == 400 and "two delivery units" in error.value.body
    with pytest.raises(SimControlError) as error:
        sim.control.rollout("Reboot", groups=[["pool_0", "pool_3"]])
    assert error.value.status == 400 and "groups[0]" in error.value.body


def test_named_delivery_over_http(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    vms = ("vm0", "vm1", "vm2", "vm3")
    sim = imds_sim(vms=vms, rate_limit=0, extra_args=["--unit-size", "2", "--delivery", "named"])
    assert sim.control.vms()["delivery"] == "named"
    assert [info["unit"] for info in sim.control.vms()["vms"]] == ["pg0", "pg0", "pg1", "pg1"]
    sim.control.schedule("Freeze", ["vm3"])
    assert [len(get(http, sim.url(vm)).json()["Events"]) for vm in vms] == [0, 0, 0, 1]


def test_without_a_layout_every_vm_is_in_the_default_unit(idle_sim: RunningSimulator, http: httpx.Client) -> None:
    layout = idle_sim.control.vms()
    assert layout["delivery"] == "unit"
    assert layout["units"] == {"": ["vm0", "vm1", "vm2"]}
    compute = get(http, idle_sim.url("vm0", "/metadata/instance/compute", "2021-02-01")).json()
    assert compute["placementGroupId"] == ""  # not in a scale set


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vms", "vm0,vm1", "--units", "vm0/vm9"], "--units: 'vm9' is not a VM of the group (vm0, vm1)"),
        (["--vms", "vm0,vm1", "--units", "vm0//vm1"], "argument --units: unit 1 lists no VM"),
        (["--units", "vm0", "--unit-size", "1"], "argument --unit-size: not allowed with argument --units"),
        (["--delivery", "everyone"], "argument --delivery: invalid choice"),
    ],
)
def test_cli_refuses_a_bad_layout_naming_the_option(args: list[str], message: str) -> None:
    assert_refused(["--base-port", "0", *args], message)


def test_terminates_start_together_once_all_are_approved(sim: RunningSimulator, http: httpx.Client) -> None:
    a = sim.control.schedule("Terminate", ["vm0"])
    b = sim.control.schedule("Terminate", ["vm1"], not_before_at=a["not_before"])
    assert approve(http, sim, "vm0", {"StartRequests": [{"EventId": a["event_id"]}]}).status_code == 200
    assert sim.control.event(a["event_id"])["held_by"] == [b["event_id"]]  # type: ignore[index]
    assert approve(http, sim, "vm1", {"StartRequests": [{"EventId": b["event_id"]}]}).status_code == 200
    started = [e for e in sim.control.log(kind="transition") if e["to"] == "Started"]
    assert {e["event_id"] for e in started} == {a["event_id"], b["event_id"]}


def test_request_rules_apply_to_approvals_too(sim: RunningSimulator, http: httpx.Client) -> None:
    eid = sim.control.schedule("Freeze", ["vm0"])["event_id"]
    body = json.dumps({"StartRequests": [{"EventId": eid}]})
    assert http.post(sim.url("vm0"), content=body).status_code == 400
    forwarded = {**METADATA, "X-Forwarded-For": "10.0.0.1"}
    assert http.post(sim.url("vm0"), content=body, headers=forwarded).status_code == 400
    no_version = sim.urls["vm0"] + "/metadata/scheduledevents"
    assert http.post(no_version, content=body, headers=METADATA).status_code == 400
    assert sim.control.event(eid)["status"] == "Scheduled"  # type: ignore[index]
    assert sim.control.log(kind="approval") == []


# -- replay ----------------------------------------------------------------------------------------

SCENARIOS = REPO_ROOT / "tests" / "fixtures" / "imds-scenarios"


def test_replays_a_recorded_sequence_file_verbatim(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    path = SCENARIOS / "field" / "docs-live-migration-freeze.sequence.json"
    documents = json.loads(path.read_text())
    sim = imds_sim(vms=("WestNO_0", "WestNO_1"), rate_limit=0, extra_args=["--replay", str(path)])
    assert sim.control.healthz()["replay"] is True
    served = [get(http, sim.url("WestNO_0")).json()]
    for _ in range(3):
        sim.control.replay_next()
        served.append(get(http, sim.url("WestNO_1")).json())
        if len(served) == 2:
            eid = served[1]["Events"][0]["EventId"]
            response = approve(http, sim, "WestNO_0", {"StartRequests": [{"EventId": eid}]})
            assert response.status_code == 200
    assert served == documents
    assert sim.control.replay()["at_end"] is True
    [approval] = sim.control.log(kind="approval")
    assert (approval["vm"], approval["results"]) == ("WestNO_0", {eid: "approved"})
    with pytest.raises(SimControlError) as error:
        sim.control.schedule("Freeze", ["WestNO_0"])
    assert error.value.status == 400


def test_replays_a_single_recorded_document(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    path = SCENARIOS / "azure-scheduledevents-manager" / "events.json"
    sim = imds_sim(vms=("FrontEnd_IN_0",), rate_limit=0, extra_args=["--replay", str(path)])
    assert get(http, sim.url("FrontEnd_IN_0")).json() == json.loads(path.read_text())


def test_replay_interval_advances_by_itself(imds_sim: SimulatorFactory, http: httpx.Client, tmp_path: Path) -> None:
    path = tmp_path / "three.sequence.json"
    path.write_text(json.dumps([{"DocumentIncarnation": n, "Events": []} for n in (3, 4, 6)]))
    sim = imds_sim(vms=("vm0",), rate_limit=0, extra_args=["--replay", str(path), "--replay-interval", "0.2"])
    sim.control.wait_for(lambda c: c.replay()["at_end"], timeout=5, message="the last document")
    assert get(http, sim.url("vm0")).json()["DocumentIncarnation"] == 6
    assert [e["incarnation"] for e in sim.control.log(kind="replay")] == [3, 4, 6]


def test_replays_a_yaml_timeline(imds_sim: SimulatorFactory, http: httpx.Client) -> None:
    path = REPO_ROOT / "tests" / "fixtures" / "timelines" / "freeze-cancelled-then-hardware-failure.timeline.yaml"
    sim = imds_sim(vms=("vm0", "vm1"), rate_limit=0, extra_args=["--replay", str(path)])
    assert [e["EventId"] for e in get(http, sim.url("vm1")).json()["Events"]] == ["E-FREEZE"]
    sim.control.wait_for_transition("E-HW", None, timeout=10)
    transitions = [(e["event_id"], e["from"], e["to"], e["reason"]) for e in sim.control.log(kind="transition")]
    assert transitions == [
        ("E-FREEZE", None, "Scheduled", "scheduled"),
        ("E-FREEZE", "Scheduled", None, "cancelled"),
        ("E-HW", None, "Started", "scheduled"),
        ("E-HW", "Started", None, "started_for_elapsed"),
    ]


def test_documents_and_timelines_can_be_loaded_through_the_control_api(
    sim: RunningSimulator, http: httpx.Client
) -> None:
    assert sim.control.load_timeline([{"at": 0, "skip_incarnation": {"by": 4}}]) == 1
    sim.control.wait_for(lambda c: c.log(kind="incarnation"), timeout=5, message="the step to run")
    assert get(http, sim.url("vm2")).json()["DocumentIncarnation"] == 5
    with pytest.raises(SimControlError):
        sim.control.load_documents([])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time-scale", "0"], "time scale"),
        (["--terminate-notice", "120"], "300 to 900"),
        (["--idle-reset-after", "0"], "> 0"),
        (["--replay", "/nonexistent/replay.json"], "No such file"),
    ],
)
def test_cli_refuses_bad_timing_and_replay_arguments(args: list[str], message: str) -> None:
    assert_refused(["--base-port", "0", *args], message)
