"""The verdict of each ``coordinator doctor`` check, from what was observed: pure functions, no I/O.

Each takes plain values (what IMDS answered, the ACL read, the member info...) and returns a ``Verdict``:
PASS, WARN or FAIL with one line saying what was found and, unless PASS, one line saying what to do.
SKIP is for a check that did not run (``--skip``, a prerequisite that failed, or a check that needs
what is not built yet); it never changes the exit status.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "CLOCK_FAIL_SECONDS",
    "CLOCK_WARN_SECONDS",
    "LONGEST_DRAIN_SECONDS",
    "LbProbe",
    "ProbeAnswer",
    "Status",
    "Verdict",
    "acl_verdict",
    "auto_approve_verdict",
    "clock_verdict",
    "config_verdict",
    "exit_status",
    "imds_verdict",
    "iso_duration_seconds",
    "lb_probe_verdict",
    "members_verdict",
    "probe_verdict",
    "proxy_verdict",
    "repairs_verdict",
    "session_verdict",
    "spot_verdict",
    "terminate_verdict",
    "worst",
    "zookeeper_verdict",
]


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


_RANK = {Status.SKIP: 0, Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2}


@dataclass(frozen=True)
class Verdict:
    """One check's outcome: ``summary`` says what was found, ``fix`` (one line, empty for PASS and SKIP)
    what to do; ``details`` are the observed values, for ``--json``."""

    status: Status
    summary: str
    fix: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)


def worst(statuses: Iterable[Status]) -> Status:
    """The worst of ``statuses`` (PASS when there are none or all were skipped)."""
    found = Status.PASS
    for status in statuses:
        if _RANK[status] > _RANK[found]:
            found = status
    return found


def exit_status(statuses: Iterable[Status]) -> int:
    """0 when every check passed (or was skipped), 1 when the worst is a WARN, 2 when one FAILed."""
    return _RANK[worst(statuses)]


def config_verdict(problems: Sequence[str], warnings: Sequence[str]) -> Verdict:
    """What ``coordinator check-config`` would say of this machine (the file itself already loaded)."""
    details = {"problems": list(problems), "warnings": list(warnings)}
    if problems:
        return Verdict(Status.FAIL, "; ".join(problems), "fix state_file or its directory: the agent refuses to "
                       "start", details)
    if warnings:
        return Verdict(Status.WARN, "; ".join(warnings), "check state_file as the user the agent runs as", details)
    return Verdict(Status.PASS, "valid, and usable on this machine", details=details)


# --- IMDS ------------------------------------------------------------------------------------------------

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


def _no_proxy_covers(no_proxy: str, host: str) -> bool:
    """Whether a ``NO_PROXY`` value exempts ``host`` (an IP address or a name): ``*``, the host itself
    (optionally with a port), a CIDR block holding it, or a domain suffix of a name."""
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    for entry in (part.strip().lower() for part in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        bare = entry.rsplit(":", 1)[0] if entry.count(":") == 1 else entry
        if bare == host.lower():
            return True
        if address is not None and "/" in entry:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
        if address is None and host.lower().endswith("." + bare.lstrip(".")):
            return True
    return False


def proxy_verdict(environ: Mapping[str, str], imds_host: str) -> Verdict:
    """Proxy variables in this environment against IMDS at ``imds_host``. Azure's IMDS must be reached
    directly (a proxy cannot reach 169.254.169.254 for this VM, and IMDS refuses requests carrying
    ``X-Forwarded-For``): the agent never uses a proxy for it, but hooks, scripts and tools on the VM
    inherit these variables. A proxy variable set without ``NO_PROXY`` covering the address is a WARN."""
    lowered: dict[str, str] = {}
    for name, value in environ.items():
        if name.lower() in (*_PROXY_VARIABLES, "no_proxy") and value.strip():
            lowered.setdefault(name.lower(), value)
    proxies = sorted(name for name in lowered if name in _PROXY_VARIABLES)
    if not proxies:
        return Verdict(Status.PASS, "no proxy variable set", details={"proxy_variables": []})
    no_proxy = lowered.get("no_proxy", "")
    details = {"proxy_variables": proxies, "no_proxy": no_proxy}
    if _no_proxy_covers(no_proxy, imds_host):
        return Verdict(Status.PASS, f"{', '.join(p.upper() for p in proxies)} set, NO_PROXY exempts {imds_host}",
                       details=details)
    return Verdict(
        Status.WARN,
        f"{', '.join(p.upper() for p in proxies)} set and NO_PROXY does not exempt {imds_host}: hooks and tools "
        "on this VM would send IMDS requests through the proxy (the agent itself never does)",
        f"add {imds_host} to NO_PROXY and no_proxy (Azure: IMDS must never be reached through a proxy)",
        details,
    )


def imds_verdict(
    *,
    error: str | None,
    incarnation: int | None = None,
    events: int = 0,
    seconds: float = 0.0,
    configured_name: str | None = None,
    imds_name: str | None = None,
    compute_error: str | None = None,
    url: str = "",
) -> Verdict:
    """Scheduled Events read through the agent's IMDS client (``error`` set if it failed), and this VM's
    name as the configuration and IMDS's compute metadata give it."""
    details: dict[str, Any] = {"url": url, "incarnation": incarnation, "events": events,
                               "seconds": round(seconds, 3), "vm_name": configured_name, "imds_name": imds_name}
    if error is not None:
        return Verdict(Status.FAIL, f"Scheduled Events at {url} did not answer: {error}",
                       "let this VM reach IMDS directly (no proxy, no route or firewall rule in the way); the "
                       "first request of a VM may take up to 2 minutes: run again with a longer --timeout",
                       {**details, "error": error})
    found = f"Scheduled Events answered in {seconds:.2f} s (incarnation {incarnation}, {events} event(s))"
    if configured_name is not None and imds_name and configured_name.lower() != imds_name.lower():
        return Verdict(Status.FAIL, f"{found}, but vm_name is {configured_name!r} while IMDS names this VM "
                       f"{imds_name!r}: events name it {imds_name!r} in Resources",
                       f"set vm_name to {imds_name!r}, or remove it to use IMDS's name", details)
    if compute_error is not None and configured_name is None:
        return Verdict(Status.FAIL, f"{found}, but this VM's name could not be read: {compute_error}",
                       "set vm_name to this VM's name as Scheduled Events lists it in Resources",
                       {**details, "compute_error": compute_error})
    name = configured_name or imds_name
    return Verdict(Status.PASS, f"{found}; this VM is {name}", details=details)


