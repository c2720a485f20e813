"""The checks of ``coordinator doctor``: each observes (IMDS, ZooKeeper, the probes) and hands what it saw
to its pure verdict in ``coordinator.doctor.verdicts`` (``verdicts_local``, ``verdicts_zookeeper``,
``verdicts_probe``, ``verdicts_delivery``).

``CHECKS`` is the ordered list the command runs; a check is a name, a title and a function of the shared
``Context`` (both defined in ``coordinator.doctor.context``, importable from here too). Checks that depend
on an earlier one (the clock on IMDS's answer, the ACL and the members on the ZooKeeper session, the
delivery on both) read what it left in the context, and are skipped with the reason when it failed. The
ARM-based checks are in ``coordinator.doctor.azure``, and the ``azure-lb`` action's own in
``coordinator.doctor.azure_lb``; the drain actions' in ``coordinator.doctor.actions``.

Nothing here writes: IMDS is only read (no approval is ever sent), and ZooKeeper is read through the
group reader of ``coordinator status`` (``coordinator.groupstatus.read``), whose kazoo client refuses
every write request, built from the configuration exactly as the agent builds its own (hosts, session
timeout, digest credentials, TLS).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import httpx

from coordinator.config import MINIMUM_NOTICE_SECONDS, ApprovalRule
from coordinator.doctor.actions import check_actions
from coordinator.doctor.azure import (
    check_approve,
    check_azure,
    check_repairs,
    check_spot,
    check_terminate,
)
from coordinator.doctor.azure import check_probe as check_lb_probe
from coordinator.doctor.azure_lb import check_admin_state
from coordinator.doctor.context import Check, Context, ImdsSeen, RecordingTransport
from coordinator.doctor.outcome import Status, Verdict
from coordinator.doctor.verdicts_delivery import delivery_verdict
from coordinator.doctor.verdicts_local import clock_verdict, config_verdict, imds_verdict, proxy_verdict
from coordinator.doctor.verdicts_probe import ProbeAnswer, members_verdict, probe_verdict
from coordinator.doctor.verdicts_zookeeper import acl_verdict, session_verdict, zookeeper_verdict
from coordinator.errors import ImdsUnavailable
from coordinator.support.httpdate import parse_http_date

__all__ = ["CHECKS", "Check", "Context", "ImdsSeen", "RecordingTransport"]

#: Documented minimum notice of each event type (seconds). Terminate's is what a scale set configures,
#: 5 to 15 minutes: without reading the scale set (ARM), the shortest is assumed.
NOTICES: Mapping[str, float] = MINIMUM_NOTICE_SECONDS

_T = TypeVar("_T")


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def check_config(ctx: Context) -> Verdict:
    from coordinator.config import config_warnings, host_problems

    problems, warnings = host_problems(ctx.settings, at_start=False)
    return config_verdict(problems, warnings, config_warnings(ctx.settings, ctx.environ))


# --- IMDS -----------------------------------------------------------------------------------------------


def check_proxy(ctx: Context) -> Verdict:
    host = httpx.URL(ctx.settings.imds.url).host
    return proxy_verdict(ctx.environ, host)


def check_imds(ctx: Context, transport: httpx.BaseTransport | None = None,
               sleep: Callable[[float], None] = time.sleep) -> Verdict:
    """Scheduled Events, then the compute metadata for this VM's name, through the agent's IMDS client
    (``transport`` and ``sleep``: the network and the clock, unless a test gives its own). A 429 is
    retried as the agent retries it (``_retrying``)."""
    from coordinator.errors import CoordinatorError
    from coordinator.imds import ImdsClient

    settings = ctx.settings.imds
    recorder = RecordingTransport(settings.url, transport)
    budget = ctx.remaining()
    client = ImdsClient(settings.url, api_version=settings.api_version,
                        request_timeout=min(settings.request_timeout, budget),
                        first_request_timeout=min(settings.first_request_timeout, budget),
                        max_attempts=1, transport=recorder)
    began = time.monotonic()
    with client:
        try:
            document = _retrying(ctx, recorder, lambda: client.get_document(attempts=1), sleep)
        except (CoordinatorError, ValueError) as exc:
            ctx.imds = ImdsSeen(False)
            return imds_verdict(error=_brief(exc), url=settings.url, configured_name=ctx.settings.vm_name,
                                rate_limited=_rate_limited(exc))
        seconds = time.monotonic() - began
        ctx.imds = recorder.last or ImdsSeen(True)
        ctx.document = document
        imds_name: str | None = None
        compute_error: str | None = None
        compute_rate_limited = False
        try:
            compute = _retrying(ctx, recorder, client.get_instance_compute, sleep)
            imds_name = compute.scheduled_events_name or None
            ctx.compute_resource_id = compute.resource_id or None
            ctx.placement_group = compute.placement_group_id
        except (CoordinatorError, ValueError) as exc:
            compute_error = _brief(exc)
            compute_rate_limited = _rate_limited(exc)
    ctx.vm = ctx.settings.vm_name or imds_name
    return imds_verdict(error=None, incarnation=document.document_incarnation, events=len(document.events),
                        seconds=seconds, configured_name=ctx.settings.vm_name, imds_name=imds_name,
                        compute_error=compute_error, url=settings.url, compute_rate_limited=compute_rate_limited)


def _rate_limited(exc: BaseException) -> bool:
    """Whether IMDS answered 429 (after the client's own attempts)."""
    return isinstance(exc, ImdsUnavailable) and exc.outcome == "rate_limited"


def _retrying(ctx: Context, recorder: RecordingTransport, call: Callable[[], _T],
              sleep: Callable[[float], None]) -> _T:
    """``call`` (one request to IMDS), asked again after a 429 as the agent's client does: after the
    answer's ``Retry-After``, else a jittered back-off doubling from 0.5 s; each wait at most
    ``imds.backoff_max_seconds``, ``imds.max_attempts`` attempts in all, and never past the run's deadline.
    IMDS allows 5 requests per second per VM in all, and the agent running beside this command spends one
    a second: a 429 here says the budget was spent at that moment, not that anything is wrong."""
    settings = ctx.settings.imds
    attempt = 1
    while True:
        try:
            return call()
        except ImdsUnavailable as exc:
            if not _rate_limited(exc) or attempt >= settings.max_attempts:
                raise
            delay = recorder.retry_after
            if delay is None:
                delay = random.uniform(0.0, 0.5 * 2.0 ** (attempt - 1))
            delay = min(delay, settings.backoff_max_seconds)
            if delay >= ctx.remaining() - 1.0:
                raise  # no time left to wait and ask again
            sleep(delay)
            attempt += 1


def check_clock(ctx: Context) -> Verdict:
    seen = ctx.imds
    if seen is None or not seen.answered:
        return Verdict(Status.SKIP, "not checked: IMDS did not answer (see the imds check)")
    offset: float | None = None
    uncertainty = 0.5 + (seen.received - seen.sent) / 2
    if seen.date:
        try:
            served: float | None = parse_http_date(seen.date).timestamp()
        except ValueError:  # a naive date is taken as UTC; anything unreadable is no Date
            served = None
        if served is not None:
            # Date has whole seconds: the server's time was within [served, served + 1).
            offset = served + 0.5 - (seen.sent + seen.received) / 2
    return clock_verdict(offset, uncertainty, latest_start=ctx.settings.drain.latest_start_seconds)


# --- ZooKeeper ------------------------------------------------------------------------------------------


def check_zookeeper(ctx: Context) -> Verdict:
    from coordinator.groupstatus.read import GroupReader, GroupStatusError
    from coordinator.store.zk_security import identity_words

    settings = ctx.settings
    options = settings.zookeeper.client_options()
    who = identity_words(options.auth_data, options.tls)
    timeout = ctx.remaining(settings.zookeeper.operation_timeout)
    base_path = f"{settings.zookeeper.root.rstrip('/')}/{settings.cluster}"
    reader = None
    try:
        reader = GroupReader(options.hosts, settings.zookeeper.root, settings.cluster, timeout=timeout,
                             ask_agents_too=False, auth_data=options.auth_data, tls=options.tls,
                             session_timeout=options.session_timeout)
        reader.open(require_cluster=False)
        ctx.cluster_exists = reader.exists()
    except GroupStatusError as exc:
        if reader is not None:
            reader.close()
        ctx.zookeeper_error = _brief(exc).removeprefix(f"cannot reach ZooKeeper at {options.hosts}: ")
        return zookeeper_verdict(hosts=options.hosts, error=ctx.zookeeper_error, cluster_exists=False,
                                 base_path=base_path, who=who, tls=options.tls is not None,
                                 asked=options.session_timeout)
    ctx.zookeeper = reader
    ctx.granted = reader.granted_session_timeout
    return zookeeper_verdict(hosts=options.hosts, error=None, cluster_exists=ctx.cluster_exists, base_path=base_path,
                             who=who, tls=options.tls is not None, read_only=reader.connected_read_only,
                             granted=ctx.granted, asked=options.session_timeout)


_MAX_ACL_READS = 100


def check_acl(ctx: Context) -> Verdict:
    from coordinator.groupstatus.read import GroupStatusError

    reader = ctx.zookeeper
    if reader is None:
        if ctx.settings.zookeeper.acls is None:  # known without reading: the agents create open nodes
            return acl_verdict({}, base_path="", configured_open=True)
        return Verdict(Status.SKIP, "not checked: no ZooKeeper session (see the zookeeper check)")
    base = reader.base_path
    paths: list[str] = []
    parts = [p for p in base.split("/") if p]
    paths += ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]  # root's components above the base
    acls: dict[str, list[tuple[str, str, int]] | None] = {}
    try:
        if ctx.cluster_exists:
            paths.append(base)
            for child in reader.children(base):
                paths.append(f"{base}/{child}")
                if child in ("members", "events", "out", "registry", "absent"):
                    paths += [f"{base}/{child}/{grandchild}" for grandchild in reader.children(f"{base}/{child}")]
        for path in paths[:_MAX_ACL_READS]:
            acl = reader.acl(path)
            acls[path] = None if acl is None else [(entry.id.scheme, entry.id.id, entry.perms) for entry in acl]
    except GroupStatusError as exc:
        return Verdict(Status.WARN, f"cannot read the ACL of the group's nodes: {_brief(exc)}",
                       "run coordinator doctor with the agents' configuration (their zookeeper.auth), or give "
                       "this identity read access (zookeeper.acl.readers)")
    acls.setdefault(base, None)
    return acl_verdict(acls, base_path=base, configured_open=ctx.settings.zookeeper.acls is None)


