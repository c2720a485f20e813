"""The verdicts of ``coordinator doctor``'s checks, from what each observed (pure functions), and the runner:
order, ``--skip``, the deadline, the exit status."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from coordinator.config import Settings, load_settings
from coordinator.doctor.checks import (
    CHECKS,
    NOTICES,
    Check,
    Context,
    check_config,
    check_imds,
    check_members,
    check_probe,
    check_session,
)
from coordinator.doctor.command import run_checks
from coordinator.doctor.options import CHECK_NAMES
from coordinator.doctor.verdicts import (
    ProbeAnswer,
    Status,
    Verdict,
    acl_verdict,
    clock_verdict,
    config_verdict,
    exit_status,
    imds_verdict,
    members_verdict,
    probe_verdict,
    proxy_verdict,
    session_verdict,
    zookeeper_verdict,
)

IMDS = "169.254.169.254"


# --- exit status ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("statuses", "code"), [
    ([], 0),
    ([Status.PASS, Status.SKIP], 0),
    ([Status.PASS, Status.WARN, Status.SKIP], 1),
    ([Status.WARN, Status.FAIL, Status.PASS], 2),
])
def test_the_exit_status_is_the_worst_verdict(statuses: list[Status], code: int) -> None:
    assert exit_status(statuses) == code


def test_the_option_names_are_the_checks_run() -> None:
    assert tuple(check.name for check in CHECKS) == CHECK_NAMES


def test_the_notices_weighed_are_the_ones_the_simulator_documents() -> None:
    from azuresim.catalogue import MINIMUM_NOTICE, TERMINATE_NOTICE_RANGE

    assert dict(NOTICES) == dict(MINIMUM_NOTICE)
    assert NOTICES["Terminate"] == TERMINATE_NOTICE_RANGE[0]


# --- proxy ----------------------------------------------------------------------------------------------


def test_no_proxy_variable_passes() -> None:
    assert proxy_verdict({"PATH": "/usr/bin"}, IMDS).status is Status.PASS


@pytest.mark.parametrize("no_proxy", [IMDS, "localhost,169.254.169.254", "169.254.0.0/16", "*",
                                      " 10.0.0.0/8 , 169.254.169.254:80"])
def test_a_proxy_with_no_proxy_covering_imds_passes(no_proxy: str) -> None:
    verdict = proxy_verdict({"HTTPS_PROXY": "http://proxy:3128", "no_proxy": no_proxy}, IMDS)
    assert verdict.status is Status.PASS
    assert "NO_PROXY exempts" in verdict.summary


@pytest.mark.parametrize("environ", [
    {"http_proxy": "http://proxy:3128"},
    {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "localhost,10.0.0.0/8"},
    {"ALL_PROXY": "socks5://proxy:1080", "NO_PROXY": "169.254.169.25"},
])
def test_a_proxy_without_no_proxy_covering_imds_warns(environ: dict[str, str]) -> None:
    verdict = proxy_verdict(environ, IMDS)
    assert verdict.status is Status.WARN
    assert "add 169.254.169.254 to NO_PROXY" in verdict.fix
    assert "the agent itself never does" in verdict.summary


def test_an_empty_proxy_variable_is_no_proxy() -> None:
    assert proxy_verdict({"HTTP_PROXY": "  "}, IMDS).status is Status.PASS


# --- IMDS -----------------------------------------------------------------------------------------------


def test_imds_answering_passes_and_names_the_vm() -> None:
    verdict = imds_verdict(error=None, incarnation=4, events=1, seconds=0.02, configured_name=None, imds_name="web_3",
                           url="http://169.254.169.254")
    assert verdict.status is Status.PASS
    assert "incarnation 4, 1 event(s)" in verdict.summary and "this VM is web_3" in verdict.summary


def test_imds_not_answering_fails() -> None:
    verdict = imds_verdict(error="connection refused", url="http://169.254.169.254")
    assert verdict.status is Status.FAIL
    assert "connection refused" in verdict.summary and "no proxy" in verdict.fix


def test_a_vm_name_other_than_imds_gives_fails() -> None:
    verdict = imds_verdict(error=None, incarnation=1, configured_name="vm0", imds_name="web_0")
    assert verdict.status is Status.FAIL
    assert "set vm_name to 'web_0'" in verdict.fix


def test_the_same_name_in_another_case_passes() -> None:
    assert imds_verdict(error=None, incarnation=1, configured_name="web_0", imds_name="WEB_0").status is Status.PASS


def test_no_name_from_either_side_fails() -> None:
    verdict = imds_verdict(error=None, incarnation=1, configured_name=None, compute_error="HTTP 404")
    assert verdict.status is Status.FAIL and "set vm_name" in verdict.fix


# --- clock ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("offset", "status"), [
    (0.3, Status.PASS), (-5.4, Status.PASS), (8.0, Status.WARN), (-20.0, Status.WARN), (31.0, Status.FAIL),
    (-45.0, Status.FAIL),
])
def test_the_clock_offset_against_imds(offset: float, status: Status) -> None:
    assert clock_verdict(offset, 0.5, latest_start=120).status is status


def test_a_clock_behind_says_drains_start_late_and_one_ahead_early() -> None:
    behind = clock_verdict(60.0, 0.5, latest_start=120)
    assert "60 s behind" in behind.summary and "that much late" in behind.summary
    assert "NotBefore is compared with it" in behind.summary and "chrony" in behind.fix
    ahead = clock_verdict(-60.0, 0.5, latest_start=120)
    assert "60 s ahead of" in ahead.summary and "that much early" in ahead.summary


def test_the_uncertainty_of_the_measure_is_given_the_benefit_of_the_doubt() -> None:
    assert clock_verdict(6.0, 1.5, latest_start=120).status is Status.PASS  # 4.5 s certain: within 5 s
    assert clock_verdict(6.0, 0.5, latest_start=120).status is Status.WARN


def test_no_date_header_warns() -> None:
    verdict = clock_verdict(None, 0.5, latest_start=120)
    assert verdict.status is Status.WARN and "no usable Date header" in verdict.summary


# --- configuration --------------------------------------------------------------------------------------


def test_config_problems_fail_and_warnings_warn() -> None:
    assert config_verdict([], []).status is Status.PASS
    assert config_verdict(["state_file: cannot write /x"], []).status is Status.FAIL
    assert config_verdict([], ["state_file: cannot create /var/lib/x"]).status is Status.WARN


# --- ZooKeeper ------------------------------------------------------------------------------------------


def _zk(**kwargs: object) -> Verdict:
    given: dict[str, object] = {"hosts": "zk1:2181", "error": None, "cluster_exists": True, "base_path": "/am/web",
                                "who": "as agent", "tls": False}
    given.update(kwargs)
    return zookeeper_verdict(**given)  # type: ignore[arg-type]


def test_zookeeper_reached_with_the_cluster_passes() -> None:
    verdict = _zk(granted=30.0, asked=30.0)
    assert verdict.status is Status.PASS and "as agent, without TLS" in verdict.summary


def test_zookeeper_unreachable_fails_naming_how_the_agent_connects() -> None:
    verdict = _zk(error="no ZooKeeper connection within 5.0s", tls=True)
    assert verdict.status is Status.FAIL
    assert "as agent" in verdict.summary and "zookeeper.tls.ca" in verdict.fix


def test_zookeeper_without_the_cluster_yet_warns() -> None:
    verdict = _zk(cluster_exists=False)
    assert verdict.status is Status.WARN and "no agent of this group has started" in verdict.summary


def test_a_read_only_server_fails() -> None:
    assert _zk(read_only=True).status is Status.FAIL


AGENT = ("digest", "agent:hash=", 31)
WORLD_READ = ("world", "anyone", 1)
WORLD_READ_CREATE = ("world", "anyone", 5)
WORLD_ALL = ("world", "anyone", 31)


def test_closed_nodes_pass() -> None:
    acls = {"/am": [AGENT, WORLD_READ_CREATE], "/am/web": [AGENT, ("digest", "reader:x", 1)],
            "/am/web/members": [AGENT], "/am/web/members/vm0": [AGENT]}
    verdict = acl_verdict(acls, base_path="/am/web", configured_open=False)
    assert verdict.status is Status.PASS and "4 node(s)" in verdict.summary


def test_an_open_base_or_node_below_it_fails() -> None:
    acls = {"/am": [WORLD_ALL], "/am/web": [WORLD_ALL], "/am/web/members": [AGENT, WORLD_READ]}
    verdict = acl_verdict(acls, base_path="/am/web", configured_open=True)
    assert verdict.status is Status.FAIL
    assert "/am/web (write, create, delete, admin)" in verdict.summary and "/am/web/members" not in verdict.summary
    assert "zookeeper.auth" in verdict.fix
    below = {"/am/web": [AGENT], "/am/web/events/E1": [AGENT, ("world", "anyone", 4)]}
    assert acl_verdict(below, base_path="/am/web", configured_open=False).status is Status.FAIL


def test_world_read_of_the_groups_nodes_passes() -> None:
    assert acl_verdict({"/am/web": [AGENT, WORLD_READ]}, base_path="/am/web", configured_open=False).status \
        is Status.PASS


def test_a_root_above_the_base_that_anyone_may_change_warns() -> None:
    verdict = acl_verdict({"/am": [WORLD_ALL], "/am/web": [AGENT]}, base_path="/am/web", configured_open=False)
    assert verdict.status is Status.WARN and "/am (write, delete, admin)" in verdict.summary


def test_an_open_configuration_fails_even_when_zookeeper_could_not_be_read() -> None:
    verdict = acl_verdict({}, base_path="", configured_open=True)
    assert verdict.status is Status.FAIL and "zookeeper.auth is not set" in verdict.summary


def test_no_base_yet_fails_when_the_agents_would_create_it_open_and_warns_otherwise() -> None:
    assert acl_verdict({"/am": None, "/am/web": None}, base_path="/am/web", configured_open=True).status is Status.FAIL
    assert acl_verdict({"/am/web": None}, base_path="/am/web", configured_open=False).status is Status.WARN


# --- session timeout ------------------------------------------------------------------------------------

WAITS = {"Freeze": 35.0, "Reboot": 35.0, "Redeploy": 35.0, "Preempt": 5.0, "Terminate": 35.0}


def test_a_short_session_passes_and_says_the_tightest_type() -> None:
    verdict = session_verdict(session_timeout=20, granted=20, tick=2, waits=WAITS, notices=NOTICES, absent_grace=None)
    assert verdict.status is Status.PASS
    assert "lapses within 22 s" in verdict.summary and "Preempt with 3 s to spare" in verdict.summary


def test_the_default_session_timeout_cannot_save_a_preempt_after_a_lost_agent() -> None:
    # 30 s + a 2 s tick + the Preempt's 5 s drain wait >= its 30 s notice.
    verdict = session_verdict(session_timeout=30, granted=None, tick=2, waits=WAITS, notices=NOTICES,
                              absent_grace=None)
    assert verdict.status is Status.WARN
    assert "Preempt (30 s notice)" in verdict.summary
    assert "lower zookeeper.session_timeout below 23 s" in verdict.fix


def test_a_session_longer_than_a_minutes_long_notice_allows_fails() -> None:
    verdict = session_verdict(session_timeout=280, granted=None, tick=2, waits=WAITS, notices=NOTICES,
                              absent_grace=None)
    assert verdict.status is Status.FAIL
    assert "Terminate (300 s notice)" in verdict.summary and "Preempt" in verdict.summary


def test_the_granted_timeout_counts_when_longer_than_asked() -> None:
    verdict = session_verdict(session_timeout=20, granted=40, tick=2, waits=WAITS, notices=NOTICES,
                              absent_grace=None)
    assert verdict.status is Status.WARN and "the server granted 40 s, asked 20 s" in verdict.summary


def test_the_absent_peer_grace_adds_to_the_hold() -> None:
    verdict = session_verdict(session_timeout=20, granted=None, tick=2, waits=WAITS, notices=NOTICES,
                              absent_grace=280)
    assert verdict.status is Status.FAIL and "Terminate" in verdict.summary


def test_types_not_approved_after_a_drain_are_not_weighed() -> None:
    waits = {t: w for t, w in WAITS.items() if t != "Preempt"}
    verdict = session_verdict(session_timeout=30, granted=None, tick=2, waits=waits, notices=NOTICES,
                              absent_grace=None)
    assert verdict.status is Status.PASS


def test_no_session_timeout_fits_when_the_drain_wait_alone_fills_the_notice() -> None:
    verdict = session_verdict(session_timeout=10, granted=None, tick=2, waits={"Preempt": 25.0},
                              notices={"Preempt": 30.0}, absent_grace=None)
    assert verdict.status is Status.WARN and verdict.fix.startswith("no session timeout fits")


def test_the_session_check_reads_approval_rules_and_waits_from_the_configuration(tmp_path: Path) -> None:
    settings = Settings.model_validate({"cluster": "web", "zookeeper": {"session_timeout": 30},
                                        "policy": {"approval": {"Preempt": "immediately"}}, "state_file": None})
    ctx = Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 5)
    assert check_session(ctx).status is Status.PASS  # Preempt approved at once: no drain to wait for
    longer = Settings.model_validate({"cluster": "web", "zookeeper": {"session_timeout": 30}, "state_file": None})
    ctx = Context(settings=longer, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 5)
    assert check_session(ctx).status is Status.WARN  # 30 s + a tick + the Preempt's 5 s reach its notice


# --- probe and members ----------------------------------------------------------------------------------

SERVING = ProbeAnswer(status=200, phase="serving")


def test_a_probe_on_a_routable_address_that_answers_passes() -> None:
    verdict = probe_verdict(url="http://10.0.0.4:8090/health", is_member=True,
                            peer_urls=["http://10.0.0.5:8090/health"], answer=SERVING)
    assert verdict.status is Status.PASS and "answers 200 (serving)" in verdict.summary


def test_a_loopback_probe_fails_when_peers_are_on_other_machines() -> None:
    verdict = probe_verdict(url="http://127.0.0.1:8090/health", is_member=True,
                            peer_urls=["http://10.0.0.5:8090/health"], answer=SERVING)
    assert verdict.status is Status.FAIL and "probe.advertise" in verdict.fix


def test_a_loopback_probe_warns_in_a_group_on_one_machine() -> None:
    verdict = probe_verdict(url="http://[::1]:8090/health", is_member=True,
                            peer_urls=["http://127.0.0.1:8091/health"], answer=SERVING)
    assert verdict.status is Status.WARN and "answers 200" in verdict.summary


def test_a_member_whose_probe_does_not_answer_fails_and_a_stopped_agent_warns() -> None:
    down = ProbeAnswer(error="connection refused or unreachable")
    assert probe_verdict(url="http://10.0.0.4:8090/health", is_member=True, peer_urls=[], answer=down).status \
        is Status.FAIL
    verdict = probe_verdict(url="http://10.0.0.4:8090/health", is_member=False, peer_urls=[], answer=down)
    assert verdict.status is Status.WARN and "start the agent" in verdict.fix


def test_another_server_on_the_probe_address_fails() -> None:
    verdict = probe_verdict(url="http://10.0.0.4:8090/health", is_member=True, peer_urls=[],
                            answer=ProbeAnswer(status=200))
    assert verdict.status is Status.FAIL and "not as a coordinator probe" in verdict.summary


def test_a_member_advertising_no_probe_fails() -> None:
    assert probe_verdict(url=None, is_member=True, peer_urls=[], answer=None).status is Status.FAIL


def _member(version: str = "1.0", probe: str | None = "http://10.0.0.5:8090/health") -> dict[str, object]:
    return {"version": version, "probe": probe}


def test_members_of_one_version_with_answering_probes_pass() -> None:
    verdict = members_verdict(me="vm0", version="1.0", members={"vm0": _member(), "vm1": _member()},
                              answers={"vm1": SERVING})
    assert verdict.status is Status.PASS
    assert "2 member(s) (vm0 1.0, vm1 1.0)" in verdict.summary and "1 peer probe(s) answer" in verdict.summary


def test_members_of_another_version_or_without_a_probe_or_unreachable_warn() -> None:
    verdict = members_verdict(
        me="vm0", version="1.0",
        members={"vm0": _member(), "vm1": _member("0.9"), "vm2": _member(probe=None), "vm3": _member()},
        answers={"vm1": SERVING, "vm3": ProbeAnswer(error="no answer within 2 s")},
    )
    assert verdict.status is Status.WARN
    assert "vm1 runs 0.9" in verdict.summary and "no probe advertised: vm2" in verdict.summary
    assert "vm3 (no answer within 2 s)" in verdict.summary
    assert "rolling upgrade" in verdict.fix and "open the probe port" in verdict.fix


def test_a_vm_named_by_an_open_event_that_runs_no_agent_warns_on_any_member() -> None:
    verdict = members_verdict(me="vm0", version="1.0", members={"vm0": _member(), "vm1": _member()},
                              answers={"vm1": SERVING}, unattended={"vm2": ["E-REBOOT"], "vm7": ["E-FREEZE"]},
                              registered={"vm0", "vm1", "vm2"})
    assert verdict.status is Status.WARN
    assert ("named by an open event but running no agent: vm2 (E-REBOOT), vm7 (E-FREEZE; never seen in this "
            "group)") in verdict.summary
    assert "start the agent on vm2, vm7" in verdict.fix
    assert verdict.details["named_without_agent"] == {"vm2": ["E-REBOOT"], "vm7": ["E-FREEZE"]}
    # A member named by an open event is attended: nothing to say.
    assert members_verdict(me="vm0", version="1.0", members={"vm0": _member()}, answers={},
                           unattended={"vm0": ["E"]}).status is Status.PASS


def test_no_member_warns() -> None:
    assert members_verdict(me=None, version="1.0", members={}, answers={}).status is Status.WARN


# --- the runner -----------------------------------------------------------------------------------------


def _context(tmp_path: Path, seconds: float) -> Context:
    settings = Settings.model_validate({"cluster": "web", "state_file": None})
    return Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + seconds)


def test_checks_run_in_order_with_skips_and_each_result_is_shown_as_it_completes(tmp_path: Path) -> None:
    shown: list[str] = []
    checks = (Check("a", "a", lambda ctx: Verdict(Status.PASS, "fine")),
              Check("b", "b", lambda ctx: Verdict(Status.WARN, "hmm", "do this")),
              Check("c", "c", lambda ctx: Verdict(Status.FAIL, "never run")))
    results = run_checks(_context(tmp_path, 5), checks, {"c"}, 5, lambda r: shown.append(r.check.name))
    assert shown == ["a", "b", "c"]
    assert [r.verdict.status for r in results] == [Status.PASS, Status.WARN, Status.SKIP]
    assert results[1].line().endswith("hmm | fix: do this")
    assert results[2].verdict.summary == "skipped (--skip)"


def test_a_check_that_overruns_the_deadline_fails_and_the_rest_are_skipped(tmp_path: Path) -> None:
    release = threading.Event()

    def slow(ctx: Context) -> Verdict:
        release.wait(10)
        return Verdict(Status.PASS, "late")

    checks = (Check("slow", "slow", slow), Check("next", "next", lambda ctx: Verdict(Status.PASS, "fine")))
    began = time.monotonic()
    results = run_checks(_context(tmp_path, 0.3), checks, set(), 0.3)
    release.set()
    assert time.monotonic() - began < 2
    assert [r.verdict.status for r in results] == [Status.FAIL, Status.SKIP]
    assert "no result within the --timeout of 0.3 s" in results[0].verdict.summary


def test_a_check_that_raises_fails_and_the_run_goes_on(tmp_path: Path) -> None:
    def broken(ctx: Context) -> Verdict:
        raise RuntimeError("boom")

    checks = (Check("broken", "broken", broken), Check("next", "next", lambda ctx: Verdict(Status.PASS, "fine")))
    results = run_checks(_context(tmp_path, 5), checks, set(), 5)
    assert [r.verdict.status for r in results] == [Status.FAIL, Status.PASS]
    assert "RuntimeError: boom" in results[0].verdict.summary


# --- what the shipped defaults and files say ------------------------------------------------------------

ROOT = Path(__file__).parent.parent.parent


@pytest.mark.parametrize("config", [None, "deploy/coordinator.example.yaml", "deploy/examples/probe-only.yaml"])
def test_the_shipped_defaults_and_example_pass_the_session_check(tmp_path: Path, config: str | None) -> None:
    settings = Settings.model_validate({"cluster": "web", "state_file": None}) if config is None \
        else load_settings(ROOT / config, environ={})
    verdict = check_session(Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 5))
    assert verdict.status is Status.PASS, verdict.summary
    assert "Preempt with 3 s to spare" in verdict.summary


def test_the_config_check_warns_of_what_check_config_warns_of(tmp_path: Path) -> None:
    settings = Settings.model_validate({"cluster": "web", "state_file": None,
                                        "drain": {"wait_seconds_by_type": {"Preempt": 40}}})
    ctx = Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 5,
                  environ={"COORDINATOR_ZOOKEEPER_HOSTS": "zk1:2181"})
    verdict = check_config(ctx)
    assert verdict.status is Status.WARN
    assert "COORDINATOR_ZOOKEEPER_HOSTS is ignored" in verdict.summary and "Preempt (40 s)" in verdict.summary
    assert "state_file" not in verdict.fix and "coordinator check-config" in verdict.fix


# --- IMDS's 429 -----------------------------------------------------------------------------------------

DOCUMENT = {"DocumentIncarnation": 3, "Events": []}
COMPUTE = {"name": "web_3", "resourceId": ""}


def _imds(script: dict[str, list[httpx.Response]]) -> Callable[[httpx.Request], httpx.Response]:
    """An IMDS answering each path from its script in turn, then 200 with its document."""
    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path.rsplit("/", 1)[-1]
        if script.get(path):
            return script[path].pop(0)
        return httpx.Response(200, json=DOCUMENT if path == "scheduledevents" else COMPUTE)
    return answer


def _imds_context(tmp_path: Path, **options: object) -> Context:
    settings = Settings.model_validate({"cluster": "web", "state_file": None, "imds": {"url": "http://imds.test"},
                                        **options})
    return Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 30)


def test_a_429_is_retried_after_its_retry_after_as_the_agent_does(tmp_path: Path) -> None:
    too_many = httpx.Response(429, headers={"Retry-After": "2"})
    waits: list[float] = []
    ctx = _imds_context(tmp_path)
    transport = httpx.MockTransport(_imds({"scheduledevents": [too_many], "compute": [too_many]}))
    verdict = check_imds(ctx, transport, waits.append)
    assert verdict.status is Status.PASS and "this VM is web_3" in verdict.summary
    assert waits == [2.0, 2.0] and ctx.vm == "web_3"


def test_a_long_retry_after_is_bounded_by_the_agents_backoff(tmp_path: Path) -> None:
    waits: list[float] = []
    transport = httpx.MockTransport(_imds({"compute": [httpx.Response(429, headers={"Retry-After": "120"})]}))
    assert check_imds(_imds_context(tmp_path), transport, waits.append).status is Status.PASS
    assert waits == [8.0]  # imds.backoff_max_seconds


def test_a_429_that_persists_warns_to_run_again_and_blames_nothing_else(tmp_path: Path) -> None:
    def always(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "0"})

    verdict = check_imds(_imds_context(tmp_path), httpx.MockTransport(always), lambda _: None)
    assert verdict.status is Status.WARN and "429" in verdict.summary
    assert "run coordinator doctor again" in verdict.fix and "proxy" not in verdict.fix
    compute_only = httpx.MockTransport(_imds({"compute": [httpx.Response(429)] * 3}))
    verdict = check_imds(_imds_context(tmp_path), compute_only, lambda _: None)
    assert verdict.status is Status.WARN and "this VM's name was not read" in verdict.summary
    assert "vm_name" not in verdict.fix


def test_other_failures_are_not_retried_and_still_fail(tmp_path: Path) -> None:
    waits: list[float] = []
    transport = httpx.MockTransport(_imds({"compute": [httpx.Response(404)]}))
    verdict = check_imds(_imds_context(tmp_path), transport, waits.append)
    assert verdict.status is Status.FAIL and "set vm_name" in verdict.fix and waits == []


def test_rate_limited_verdicts_warn_where_unreachable_ones_fail() -> None:
    assert imds_verdict(error="HTTP 429", url="http://x", rate_limited=True).status is Status.WARN
    verdict = imds_verdict(error=None, incarnation=1, compute_error="HTTP 429", compute_rate_limited=True)
    assert verdict.status is Status.WARN and "set vm_name" not in verdict.fix


# --- the ACL line ---------------------------------------------------------------------------------------


def test_many_open_nodes_are_summarised_and_listed_in_full_for_json() -> None:
    acls = {"/am": [WORLD_ALL], "/am/web": [WORLD_ALL], "/am/web/members": [WORLD_ALL]}
    acls.update({f"/am/web/events/E{i:03d}-0000-0000-0000-000000000000": [WORLD_ALL] for i in range(60)})
    verdict = acl_verdict(acls, base_path="/am/web", configured_open=True)
    assert verdict.status is Status.FAIL and len(verdict.summary) < 300, verdict.summary
    assert "world:anyone may change 62 of the group's nodes: write, create, delete, admin on /am/web, " \
        "/am/web/members, /am/web/events/E000" in verdict.summary
    assert "and 59 more (--json lists them all)" in verdict.summary
    assert len(verdict.details["open_nodes"]) == 62


# --- this VM among the members --------------------------------------------------------------------------


def _member_context(tmp_path: Path, members: dict[str, dict[str, object]], vm: str | None) -> Context:
    settings = Settings.model_validate({"cluster": "web", "state_file": None, "probe": {"listen": "127.0.0.1:8090"}})
    ctx = Context(settings=settings, config_path=tmp_path / "c.yaml", deadline=time.monotonic() + 10, vm=vm)
    ctx.zookeeper = object()  # type: ignore[assignment]  # never read: the members are given
    ctx.cluster_exists = True
    ctx.members = members
    return ctx


def test_this_vms_own_probe_is_no_peer_when_imds_did_not_name_it(tmp_path: Path) -> None:
    from coordinator import __version__

    members: dict[str, dict[str, object]] = {
        "web_0": {"version": __version__, "probe": "http://127.0.0.1:8090/health"},  # this configuration's
        "web_1": {"version": __version__, "probe": "http://127.0.0.1:1/health"},
    }
    verdict = check_members(_member_context(tmp_path, members, vm=None))
    assert verdict.details["members"]["web_0"]["probe_answer"] is None  # not asked: it is this VM
    assert "web_0 (" not in verdict.summary and "web_1 (" in verdict.summary
    probe = check_probe(_member_context(tmp_path, members, vm=None))
    assert probe.details["member"] is True and probe.details["url"] == "http://127.0.0.1:8090/health"


def test_a_running_agent_advertising_another_port_than_the_configuration_is_said(tmp_path: Path) -> None:
    members: dict[str, dict[str, object]] = {"web_0": {"probe": "http://127.0.0.1:1/health"}}
    verdict = check_probe(_member_context(tmp_path, members, vm="web_0"))
    assert "the running agent advertises http://127.0.0.1:1/health, but this configuration's probe is " \
        "http://127.0.0.1:8090/health (port 1 against 8090 differ)" in verdict.summary
    assert verdict.fix.startswith("run coordinator doctor with the running agent's configuration file")


def test_another_probe_port_or_path_than_configured_warns_even_when_the_probe_answers() -> None:
    verdict = probe_verdict(url="http://10.0.0.4:8091/health", is_member=True, peer_urls=[], answer=SERVING,
                            configured_url="http://10.0.0.4:8090/health")
    assert verdict.status is Status.WARN and "answers 200 (serving)" in verdict.summary
    assert "port 8091 against 8090" in verdict.summary
    same = probe_verdict(url="http://10.0.0.4:8090/health", is_member=True, peer_urls=[], answer=SERVING,
                         configured_url="http://10.0.0.9:8090/health")  # the host is not the file's to say
    assert same.status is Status.PASS
    path = probe_verdict(url="http://10.0.0.4:8090/ready", is_member=True, peer_urls=[], answer=SERVING,
                         configured_url="http://10.0.0.4:8090/health")
    assert path.status is Status.WARN and "path /ready against /health" in path.summary
