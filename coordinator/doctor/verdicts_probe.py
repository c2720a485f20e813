"""The verdicts of this VM's probe as its peers reach it, and of the group's members (their versions, their
advertised probes, whether those answer from this VM). Pure functions, no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from coordinator.doctor.outcome import Status, Verdict

__all__ = ["ProbeAnswer", "is_loopback", "members_verdict", "probe_verdict"]


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
    *, url: str | None, is_member: bool, peer_urls: Sequence[str], answer: ProbeAnswer | None,
    configured_url: str | None = None,
) -> Verdict:
    """This VM's probe as its peers would reach it: ``url`` is what its member node advertises (or, when
    its agent has not joined, what it would advertise), ``peer_urls`` what the other members advertise,
    ``answer`` what a GET of ``url`` from this VM got. ``configured_url`` is what the configuration given
    to doctor would advertise: a running agent that advertises another port or path runs with another
    configuration (or was not restarted after a change), so every check judged against this file's probe
    (the load balancer's, the repairs') judges the wrong one: WARN at least, said beside the rest."""
    verdict = _probe_alone(url=url, is_member=is_member, peer_urls=peer_urls, answer=answer)
    differs = _differences(url, configured_url) if is_member and url is not None and configured_url else []
    if not differs:
        return verdict
    said = (f"the running agent advertises {url}, but this configuration's probe is {configured_url} "
            f"({' and '.join(differs)} differ): the agent runs with another configuration, or was not restarted "
            "after it changed")
    fix = ("run coordinator doctor with the running agent's configuration file, or restart the agent with this one "
           "(and point the load balancer's probe at the port it serves)")
    status = Status.FAIL if verdict.status is Status.FAIL else Status.WARN
    return Verdict(status, f"{verdict.summary}; {said}", fix + (f"; {verdict.fix}" if verdict.fix else ""),
                   {**verdict.details, "configured_url": configured_url})


def _differences(advertised: str, configured: str) -> list[str]:
    """What differs between two probe URLs that a configuration decides: the port and the path. The
    host is left out: without probe.advertise, it is the address the agent found toward ZooKeeper."""
    a, c = urlsplit(advertised), urlsplit(configured)
    found = []
    try:
        if a.port != c.port:
            found.append(f"port {a.port} against {c.port}")
    except ValueError:
        found.append("port")
    if a.path != c.path:
        found.append(f"path {a.path} against {c.path}")
    return found


def _probe_alone(
    *, url: str | None, is_member: bool, peer_urls: Sequence[str], answer: ProbeAnswer | None
) -> Verdict:
    """``probe_verdict`` without the comparison with the configuration."""
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
    unattended: Mapping[str, Sequence[str]] | None = None,
    registered: Collection[str] = (),
) -> Verdict:
    """The group's live members (vm -> member info), the agent version each runs against ``version`` (this
    installation's), whether each advertises a probe, and whether the peers' probes answer from this VM
    (``answers``: vm -> what a GET of its advertised probe got). ``unattended``: each VM that an open event
    record names and that runs no agent -> those events (``registered``: the VMs the group has seen)."""
    unattended = {vm: list(ids) for vm, ids in sorted((unattended or {}).items()) if vm not in members}
    details: dict[str, Any] = {
        "members": {vm: {"version": info.get("version"), "probe": info.get("probe"),
                         "probe_answer": (answers[vm].status if vm in answers and answers[vm].error is None
                                          else (answers[vm].error if vm in answers else None))}
                    for vm, info in sorted(members.items())},
        "named_without_agent": unattended,
    }
    if not members:
        return Verdict(Status.WARN, "no live member in the group", "start the agents, then run coordinator doctor "
                       "again", details)
    problems: list[str] = []
    if unattended:
        problems.append("named by an open event but running no agent: " + ", ".join(
            f"{vm} ({', '.join(ids)}{'' if vm in registered else '; never seen in this group'})"
            for vm, ids in unattended.items()))
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
        if unattended:
            fixes.append(f"start the agent on {', '.join(unattended)} (until then nothing drains it and those events "
                         "are not approved early: they start at NotBefore)")
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