# --- timing ---------------------------------------------------------------------------------------------


def check_session(ctx: Context) -> Verdict:
    settings = ctx.settings
    after_drain = {event_type for event_type in NOTICES
                   if settings.policy.approval.get(event_type, ApprovalRule.AFTER_DRAIN) is ApprovalRule.AFTER_DRAIN}
    return session_verdict(
        session_timeout=settings.zookeeper.session_timeout,
        granted=ctx.granted,
        tick=settings.zookeeper.tick_seconds,
        waits={t: settings.drain.wait_for(t) for t in after_drain},
        notices=NOTICES,
        absent_grace=settings.policy.absent_peer_grace_seconds,
    )


# --- the probe and the members --------------------------------------------------------------------------


def _read_members(ctx: Context) -> dict[str, dict[str, object]]:
    """The live members and their member info (read once, shared by the probe and members checks)."""
    if ctx.members is None:
        assert ctx.zookeeper is not None
        read = ctx.zookeeper.read(history=False)  # the open records are what it checks
        ctx.members = {vm: dict(read.member_info.get(vm, {})) for vm in sorted(read.view.members)}
        ctx.registered = frozenset(read.view.known)
        for key, record in sorted(read.view.records.items()):
            if record.done_at is not None:
                continue
            for vm in record.resources:
                if vm not in read.view.members:
                    ctx.unattended.setdefault(vm, []).append(record.event_id or key)
    return ctx.members