#: Beyond this offset between IMDS's ``Date`` and this VM's clock (seconds), a WARN; beyond the other, a FAIL.
CLOCK_WARN_SECONDS = 5.0
CLOCK_FAIL_SECONDS = 30.0


def clock_verdict(offset: float | None, uncertainty: float, *, latest_start: float) -> Verdict:
    """``offset``: IMDS's ``Date`` minus this VM's clock at the same moment (seconds; positive: this
    clock is behind), ``uncertainty`` how far off that measure can be (``Date`` has whole seconds, plus
    half the round trip); None when IMDS sent no usable ``Date``.

    Why it matters: the agent compares NotBefore with this clock to start a drain that the budget did not
    admit ``drain.latest_start_seconds`` before NotBefore. A clock behind by X starts it X seconds late (an
    event can then hit a VM still serving); a clock ahead drains too early, and every time written in
    ZooKeeper and the logs is off."""
    if offset is None:
        return Verdict(Status.WARN, "IMDS sent no usable Date header: the clock was not compared",
                       "check that time synchronisation runs (chronyc tracking, or timedatectl)")
    beyond = max(0.0, abs(offset) - uncertainty)
    direction = "behind" if offset > 0 else "ahead of"
    details = {"offset_seconds": round(offset, 3), "uncertainty_seconds": round(uncertainty, 3)}
    if beyond <= CLOCK_WARN_SECONDS:
        return Verdict(Status.PASS, f"this clock is within {abs(offset) + uncertainty:.1f} s of IMDS's Date",
                       details=details)
    said = (f"this clock is {abs(offset):.0f} s {direction} IMDS's Date: NotBefore is compared with it, so a "
            f"drain due {latest_start:g} s before NotBefore starts "
            + ("that much late" if offset > 0 else "that much early"))
    fix = "synchronise the clock (chrony with Azure's PTP source /dev/ptp_hyperv, or NTP) and check chronyc tracking"
    if beyond > CLOCK_FAIL_SECONDS:
        return Verdict(Status.FAIL, said, fix, details)
    return Verdict(Status.WARN, said, fix, details)


# --- ZooKeeper ------------------------------------------------------------------------------------------


