"""Unit tests of the IMDS client: httpx.MockTransport, a fake clock, a fake sleep; no sockets, no waiting."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest

from coordinator.errors import ImdsBadRequest, ImdsUnavailable, MalformedDocument
from coordinator.imds import OUTCOMES, ImdsClient, InstanceCompute, parse_instance_compute
from coordinator.models import parse_document
from tests.doubles import SleepClock

SCENARIOS = Path(__file__).resolve().parents[1] / "fixtures" / "imds-scenarios"

DOC: dict[str, Any] = {
    "DocumentIncarnation": 2,
    "Events": [
        {
            "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
            "EventStatus": "Scheduled",
            "EventType": "Freeze",
            "ResourceType": "VirtualMachine",
            "Resources": ["WestNO_0", "WestNO_1"],
            "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT",
            "Description": "Virtual machine is being paused because of a memory-preserving Live Migration.",
            "EventSource": "Platform",
            "DurationInSeconds": 5,
        }
    ],
}

SCALE_SET_COMPUTE: dict[str, Any] = {
    "azEnvironment": "AzurePublicCloud",
    "location": "westeurope",
    "name": "aks-nodepool1-21922338-vmss_47",
    "osType": "Linux",
    "platformFaultDomain": "1",
    "platformUpdateDomain": "0",
    "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
    "vmScaleSetName": "aks-nodepool1-21922338-vmss",
    "zone": "2",
}

AVAILABILITY_SET_COMPUTE: dict[str, Any] = {
    "location": "norwayeast",
    "name": "WestNO_1",
    "platformFaultDomain": "1",
    "platformUpdateDomain": "1",
    "vmScaleSetName": "",
    "zone": "",
}

Step = Callable[[httpx.Request], httpx.Response]


class MaxJitter(random.Random):
    """Full jitter that always picks the top of the range, so back-off delays are exact."""

    def uniform(self, a: float, b: float) -> float:
        return b


class FakeImds:
    """MockTransport handler: plays scripted steps in order, then ``default``; records each request."""

    def __init__(self, clock: SleepClock, default: Step | None = None) -> None:
        self.clock = clock
        self.script: list[Step] = []
        self.default: Step = default or reply()
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    def then(self, *steps: Step) -> FakeImds:
        self.script.extend(steps)
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        self.times.append(self.clock())
        step = self.script.pop(0) if self.script else self.default
        return step(request)


def reply(status: int = 200, body: object = DOC, headers: dict[str, str] | None = None) -> Step:
    def step(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str | bytes):
            return httpx.Response(status, content=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return step


def fail(exc_type: type[httpx.RequestError]) -> Step:
    def step(request: httpx.Request) -> httpx.Response:
        raise exc_type("simulated failure", request=request)

    return step


@pytest.fixture
def clock() -> SleepClock:
    return SleepClock()


@pytest.fixture
def imds(clock: SleepClock) -> FakeImds:
    return FakeImds(clock)


@pytest.fixture
def outcomes() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def make_client(
    clock: SleepClock, imds: FakeImds, outcomes: list[tuple[str, str]]
) -> Iterator[Callable[..., ImdsClient]]:
    clients: list[ImdsClient] = []

    def make(**overrides: Any) -> ImdsClient:
        options: dict[str, Any] = {
            "transport": httpx.MockTransport(imds),
            "clock": clock,
            "sleep": clock.sleep,
            "rng": MaxJitter(),
            "on_request": lambda method, outcome: outcomes.append((method, outcome)),
        }
        options.update(overrides)
        client = ImdsClient(**options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


# --- the request itself -----------------------------------------------------------------------------------


def test_every_request_carries_metadata_header_and_one_api_version(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.then(reply(), reply(body=""), reply(body=SCALE_SET_COMPUTE))
    client = make_client()

    client.get_document()
    client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])
    client.get_instance_compute()

    assert [(r.method, r.url.path) for r in imds.requests] == [
        ("GET", "/metadata/scheduledevents"),
        ("POST", "/metadata/scheduledevents"),
        ("GET", "/metadata/instance/compute"),
    ]
    for request in imds.requests:
        assert request.headers.get_list("Metadata") == ["true"]
        assert "X-Forwarded-For" not in request.headers
        assert request.url.host == "169.254.169.254"
        assert request.url.scheme == "http"
    assert [r.url.params.get_list("api-version") for r in imds.requests] == [
        ["2020-07-01"],
        ["2020-07-01"],
        ["2021-02-01"],
    ]


def test_api_versions_and_base_url_are_configurable(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.then(reply(), reply(body=AVAILABILITY_SET_COMPUTE))
    client = make_client(
        base_url="http://127.0.0.1:8080/imds", api_version="2019-08-01", compute_api_version="2020-09-01"
    )

    client.get_document()
    client.get_instance_compute()

    assert [str(r.url) for r in imds.requests] == [
        "http://127.0.0.1:8080/imds/metadata/scheduledevents?api-version=2019-08-01",
        "http://127.0.0.1:8080/imds/metadata/instance/compute?api-version=2020-09-01",
    ]


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def test_proxy_environment_is_ignored(
    monkeypatch: pytest.MonkeyPatch, make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, "http://proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = make_client()

    client.get_document()

    assert len(imds.requests) == 1
    assert imds.requests[0].url.host == "169.254.169.254"
    assert "Proxy-Authorization" not in imds.requests[0].headers
    assert client._client.trust_env is False


def test_default_transport_is_never_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without an injected transport httpx would build its own; with trust_env it would mount a proxy
    # transport for the environment's proxies. Nothing is sent: only the routing is inspected.
    for name in PROXY_VARIABLES:
        monkeypatch.setenv(name, "http://proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    url = httpx.URL("http://169.254.169.254/metadata/scheduledevents")

    with httpx.Client() as naive:  # control: the environment really does name a proxy
        assert isinstance(naive._transport_for_url(url)._pool, httpcore.HTTPProxy)  # type: ignore[attr-defined]

    with ImdsClient() as client:
        transport = client._client._transport_for_url(url)
        assert isinstance(transport, httpx.HTTPTransport)
        assert not isinstance(transport._pool, httpcore.HTTPProxy)
        assert client._client.trust_env is False


def test_redirect_is_not_followed(
    make_client: Callable[..., ImdsClient], imds: FakeImds, outcomes: list[tuple[str, str]]
) -> None:
    imds.then(reply(302, body="", headers={"Location": "http://elsewhere.invalid/metadata/scheduledevents"}))
    client = make_client()

    with pytest.raises(ImdsUnavailable, match="302") as info:
        client.get_document()

    assert info.value.outcome == "other"
    assert len(imds.requests) == 1
    assert outcomes == [("GET", "other")]


# --- retries ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "outcome"),
    [
        (reply(500, body="oops"), "server_error"),
        (reply(503, body=""), "server_error"),
        (reply(410, body=""), "gone"),
        (reply(429, body=""), "rate_limited"),
        (fail(httpx.ReadTimeout), "timeout"),
        (fail(httpx.ConnectTimeout), "timeout"),
        (fail(httpx.ConnectError), "connection_error"),
        (fail(httpx.RemoteProtocolError), "connection_error"),
    ],
)
def test_transient_failure_is_retried_then_succeeds(
    first: Step,
    outcome: str,
    make_client: Callable[..., ImdsClient],
    imds: FakeImds,
    clock: SleepClock,
    outcomes: list[tuple[str, str]],
) -> None:
    imds.then(first, reply())
    client = make_client()

    document = client.get_document()

    assert document == parse_document(DOC)
    assert len(imds.requests) == 2
    assert outcomes == [("GET", outcome), ("GET", "ok")]
    assert clock.sleeps == [0.5]


def test_backoff_is_exponential_and_capped(
    make_client: Callable[..., ImdsClient], imds: FakeImds, clock: SleepClock
) -> None:
    imds.default = reply(500, body="")
    client = make_client(max_attempts=6, backoff_base=0.5, backoff_max=3.0)

    with pytest.raises(ImdsUnavailable):
        client.get_document()

    assert clock.sleeps == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_backoff_is_full_jitter(
    make_client: Callable[..., ImdsClient], imds: FakeImds, clock: SleepClock
) -> None:
    imds.default = reply(500, body="")
    client = make_client(max_attempts=6, backoff_base=0.5, backoff_max=3.0, rng=random.Random(7))

    with pytest.raises(ImdsUnavailable):
        client.get_document()

    caps = [0.5, 1.0, 2.0, 3.0, 3.0]
    assert len(clock.sleeps) == len(caps)
    assert all(0.0 <= slept <= cap for slept, cap in zip(clock.sleeps, caps, strict=True))
    assert clock.sleeps != caps


@pytest.mark.parametrize(
    ("status", "retry_after", "expected_sleep"),
    [
        (429, "3", 3.0),
        (503, "1.5", 1.5),
        (429, "120", 30.0),  # capped at backoff_max
        (429, "Wed, 21 Oct 2015 07:28:00 GMT", 0.5),  # HTTP-date form: plain back-off
        (429, "soon", 0.5),
    ],
)
def test_retry_after_is_honoured(
    status: int,
    retry_after: str,
    expected_sleep: float,
    make_client: Callable[..., ImdsClient],
    imds: FakeImds,
    clock: SleepClock,
) -> None:
    imds.then(reply(status, body="", headers={"Retry-After": retry_after}), reply())
    client = make_client()

    client.get_document()

    assert clock.sleeps == [expected_sleep]
    assert imds.times[1] - imds.times[0] == pytest.approx(expected_sleep)


@pytest.mark.parametrize(
    ("step", "outcome"),
    [
        (reply(503, body=""), "server_error"),
        (reply(410, body=""), "gone"),
        (reply(429, body=""), "rate_limited"),
        (fail(httpx.ReadTimeout), "timeout"),
        (fail(httpx.ConnectError), "connection_error"),
    ],
)
def test_gives_up_after_max_attempts(
    step: Step,
    outcome: str,
    make_client: Callable[..., ImdsClient],
    imds: FakeImds,
    clock: SleepClock,
    outcomes: list[tuple[str, str]],
) -> None:
    imds.default = step
    client = make_client()

    with pytest.raises(ImdsUnavailable, match="3 attempt") as info:
        client.get_document()

    assert info.value.outcome == outcome
    assert len(imds.requests) == 3
    assert outcomes == [("GET", outcome)] * 3
    assert clock.sleeps == [0.5, 1.0]  # no pointless sleep after the last attempt


def test_last_attempt_outcome_is_reported(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    imds.then(reply(500, body=""), fail(httpx.ConnectError), reply(429, body=""))
    client = make_client()

    with pytest.raises(ImdsUnavailable) as info:
        client.get_document()

    assert info.value.outcome == "rate_limited"


def test_a_failed_call_does_not_poison_the_next(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.then(*[reply(500, body="")] * 3)
    client = make_client()

    with pytest.raises(ImdsUnavailable):
        client.get_document()
    assert client.get_document() == parse_document(DOC)
    assert len(imds.requests) == 4


# --- 4xx and the cool-down -----------------------------------------------------------------------------


def test_bad_request_is_not_retried_and_cools_down(
    make_client: Callable[..., ImdsClient],
    imds: FakeImds,
    clock: SleepClock,
    outcomes: list[tuple[str, str]],
) -> None:
    imds.default = reply(400, body="Bad request. Required metadata header not specified")
    client = make_client()

    with pytest.raises(ImdsBadRequest) as info:
        client.get_document()
    assert info.value.status == 400
    assert "Required metadata header" in info.value.body
    assert len(imds.requests) == 1
    assert outcomes == [("GET", "bad_request")]
    assert clock.sleeps == []

    # Within the cool-down (5 s) nothing is sent.
    clock.advance(4.5)
    with pytest.raises(ImdsBadRequest, match="cool-down") as again:
        client.get_document()
    assert again.value.status == 400
    assert len(imds.requests) == 1
    assert outcomes == [("GET", "bad_request")]

    # After it, one request; a second 400 doubles the cool-down to 10 s.
    clock.advance(0.5)
    with pytest.raises(ImdsBadRequest):
        client.get_document()
    assert len(imds.requests) == 2
    clock.advance(9.5)
    with pytest.raises(ImdsBadRequest, match="cool-down"):
        client.get_document()
    assert len(imds.requests) == 2
    clock.advance(0.5)

    # A success resets it: the next 400 cools down for 5 s again.
    imds.then(reply(), reply(400, body="bad"))
    client.get_document()
    with pytest.raises(ImdsBadRequest):
        client.get_document()
    assert len(imds.requests) == 4
    clock.advance(4.5)
    with pytest.raises(ImdsBadRequest, match="cool-down"):
        client.get_document()
    clock.advance(0.5)
    imds.default = reply()
    client.get_document()
    assert len(imds.requests) == 5
    assert clock.sleeps == []


def test_cooldown_is_capped(make_client: Callable[..., ImdsClient], imds: FakeImds, clock: SleepClock) -> None:
    imds.default = reply(400, body="")
    client = make_client(bad_request_cooldown=5.0, bad_request_cooldown_max=300.0)
    with pytest.raises(ImdsBadRequest):
        client.get_document()
    lengths = []
    for _ in range(9):
        # Measure each cool-down by trying once a second until a request is actually sent (and 400s).
        sent = len(imds.requests)
        waited = 0
        while len(imds.requests) == sent:
            clock.advance(1.0)
            waited += 1
            with pytest.raises(ImdsBadRequest):
                client.get_document()
        lengths.append(waited)
    assert lengths[:7] == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0]
    assert lengths[7:] == [300.0, 300.0]


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(404, "not_found"), (403, "other"), (405, "other"), (401, "other")],
)
def test_other_client_errors_are_bad_requests(
    status: int,
    outcome: str,
    make_client: Callable[..., ImdsClient],
    imds: FakeImds,
    outcomes: list[tuple[str, str]],
) -> None:
    imds.default = reply(status, body="nope")
    client = make_client()

    with pytest.raises(ImdsBadRequest) as info:
        client.get_document()
    with pytest.raises(ImdsBadRequest):
        client.get_document()

    assert info.value.status == status
    assert len(imds.requests) == 1
    assert outcomes == [("GET", outcome)]


def test_refused_approval_does_not_stop_polling(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.then(reply(400, body="bad body"))
    client = make_client()

    with pytest.raises(ImdsBadRequest):
        client.approve(["UNKNOWN-ID"])
    assert client.get_document() == parse_document(DOC)
    with pytest.raises(ImdsBadRequest, match="cool-down"):
        client.approve(["UNKNOWN-ID"])
    client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])  # another event is not held back

    assert [r.method for r in imds.requests] == ["POST", "GET", "POST"]


# --- the document -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "<html>proxy error</html>",
        "",
        json.dumps({"DocumentIncarnation": "2", "Events": []}),
        json.dumps({"Events": []}),
        json.dumps([1, 2, 3]),
    ],
)
def test_malformed_document_is_raised_not_retried(
    body: str,
    make_client: Callable[..., ImdsClient],
    imds: FakeImds,
    clock: SleepClock,
    outcomes: list[tuple[str, str]],
) -> None:
    imds.default = reply(200, body=body)
    client = make_client()

    with pytest.raises(MalformedDocument) as info:
        client.get_document()

    assert info.value.content == body[:2000] or body == json.dumps([1, 2, 3])
    assert len(imds.requests) == 1
    assert outcomes == [("GET", "malformed")]
    assert clock.sleeps == []


SCENARIO_FILES = sorted(p for p in SCENARIOS.rglob("*.json") if not p.name.endswith(".sequence.json"))


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.relative_to(SCENARIOS).as_posix())
def test_scenario_documents_arrive_as_parsed(
    path: Path, make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    raw = path.read_bytes()
    imds.default = reply(200, body=raw)

    assert make_client().get_document() == parse_document(raw)


# --- approval ---------------------------------------------------------------------------------------------


def test_approve_body_is_exact(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    imds.default = reply(200, body="")
    client = make_client()
    ids = ["C7061BAC-AFDC-4513-B24B-AA5F13A16123", "f020ba2e-3bdf-4d2e-8a0d-1d6a1b3a5e49"]

    client.approve(ids)

    (request,) = imds.requests
    assert request.method == "POST"
    assert request.url.path == "/metadata/scheduledevents"
    assert request.url.params.get_list("api-version") == ["2020-07-01"]
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == {
        "StartRequests": [
            {"EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123"},
            {"EventId": "f020ba2e-3bdf-4d2e-8a0d-1d6a1b3a5e49"},
        ]
    }


def test_approve_is_idempotent(
    make_client: Callable[..., ImdsClient], imds: FakeImds, outcomes: list[tuple[str, str]]
) -> None:
    imds.default = reply(200, body="")
    client = make_client()

    client.approve(("C7061BAC-AFDC-4513-B24B-AA5F13A16123",))
    client.approve(("C7061BAC-AFDC-4513-B24B-AA5F13A16123",))

    assert len(imds.requests) == 2
    assert imds.requests[0].content == imds.requests[1].content
    assert outcomes == [("POST", "ok"), ("POST", "ok")]


def test_approve_nothing_sends_nothing(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    client = make_client()

    client.approve([])

    assert imds.requests == []


def test_approve_refuses_a_bare_string(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    client = make_client()

    with pytest.raises(TypeError):
        client.approve("C7061BAC-AFDC-4513-B24B-AA5F13A16123")
    with pytest.raises(TypeError):
        client.approve([42])  # type: ignore[list-item]
    assert imds.requests == []


def test_approve_retries_transient_failures(
    make_client: Callable[..., ImdsClient], imds: FakeImds, outcomes: list[tuple[str, str]]
) -> None:
    imds.then(fail(httpx.ReadTimeout), reply(500, body=""), reply(200, body=""))
    client = make_client()

    client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])

    assert outcomes == [("POST", "timeout"), ("POST", "server_error"), ("POST", "ok")]
    assert len({r.content for r in imds.requests}) == 1


def test_approve_bad_request(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    imds.default = reply(400, body="malformed body")
    client = make_client()

    with pytest.raises(ImdsBadRequest) as info:
        client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])

    assert (info.value.status, info.value.body) == (400, "malformed body")
    assert len(imds.requests) == 1


# --- rate limit -------------------------------------------------------------------------------------------


def _assert_at_most_per_second(times: list[float], limit: int) -> None:
    # Times are in send order: any 1-second window holds at most `limit` requests iff every request is
    # at least one second after the one `limit` places before it.
    for earlier, later in zip(times, times[limit:], strict=False):
        assert later - earlier >= 1.0 - 1e-9, times


def test_rate_limit_in_a_tight_loop(
    make_client: Callable[..., ImdsClient], imds: FakeImds, clock: SleepClock
) -> None:
    client = make_client()

    for _ in range(20):
        client.get_document()

    assert len(imds.times) == 20
    _assert_at_most_per_second(imds.times, 5)
    assert imds.times[:5] == [1000.0] * 5  # a burst of five is allowed
    assert imds.times[-1] - imds.times[0] == pytest.approx(3.0)  # and no more waiting than needed
    assert sum(clock.sleeps) == pytest.approx(3.0)


def test_rate_limit_counts_retries_and_every_operation(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    client = make_client(backoff_base=0.0)
    for _ in range(6):
        imds.then(reply(500, body=""), reply())
    imds.then(*[reply(200, body="")] * 4, *[reply(body=SCALE_SET_COMPUTE)] * 4)

    for _ in range(6):
        client.get_document()
    for _ in range(4):
        client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])
    for _ in range(4):
        client.get_instance_compute()

    assert len(imds.times) == 20
    _assert_at_most_per_second(imds.times, 5)


def test_rate_limit_is_shared_by_threads(imds: FakeImds) -> None:
    # The clock stands still and sleeping only records, so each thread's wait is exactly what the
    # limiter reserved for it: 20 concurrent requests need 5 slots at each of +0 s, +1 s, +2 s, +3 s.
    frozen = SleepClock()
    waits: list[float] = []
    client = ImdsClient(transport=httpx.MockTransport(imds), clock=frozen, sleep=waits.append)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=10)
            for _ in range(5):
                client.get_document()
        except BaseException as exc:  # reported below, so that a failing thread fails the test
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    client.close()

    assert errors == []
    assert len(imds.requests) == 20
    assert sorted(waits) == [1.0] * 5 + [2.0] * 5 + [3.0] * 5


def test_rate_limit_is_configurable(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    client = make_client(max_requests_per_second=2.0)

    for _ in range(10):
        client.get_document()

    _assert_at_most_per_second(imds.times, 2)
    assert imds.times[-1] - imds.times[0] == pytest.approx(4.0)


def test_rate_limit_below_one_per_second(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    client = make_client(max_requests_per_second=0.5)

    for _ in range(3):
        client.get_document()

    assert [t - imds.times[0] for t in imds.times] == [0.0, 2.0, 4.0]


# --- timeouts ---------------------------------------------------------------------------------------------


def _timeouts(imds: FakeImds) -> list[dict[str, float]]:
    return [request.extensions["timeout"] for request in imds.requests]


def test_first_request_gets_the_long_timeout_until_a_success(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.then(fail(httpx.ReadTimeout), reply(500, body=""), reply(), reply(), reply(200, body=""))
    client = make_client()

    client.get_document()  # three attempts, still cold
    client.get_document()
    client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])

    timeouts = _timeouts(imds)
    assert [t["read"] for t in timeouts] == [120.0, 120.0, 120.0, 10.0, 10.0]
    assert [t["write"] for t in timeouts] == [120.0, 120.0, 120.0, 10.0, 10.0]
    assert [t["pool"] for t in timeouts] == [120.0, 120.0, 120.0, 10.0, 10.0]
    assert {t["connect"] for t in timeouts} == {10.0}  # a link-local connect is never slow


def test_approval_also_warms_up(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    imds.then(reply(200, body=""), reply())
    client = make_client(request_timeout=3.0, first_request_timeout=60.0)

    client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])
    client.get_document()

    assert [t["read"] for t in _timeouts(imds)] == [60.0, 3.0]


def test_compute_metadata_never_uses_the_long_timeout(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.then(reply(body=SCALE_SET_COMPUTE), reply())
    client = make_client()

    client.get_instance_compute()
    client.get_document()  # the compute answer says nothing about Scheduled Events being enabled

    assert [t["read"] for t in _timeouts(imds)] == [10.0, 120.0]


def test_malformed_document_still_warms_up(make_client: Callable[..., ImdsClient], imds: FakeImds) -> None:
    imds.then(reply(200, body="{"), reply())
    client = make_client()

    with pytest.raises(MalformedDocument):
        client.get_document()
    client.get_document()

    assert [t["read"] for t in _timeouts(imds)] == [120.0, 10.0]


# --- on_request -------------------------------------------------------------------------------------------


def test_on_request_sees_every_attempt(
    make_client: Callable[..., ImdsClient], imds: FakeImds, outcomes: list[tuple[str, str]]
) -> None:
    imds.then(
        reply(410, body=""),
        reply(429, body=""),
        reply(),
        reply(404, body=""),
        reply(200, body="not json"),
        fail(httpx.ConnectError),
        reply(200, body=""),
        reply(body=AVAILABILITY_SET_COMPUTE),
    )
    client = make_client()

    client.get_document()
    with pytest.raises(ImdsBadRequest):
        client.get_document()
    with pytest.raises(ImdsBadRequest):
        client.get_document()  # cool-down: nothing sent, nothing reported
    with pytest.raises(MalformedDocument):
        client.get_instance_compute()
    client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])
    client.get_instance_compute()

    assert outcomes == [
        ("GET", "gone"),
        ("GET", "rate_limited"),
        ("GET", "ok"),
        ("GET", "not_found"),
        ("GET", "malformed"),
        ("POST", "connection_error"),
        ("POST", "ok"),
        ("GET", "ok"),
    ]
    assert {outcome for _, outcome in outcomes} <= set(OUTCOMES)


def test_on_latency_sees_how_long_each_attempt_waited_whatever_its_outcome(
    make_client: Callable[..., ImdsClient], imds: FakeImds, clock: SleepClock
) -> None:
    def taking(seconds: float, step: Step) -> Step:
        def answer(request: httpx.Request) -> httpx.Response:
            clock.advance(seconds)
            return step(request)

        return answer

    imds.then(taking(0.25, reply(500, body="")), taking(1.5, reply()),
              taking(0.125, fail(httpx.ConnectError)), taking(0.5, reply(body="")))
    latencies: list[tuple[str, float]] = []
    client = make_client(on_latency=lambda method, seconds: latencies.append((method, seconds)))

    client.get_document()  # a 500, then the document: the back-off between them is not counted
    client.approve(["C7061BAC-AFDC-4513-B24B-AA5F13A16123"])  # a connection error, then 200

    assert [method for method, _ in latencies] == ["GET", "GET", "POST", "POST"]
    assert [seconds for _, seconds in latencies] == pytest.approx([0.25, 1.5, 0.125, 0.5])
    assert clock.sleeps  # there was a back-off, outside the measured attempts


def test_works_without_on_request(clock: SleepClock, imds: FakeImds) -> None:
    imds.then(reply(500, body=""), reply())
    with ImdsClient(transport=httpx.MockTransport(imds), clock=clock, sleep=clock.sleep) as client:
        assert client.get_document() == parse_document(DOC)


# --- compute metadata -------------------------------------------------------------------------------------


def test_instance_compute_of_an_availability_set_vm(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.default = reply(body=AVAILABILITY_SET_COMPUTE)

    compute = make_client().get_instance_compute()

    assert compute == InstanceCompute(
        name="WestNO_1", vm_scale_set_name="", platform_fault_domain="1", platform_update_domain="1", zone=""
    )
    assert not compute.is_scale_set_instance
    assert compute.scheduled_events_name == "WestNO_1"
    assert parse_document(DOC).events[0].names(compute.scheduled_events_name)


def test_instance_compute_of_a_scale_set_instance(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.default = reply(body=SCALE_SET_COMPUTE)

    compute = make_client().get_instance_compute()

    assert compute.name == "aks-nodepool1-21922338-vmss_47"
    assert compute.vm_scale_set_name == "aks-nodepool1-21922338-vmss"
    assert (compute.platform_fault_domain, compute.platform_update_domain, compute.zone) == ("1", "0", "2")
    assert compute.is_scale_set_instance
    assert compute.scheduled_events_name == "aks-nodepool1-21922338-vmss_47"
    with pytest.raises(ValueError):
        compute.name = "other"


def test_instance_compute_is_tolerant() -> None:
    assert parse_instance_compute(b"{}") == InstanceCompute()
    assert parse_instance_compute({"name": "vm1", "platformFaultDomain": 2, "zone": None}) == InstanceCompute(
        name="vm1", platform_fault_domain="2"
    )
    assert InstanceCompute().scheduled_events_name == ""
    dumped = InstanceCompute(vm_scale_set_name="vmss", platform_fault_domain="0").model_dump(by_alias=True)
    assert dumped == {
        "name": "",
        "vmScaleSetName": "vmss",
        "platformFaultDomain": "0",
        "platformUpdateDomain": "",
        "zone": "",
        "placementGroupId": "",
        "resourceId": "",
    }
    # A scale-set instance's placement group: its delivery unit.
    pg = "7d1a3c5e-0b2f-4e6a-9c8d-1f2e3d4c5b6a"
    assert parse_instance_compute({"vmScaleSetName": "vmss", "placementGroupId": pg}).placement_group_id == pg
    assert parse_instance_compute(dumped) == InstanceCompute(
        vm_scale_set_name="vmss", platform_fault_domain="0"
    )
    # doctor reads the scale set or VM that resourceId names.
    ss = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/3"
    assert parse_instance_compute({"resourceId": ss}).resource_id == ss


@pytest.mark.parametrize(
    "body",
    ["not json", "[]", '"vm1"', json.dumps({"name": ["vm1"]}), json.dumps({"zone": True})],
)
def test_instance_compute_malformed(
    body: str, make_client: Callable[..., ImdsClient], imds: FakeImds, outcomes: list[tuple[str, str]]
) -> None:
    imds.default = reply(200, body=body)

    with pytest.raises(MalformedDocument):
        make_client().get_instance_compute()

    assert outcomes == [("GET", "malformed")]


def test_instance_compute_errors_like_the_document(
    make_client: Callable[..., ImdsClient], imds: FakeImds
) -> None:
    imds.then(*[reply(500, body="")] * 3, reply(400, body="bad"))
    client = make_client()

    with pytest.raises(ImdsUnavailable) as info:
        client.get_instance_compute()
    assert info.value.outcome == "server_error"
    with pytest.raises(ImdsBadRequest):
        client.get_instance_compute()
    assert len(imds.requests) == 4


# --- construction -----------------------------------------------------------------------------------------


def test_context_manager_closes(clock: SleepClock, imds: FakeImds) -> None:
    with ImdsClient(transport=httpx.MockTransport(imds), clock=clock, sleep=clock.sleep) as client:
        client.get_document()
    assert client._client.is_closed
    client.close()  # idempotent


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"request_timeout": 0},
        {"first_request_timeout": -1},
        {"max_requests_per_second": 0},
        {"backoff_base": -0.5},
        {"backoff_max": float("inf")},
        {"api_version": ""},
        {"base_url": "169.254.169.254"},
        {"base_url": "ftp://169.254.169.254"},
        {"bad_request_cooldown": 10.0, "bad_request_cooldown_max": 5.0},
    ],
)
def test_invalid_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ImdsClient(**options)