def _ask_probe(url: str, timeout: float) -> ProbeAnswer:
    from coordinator.peers import PHASE_HEADER

    try:
        response = httpx.get(url, timeout=timeout, trust_env=False, follow_redirects=False)
    except httpx.TimeoutException:
        return ProbeAnswer(error=f"no answer within {timeout:g} s")
    except httpx.HTTPError as exc:
        return ProbeAnswer(error="connection refused or unreachable" if isinstance(exc, httpx.ConnectError)
                           else _brief(exc))
    return ProbeAnswer(status=response.status_code, phase=response.headers.get(PHASE_HEADER))


def _configured_probe_url(ctx: Context) -> str:
    """The probe URL an agent started with this configuration advertises."""
    from coordinator.httpserver import split_host_port
    from coordinator.runtime import advertised_probe_url

    return advertised_probe_url(ctx.settings, split_host_port(ctx.settings.probe.listen))


def _me(ctx: Context, members: Mapping[str, Mapping[str, object]], configured_url: str) -> str:
    """This VM's member name: its name (vm_name, else IMDS's) when a member has it; else, when that name is
    unknown (IMDS did not say), the one member that advertises the probe URL this configuration gives;
    else "". A member wrongly taken for a peer would be probed as one and counted as one."""
    name = (ctx.vm or "").lower()
    if name in members or ctx.vm is not None:
        return name
    same = [vm for vm, info in members.items() if info.get("probe") == configured_url]
    return same[0] if len(same) == 1 else ""


def check_probe(ctx: Context) -> Verdict:
    from coordinator.groupstatus.read import GroupStatusError

    members: dict[str, dict[str, object]] = {}
    if ctx.zookeeper is not None and ctx.cluster_exists:
        try:
            members = _read_members(ctx)
        except GroupStatusError as exc:
            return Verdict(Status.SKIP, f"not checked: cannot read the members: {_brief(exc)}")
    configured = _configured_probe_url(ctx)
    me = _me(ctx, members, configured)
    if me in members:
        advertised = members[me].get("probe")
        url = advertised if isinstance(advertised, str) and advertised else None
    else:
        url = configured
    peers = [str(info["probe"]) for vm, info in members.items()
             if vm != me and isinstance(info.get("probe"), str) and info["probe"]]
    answer = _ask_probe(url, ctx.remaining(2.0)) if url is not None else None
    return probe_verdict(url=url, is_member=me in members, peer_urls=peers, answer=answer, configured_url=configured)