def zookeeper_verdict(
    *, hosts: str, error: str | None, cluster_exists: bool, base_path: str, who: str, tls: bool,
    read_only: bool = False, granted: float | None = None, asked: float = 0.0,
) -> Verdict:
    """The agent's connection to the ensemble (``who``: how it presented itself), and whether the group's
    base node exists yet."""
    details = {"hosts": hosts, "base_path": base_path, "tls": tls, "granted_session_timeout": granted,
               "asked_session_timeout": asked, "read_only_server": read_only}
    if error is not None:
        return Verdict(Status.FAIL, f"cannot reach ZooKeeper at {hosts} {who}: {error}",
                       "check zookeeper.hosts, the network path to the client port"
                       + (" (TLS: the secure port, zookeeper.tls.ca)" if tls else "")
                       + " and zookeeper.auth", {**details, "error": error})
    found = f"connected to {hosts} {who}, {'over TLS' if tls else 'without TLS'}"
    if read_only:
        return Verdict(Status.FAIL, f"{found}, but the server is read-only (cut off from its quorum)",
                       "restore the ensemble's quorum: agents cannot join or acknowledge meanwhile", details)
    if not cluster_exists:
        return Verdict(Status.WARN, f"{found}; {base_path} does not exist: no agent of this group has started",
                       "start the agents, then run coordinator doctor again", details)
    return Verdict(Status.PASS, f"{found}; {base_path} exists", details=details)


_WORLD_WRITES = {"write": 2, "create": 4, "delete": 8, "admin": 16}


def _world_rights(acl: Sequence[tuple[str, str, int]]) -> list[str]:
    """What ``world:anyone`` (or ``auth`` with no identity) may do besides read, from (scheme, id, perms)."""
    perms = 0
    for scheme, ident, bits in acl:
        if (scheme, ident) == ("world", "anyone"):
            perms |= bits
    return [name for name, bit in _WORLD_WRITES.items() if perms & bit]


def acl_verdict(
    acls: Mapping[str, Sequence[tuple[str, str, int]] | None], *, base_path: str, configured_open: bool
) -> Verdict:
    """The ACLs read from the group's nodes (path -> (scheme, id, permissions); None: no such node).

    The group's base node and the nodes below it must not let ``world:anyone`` write, create, delete or
    change the ACL: anyone who reaches the ensemble could then forge an acknowledgement or an approval.
    The components of ``zookeeper.root`` above the base let anyone read and create children (another
    group's base) by design; anything more there is a WARN."""
    details: dict[str, Any] = {
        path: [f"{scheme}:{ident}:{perms}" for scheme, ident, perms in acl] if acl is not None else None
        for path, acl in acls.items()
    }
    fix_open = "set zookeeper.auth on every agent (and zookeeper.acl for operators and readers): the agents " \
               "then close the nodes at their next start (docs/security.md)"
    if not acls and configured_open:
        return Verdict(Status.FAIL, "zookeeper.auth is not set: the agents create the group's nodes open to anyone "
                       "who reaches the ensemble (not read: no ZooKeeper session)", fix_open, details)
    if acls.get(base_path) is None:
        if configured_open:
            return Verdict(Status.FAIL, f"{base_path} does not exist yet and zookeeper.auth is not set: the agents "
                           "will create it open to anyone", fix_open, details)
        return Verdict(Status.WARN, f"{base_path} does not exist yet: its ACL cannot be checked",
                       "start the agents, then run coordinator doctor again", details)
    open_nodes = {}
    for path, acl in acls.items():
        if acl is None or not (path == base_path or path.startswith(base_path + "/")):
            continue
        rights = _world_rights(acl)
        if rights:
            open_nodes[path] = rights
    if open_nodes:
        listed = "; ".join(f"{path} ({', '.join(rights)})" for path, rights in sorted(open_nodes.items()))
        return Verdict(Status.FAIL, f"world:anyone may change the group's nodes: {listed}", fix_open, details)
    loose = {}
    for path, acl in acls.items():
        if acl is None or path == base_path or path.startswith(base_path + "/"):
            continue
        rights = [r for r in _world_rights(acl) if r != "create"]
        if rights:
            loose[path] = rights
    checked = sum(1 for path, acl in acls.items() if acl is not None)
    if loose:
        listed = "; ".join(f"{path} ({', '.join(rights)})" for path, rights in sorted(loose.items()))
        return Verdict(Status.WARN, f"the group's nodes are closed, but world:anyone may change the root above "
                       f"them: {listed}", "restrict those nodes' ACL to read and create for world:anyone "
                       "(setAcl in zkCli.sh)", details)
    return Verdict(Status.PASS, f"{checked} node(s) read: none writable by world:anyone", details=details)


# --- timing ---------------------------------------------------------------------------------------------


def session_verdict(
    *,
    session_timeout: float,
    granted: float | None,
    tick: float,
    waits: Mapping[str, float],
    notices: Mapping[str, float],
    absent_grace: float | None,
) -> Verdict:
    """The session timeout against each event type's notice and drain wait.

    The rule: an agent that is lost (its process hung, its VM cut off) keeps its member node, and with it
    its place as leader or approver, until its session lapses on the server: the longest of the asked
    and granted timeouts (at least two ticks), plus a tick. Only then does another agent take over; and
    the event's VMs still need their drain wait (a lost VM named by the event counts as drained only after
    ``policy.absent_peer_grace_seconds``). So an event can still be approved early after such a loss only if
    lapse + max(drain wait, absent grace) < its notice. ``waits`` and ``notices`` hold the event types that
    are approved after a drain. A type that cannot make it is a FAIL when its notice is minutes long (the
    whole point of early approval is lost there), a WARN for a Preempt's 30 s."""
    lapse = max(session_timeout, granted or 0.0, 2 * tick) + tick
    short: dict[str, tuple[float, float]] = {}
    for event_type, notice in notices.items():
        if event_type not in waits:
            continue
        hold = max(waits[event_type], absent_grace or 0.0)
        if lapse + hold >= notice:
            short[event_type] = (notice, hold)
    details = {"session_timeout": session_timeout, "granted": granted, "tick": tick, "lapse": lapse,
               "short": sorted(short)}
    granted_note = "" if granted is None or math.isclose(granted, session_timeout) else \
        f" (the server granted {granted:g} s, asked {session_timeout:g} s)"
    if not short:
        tightest = min((notices[t] - lapse - max(waits[t], absent_grace or 0.0), t) for t in notices if t in waits) \
            if any(t in waits for t in notices) else None
        margin = f"; tightest: {tightest[1]} with {tightest[0]:.0f} s to spare" if tightest else ""
        return Verdict(Status.PASS, f"a lost agent's session lapses within {lapse:g} s{granted_note}: every "
                       f"event type can still be approved before its NotBefore{margin}", details=details)
    worst_type = min(short, key=lambda t: short[t][0] - short[t][1])
    notice, hold = short[worst_type]
    limit = notice - hold - tick  # lapse + hold < notice, lapse being the session timeout plus a tick
    listed = ", ".join(f"{t} ({short[t][0]:g} s notice)" for t in sorted(short))
    said = (f"a lost agent holds approvals for {lapse:g} s (session timeout{granted_note} plus a tick) before "
            f"the drain wait: {listed} would start at NotBefore unapproved")
    if limit > 2 * tick:
        fix = (f"lower zookeeper.session_timeout below {limit:g} s (and the servers' maxSessionTimeout), or "
               f"accept that {', '.join(sorted(short))} then starts at NotBefore")
    else:
        fix = f"no session timeout fits; accept that {', '.join(sorted(short))} starts at NotBefore after a lost agent"
    status = Status.FAIL if any(short[t][0] >= 300 for t in short) else Status.WARN
    return Verdict(status, said, fix, details)