def check_members(ctx: Context) -> Verdict:
    from concurrent.futures import ThreadPoolExecutor

    from coordinator import __version__
    from coordinator.groupstatus.read import GroupStatusError

    if ctx.zookeeper is None:
        return Verdict(Status.SKIP, "not checked: no ZooKeeper session (see the zookeeper check)")
    if not ctx.cluster_exists:
        return Verdict(Status.SKIP, "not checked: the group has no node in ZooKeeper yet")
    try:
        members = _read_members(ctx)
    except GroupStatusError as exc:
        return Verdict(Status.WARN, f"cannot read the members: {_brief(exc)}", "check the zookeeper check's advice")
    me = _me(ctx, members, _configured_probe_url(ctx))
    urls = {vm: str(info["probe"]) for vm, info in members.items()
            if vm != me and isinstance(info.get("probe"), str) and info["probe"]}
    answers: dict[str, ProbeAnswer] = {}
    if urls:
        timeout = ctx.remaining(2.0)
        with ThreadPoolExecutor(max_workers=min(16, len(urls)), thread_name_prefix="doctor-probe") as pool:
            futures = {vm: pool.submit(_ask_probe, url, timeout) for vm, url in urls.items()}
            answers = {vm: future.result() for vm, future in futures.items()}
    return members_verdict(me=me or None, version=__version__, members=members, answers=answers,
                           unattended=ctx.unattended, registered=ctx.registered)


def check_delivery(ctx: Context) -> Verdict:
    """This VM's delivery unit and mode (``imds.unit``, ``imds.delivery``) against what the imds check read
    (the compute metadata's ``placementGroupId``, the document's events naming other VMs and not this one;
    no request of its own) and what the members publish."""
    from coordinator.groupstatus.read import GroupStatusError

    members: dict[str, dict[str, object]] | None = None
    members_error: str | None = None
    if ctx.zookeeper is None:
        members_error = "no ZooKeeper session"
    elif not ctx.cluster_exists:
        members_error = "the group has no node in ZooKeeper yet"
    else:
        try:
            members = _read_members(ctx)
        except GroupStatusError as exc:
            members_error = _brief(exc)
    if ctx.document is None and ctx.placement_group is None and members is None:
        return Verdict(Status.SKIP, "not checked: IMDS was not read (see the imds check), nor the members "
                       f"({members_error})")
    unnamed: list[str] | None = None
    if ctx.document is not None and ctx.vm is not None:
        unnamed = [e.event_id for e in ctx.document.events if e.resources and not e.names(ctx.vm)]
    imds = ctx.settings.imds
    return delivery_verdict(configured_unit=imds.unit, mode=imds.delivery, vm_name_set=ctx.settings.vm_name is not None,
                            placement_group=ctx.placement_group, unnamed_events=unnamed, members=members,
                            me=_me(ctx, members, _configured_probe_url(ctx)) if members is not None else None,
                            members_error=members_error)


# --- Azure Resource Manager -----------------------------------------------------------------------------


CHECKS: tuple[Check, ...] = (
    Check("config", "the configuration on this machine", check_config),
    Check("actions", "each drain action, tried without changing anything", check_actions),
    Check("imds-proxy", "proxy variables against IMDS", check_proxy),
    Check("imds", "IMDS Scheduled Events", check_imds),
    Check("clock", "wall clock against IMDS's Date", check_clock),
    Check("zookeeper", "ZooKeeper reachable as the agent connects", check_zookeeper),
    Check("zookeeper-acl", "the group's nodes not world-writable", check_acl),
    Check("session-timeout", "session timeout against notice and drain wait", check_session),
    Check("probe", "this VM's probe on its advertised address", check_probe),
    Check("members", "the group's members, versions and probes", check_members),
    Check("delivery", "this VM's delivery unit and mode against IMDS and the members", check_delivery),
    Check("azure", "Azure resources read with this VM's identity", check_azure),
    Check("azure-probe", "load balancer probe against the drain wait", check_lb_probe),
    Check("azure-repairs", "automatic repairs' grace period against a drain", check_repairs),
    Check("azure-terminate", "scale-set terminate notifications", check_terminate),
    Check("azure-approve", "scheduledEventsPolicy automatic approvals", check_approve),
    Check("azure-spot", "Spot priority", check_spot),
    Check("azure-lb", "the azure-lb action's identity, pools and right to write them", check_admin_state),
)