# --- the probe and the members --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeAnswer:
    """What a GET of a probe URL got: the status and the agent's ``X-Coordinator-Phase`` header, or an error."""

    status: int | None = None
    phase: str | None = None
    error: str | None = None


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def probe_verdict(
    *, url: str | None, is_member: bool, peer_urls: Sequence[str], answer: ProbeAnswer | None
) -> Verdict:
    """This VM's probe as its peers would reach it: ``url`` is what its member node advertises (or, when
    its agent has not joined, what it would advertise), ``peer_urls`` what the other members advertise,
    ``answer`` what a GET of ``url`` from this VM got."""
    details: dict[str, Any] = {"url": url, "member": is_member}
    if url is None:
        return Verdict(Status.FAIL, "this VM's member node advertises no probe URL: peers cannot confirm it serving",
                       "upgrade the agent (it advertises its probe since it counts peers by probe)", details)
    if answer is not None:
        details.update(status=answer.status, phase=answer.phase, error=answer.error)
    host = _host(url)
    remote_peers = [u for u in peer_urls if not is_loopback(_host(u))]
    loopback_line: Verdict | None = None
    if is_loopback(host):
        if remote_peers:
            return Verdict(Status.FAIL, f"this VM advertises its probe at {url}, a loopback address its peers on "
                           "other machines cannot reach", "set probe.advertise to this VM's address in the "
                           "virtual network (HOST:PORT), and probe.listen to an address that accepts it", details)
        loopback_line = Verdict(Status.WARN, f"{url} is a loopback address: only agents on this machine reach it",
                                "on Azure, set probe.advertise to this VM's address in the virtual network "
                                "(fine for a group on one machine)", details)
    if answer is None or answer.error is not None:
        why = answer.error if answer is not None else "not asked"
        if is_member:
            return Verdict(Status.FAIL, f"this VM's agent is a member but nothing answers at {url}: {why}",
                           "check probe.advertise and probe.listen, and that the port is open to the "
                           "virtual network (NSG, host firewall)", details)
        return Verdict(Status.WARN, f"no agent of this VM has joined and nothing answers at {url}: {why}",
                       "start the agent, then run coordinator doctor again", details)
    if answer.phase is None:
        return Verdict(Status.FAIL, f"{url} answers HTTP {answer.status}, but not as a coordinator probe (no "
                       "X-Coordinator-Phase header): another server has that address",
                       "set probe.advertise (or probe.listen) to the agent's own probe address", details)
    if loopback_line is not None:
        return Verdict(loopback_line.status, f"{loopback_line.summary}; it answers {answer.status} ({answer.phase})",
                       loopback_line.fix, details)
    return Verdict(Status.PASS, f"{url} answers {answer.status} ({answer.phase}), from an address peers can use",
                   details=details)


def members_verdict(
    *,
    me: str | None,
    version: str,
    members: Mapping[str, Mapping[str, object]],
    answers: Mapping[str, ProbeAnswer],
) -> Verdict:
    """The group's live members (vm -> member info), the agent version each runs against ``version`` (this
    installation's), whether each advertises a probe, and whether the peers' probes answer from this VM
    (``answers``: vm -> what a GET of its advertised probe got)."""
    details: dict[str, Any] = {
        "members": {vm: {"version": info.get("version"), "probe": info.get("probe"),
                         "probe_answer": (answers[vm].status if vm in answers and answers[vm].error is None
                                          else (answers[vm].error if vm in answers else None))}
                    for vm, info in sorted(members.items())},
    }
    if not members:
        return Verdict(Status.WARN, "no live member in the group", "start the agents, then run coordinator doctor "
                       "again", details)
    problems: list[str] = []
    versions = {vm: str(info.get("version") or "unknown") for vm, info in members.items()}
    other = sorted(vm for vm, v in versions.items() if v != version)
    if other:
        problems.append("version differs from this installation's " + version + ": "
                        + ", ".join(f"{vm} runs {versions[vm]}" for vm in other))
    no_probe = sorted(vm for vm, info in members.items() if not isinstance(info.get("probe"), str) or not info["probe"])
    if no_probe:
        problems.append("no probe advertised: " + ", ".join(no_probe))
    unreachable = sorted(vm for vm, answer in answers.items() if vm != me and answer.error is not None)
    if unreachable:
        problems.append("probe not reachable from this VM: "
                        + ", ".join(f"{vm} ({answers[vm].error})" for vm in unreachable))
    listed = ", ".join(f"{vm} {versions[vm]}" for vm in sorted(members))
    if problems:
        fixes = []
        if other:
            fixes.append("finish the rolling upgrade so every agent runs one version")
        if no_probe:
            fixes.append("upgrade the agents that advertise no probe")
        if unreachable:
            fixes.append("open the probe port between the VMs (NSG, host firewall) and check their probe.advertise")
        return Verdict(Status.WARN, f"{len(members)} member(s) ({listed}); " + "; ".join(problems),
                       "; ".join(fixes), details)
    reached = sum(1 for vm, answer in answers.items() if vm != me and answer.error is None)
    return Verdict(Status.PASS, f"{len(members)} member(s) ({listed}), one version, every probe advertised"
                   + (f", {reached} peer probe(s) answer from this VM" if reached else ""), details=details)


# --- Azure Resource Manager -----------------------------------------------------------------------------

#: A drain can last until NotBefore: the longest notice of an event type approved after a drain.
LONGEST_DRAIN_SECONDS = 900.0


def iso_duration_seconds(value: object) -> float | None:
    """Seconds of an ISO 8601 duration as ARM writes them (``PT10M``, ``PT1H30M``, ``PT90S``); None if not one."""
    if not isinstance(value, str):
        return None
    match = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", value.strip().upper())
    if match is None or not any(match.groups()):
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


@dataclass(frozen=True)
class LbProbe:
    """A load balancer health probe as ARM describes it (``Probe`` of loadBalancer.json)."""

    lb: str
    name: str
    protocol: str
    port: int | None
    interval: float  # intervalInSeconds (15 when absent)
    threshold: int  # probeThreshold, else numberOfProbes, else 1
    request_path: str | None = None


def lb_probe_verdict(*, probes: Sequence[LbProbe], port: int, path: str, configured_interval: float,
                     configured_threshold: int, probe_wait: float, admin_state: bool) -> Verdict:
    """The load balancer's probe against the agent's probe (``port``, ``path``) and the drain wait that
    relies on the probe (``probe_wait``: ``drain.wait_seconds``, or with admin state the azure-lb action's
    fallback wait). The load balancer stops new flows ``interval x threshold`` after the probe fails: a
    probe-based drain wait shorter than that acknowledges while new flows still arrive (FAIL). A Tcp probe
    never sees the agent's 503 (FAIL); a probe on another path, or ``drain.probe_*`` values that differ
    from the load balancer's, are a WARN."""
    details: dict[str, Any] = {"probes": [{"lb": p.lb, "name": p.name, "protocol": p.protocol, "port": p.port,
                                           "interval": p.interval, "threshold": p.threshold,
                                           "request_path": p.request_path} for p in probes],
                               "probe_wait": probe_wait, "admin_state": admin_state}
    mine = [p for p in probes if p.port == port]
    if not mine:
        listed = ", ".join(f"{p.lb}/{p.name} ({p.protocol} {p.port})" for p in probes) or "none"
        return Verdict(Status.WARN, f"no probe of the load balancer targets the agent's probe port {port} (probes: "
                       f"{listed}): draining by probe does not stop the load balancer's flows",
                       f"point the load balancer's health probe at port {port}, path {path} (probe.listen, "
                       "probe.path) and its load-balancing rules at that probe", details)
    probe = max(mine, key=lambda p: p.interval * p.threshold)
    lag = probe.interval * probe.threshold
    details.update(lag=lag, probe=probe.name)
    said = (f"{probe.lb}/{probe.name}: {probe.protocol} port {probe.port}, every {probe.interval:g} s, "
            f"threshold {probe.threshold}: new flows stop {lag:g} s after the probe fails")
    if probe.protocol.lower() == "tcp":
        return Verdict(Status.FAIL, f"{said}, but a Tcp probe only checks that the port accepts connections: the "
                       "agent's 503 never takes the VM out of rotation",
                       f"make the probe Http on port {probe.port} with requestPath {path}", details)
    wait_name = "the azure-lb action's fallback wait" if admin_state else "the drain wait"
    if probe_wait < lag:
        return Verdict(Status.FAIL, f"{said}; {wait_name} is {probe_wait:g} s: the VM is acknowledged drained while "
                       "the load balancer still sends it new flows",
                       f"set drain.probe_interval_seconds: {probe.interval:g} and drain.probe_threshold: "
                       f"{probe.threshold} (and drop drain.wait_seconds, or raise it to at least {lag:g} s"
                       + (", or fallback_wait_seconds" if admin_state else "") + ")", details)
    problems = []
    if probe.request_path is not None and probe.request_path != path:
        problems.append(f"it asks {probe.request_path}, the agent answers drains on {path}")
    if (probe.interval, probe.threshold) != (configured_interval, configured_threshold):
        problems.append(f"drain.probe_interval_seconds/probe_threshold say {configured_interval:g} s x "
                        f"{configured_threshold}")
    if problems:
        return Verdict(Status.WARN, f"{said}; " + "; ".join(problems),
                       f"set requestPath {path} on the probe and drain.probe_interval_seconds: {probe.interval:g}, "
                       f"drain.probe_threshold: {probe.threshold}", details)
    return Verdict(Status.PASS, f"{said}; {wait_name} ({probe_wait:g} s) covers it", details=details)


def repairs_verdict(*, enabled: bool, grace_period: str | None, repair_action: str | None,
                    health_source: str | None, drain_probe_source: bool,
                    longest_drain: float = LONGEST_DRAIN_SECONDS, unserved: str | None = None) -> Verdict:
    """Automatic instance repairs against the longest possible drain. A drain can last until NotBefore
    (``longest_drain``: 15 min for a Freeze or a Reboot whose early approval a peer blocks); when the
    repairs' health source is the drain probe (``drain_probe_source``: the scale set's health probe, or the
    Application Health extension, on the agent's probe port), a drained VM looks unhealthy all that time,
    and a grace period shorter than that lets the scale set repair (replace, by default) a VM in the
    middle of planned maintenance: FAIL. ``health_source`` describes the source (None: none found).
    ``unserved``: the Application Health extension asks one of the agent's own ports for a path the agent
    does not answer as health (say why): it reads 404, the VM is Unhealthy for ever, and repairs replace it
    once the grace runs out, maintenance or not: FAIL with repairs on, WARN without."""
    grace = iso_duration_seconds(grace_period) if grace_period is not None else 600.0
    details = {"enabled": enabled, "grace_period": grace_period, "grace_seconds": grace,
               "repair_action": repair_action, "health_source": health_source,
               "drain_probe_source": drain_probe_source, "longest_drain": longest_drain, "unserved": unserved}
    if unserved is not None:
        fix = f"point the extension's requestPath at the agent's application health endpoint ({unserved})"
        if not enabled:
            return Verdict(Status.WARN, f"{health_source} is not a health endpoint of the agent: every VM reads "
                           "Unhealthy (automatic repairs are off)", fix, details)
        return Verdict(Status.FAIL, f"automatic repairs read {health_source}, which is not a health endpoint of "
                       f"the agent: every VM reads Unhealthy and is {(repair_action or 'Replace').lower()}d once the "
                       "grace period runs out", fix, details)
    if not enabled:
        return Verdict(Status.PASS, "automatic repairs are off: a drained VM is never repaired", details=details)
    action = (repair_action or "Replace").lower()
    if grace is None:
        return Verdict(Status.WARN, f"automatic repairs are on with a grace period ARM wrote as {grace_period!r}, "
                       "which cannot be read", "check automaticRepairsPolicy.gracePeriod (ISO 8601, PT10M to PT90M)",
                       details)
    need = max(longest_drain, 600.0)
    fix_grace = f"PT{math.ceil(need / 60) + 5:d}M"
    if health_source is None:
        return Verdict(Status.WARN, f"automatic repairs are on (grace {_minutes(grace)}, {action}) but no health "
                       "source was found (no networkProfile.healthProbe, no Application Health extension)",
                       "give the scale set a health source that a drain does not fail (the Application Health "
                       "extension on an endpoint that stays healthy while drained), or turn automatic repairs off",
                       details)
    if not drain_probe_source:
        return Verdict(Status.PASS, f"automatic repairs are on (grace {_minutes(grace)}, {action}), with health from "
                       f"{health_source}, not from the drain probe: a drain does not make the VM unhealthy",
                       details=details)
    said = (f"automatic repairs read {health_source}, which is the drain probe, with a grace period of "
            f"{_minutes(grace)}")
    if grace < need:
        return Verdict(Status.FAIL, f"{said}: a drain can last until NotBefore ({_minutes(need)} for a Freeze or a "
                       f"Reboot), so a drained VM can be {action}d in the middle of planned maintenance",
                       f"raise automaticRepairsPolicy.gracePeriod to {fix_grace} (az vmss update --set "
                       f"automaticRepairsPolicy.gracePeriod={fix_grace}), or take the repairs' health source off "
                       "the drain probe", details)
    return Verdict(Status.PASS, f"{said}, longer than the longest drain ({_minutes(need)}): a drained VM is not "
                   "repaired during maintenance", details=details)


def terminate_verdict(*, enabled: bool | None, not_before_timeout: str | None, drain_wait: float,
                      lapse: float, os_image: str | None = None) -> Verdict:
    """Scale-set terminate notifications (``scheduledEventsProfile.terminateNotificationProfile``). Off
    (the default): a scale-in or a delete terminates the VM without a Terminate event, so nothing drains
    it: WARN. On: ``notBeforeTimeout`` (5 to 15 minutes; 5 when not given) is the Terminate's notice; it
    must exceed the drain wait (FAIL otherwise) and, to approve early after a lost agent, the session's
    lapse plus the drain wait (WARN otherwise). ``os_image``: the OS-image notification profile, reported."""
    notice = iso_duration_seconds(not_before_timeout) if not_before_timeout is not None else 300.0
    details = {"enabled": bool(enabled), "not_before_timeout": not_before_timeout, "notice_seconds": notice,
               "drain_wait": drain_wait, "lapse": lapse, "os_image_notification": os_image}
    image = f"; OS image notifications {os_image}" if os_image else ""
    if not enabled:
        return Verdict(Status.WARN, "terminate notifications are off: a scale-in or delete terminates this VM "
                       f"without a Terminate event, so it is not drained first{image}",
                       "enable them: az vmss update --enable-terminate-notification true "
                       "--terminate-notification-time 10 (minutes; terminateNotificationProfile)",
                       details)
    if notice is None:
        return Verdict(Status.WARN, f"terminate notifications are on with a notBeforeTimeout ARM wrote as "
                       f"{not_before_timeout!r}, which cannot be read{image}",
                       "check terminateNotificationProfile.notBeforeTimeout (ISO 8601, PT5M to PT15M)", details)
    said = f"terminate notifications are on, {_minutes(notice)} of notice"
    if notice <= drain_wait:
        return Verdict(Status.FAIL, f"{said}, not more than the Terminate drain wait ({drain_wait:g} s): the VM is "
                       f"terminated before it counts as drained{image}",
                       "raise notBeforeTimeout (az vmss update --terminate-notification-time 10) or lower "
                       "drain.wait_seconds_by_type.Terminate", details)
    if notice <= lapse + drain_wait:
        return Verdict(Status.WARN, f"{said}: after a lost agent ({lapse:g} s for its session to lapse) plus the "
                       f"drain wait ({drain_wait:g} s) a Terminate starts at NotBefore unapproved{image}",
                       "raise notBeforeTimeout (az vmss update --terminate-notification-time 10)", details)
    return Verdict(Status.PASS, f"{said}, beyond the drain wait ({drain_wait:g} s) even after a lost agent{image}",
                   details=details)


def auto_approve_verdict(*, reboot: bool | None, redeploy: bool | None, resource: str) -> Verdict:
    """``scheduledEventsPolicy``: ``userInitiatedReboot`` / ``userInitiatedRedeploy`` with
    ``automaticallyApprove`` true make Azure approve those events itself: the Scheduled phase never
    appears, so nothing drains before a user-initiated reboot or redeploy (WARN)."""
    details = {"user_initiated_reboot": reboot, "user_initiated_redeploy": redeploy, "resource": resource}
    auto = [name for name, on in (("reboot", reboot), ("redeploy", redeploy)) if on]
    if not auto:
        return Verdict(Status.PASS, f"{resource}: user-initiated reboots and redeploys wait for approval (no "
                       "automaticallyApprove)", details=details)
    listed = " and ".join(f"user-initiated {name}s" for name in auto)
    settings = " and ".join(f"scheduledEventsPolicy.userInitiated{name.capitalize()}.automaticallyApprove=false"
                            for name in auto)
    return Verdict(Status.WARN, f"{resource}: {listed} are approved automatically: their events never appear as "
                   "Scheduled, so no drain happens before them",
                   f"set {settings} (az vmss update / az vm update --set ...), or drain by hand before such a restart",
                   details)


def spot_verdict(*, priority: str | None, resource: str) -> Verdict:
    """Spot (or the older Low) priority: evictions come as a Preempt with 30 s of notice, which an early
    approval cannot usefully shorten: WARN."""
    details = {"priority": priority, "resource": resource}
    if (priority or "Regular").lower() not in ("spot", "low"):
        return Verdict(Status.PASS, f"{resource}: {priority or 'Regular'} priority: no eviction", details=details)
    return Verdict(Status.WARN, f"{resource}: {priority} priority: an eviction comes as a Preempt with 30 s of "
                   "notice, too short to drain and approve early usefully",
                   "use Regular priority for VMs that must drain before maintenance, or accept evictions with "
                   "drain.wait_seconds_by_type.Preempt (5 s)", details)
