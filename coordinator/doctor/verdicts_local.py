"""The verdicts of the checks of this machine alone: its configuration, the proxy variables against IMDS,
IMDS's Scheduled Events and this VM's name, and the wall clock against IMDS's ``Date``. Pure functions,
no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from coordinator.doctor.outcome import Status, Verdict

__all__ = [
    "CLOCK_FAIL_SECONDS",
    "CLOCK_WARN_SECONDS",
    "clock_verdict",
    "config_verdict",
    "imds_verdict",
    "proxy_verdict",
]


def config_verdict(problems: Sequence[str], warnings: Sequence[str], advice: Sequence[str] = ()) -> Verdict:
    """What ``coordinator check-config`` would say of this machine (the file itself already loaded):
    ``problems`` and ``warnings`` about the state file (``host_problems``), ``advice`` about the options
    and the environment (``config_warnings``: drain waits, misnamed overrides), each of which says its fix."""
    details = {"problems": list(problems), "warnings": list(warnings), "advice": list(advice)}
    if problems:
        return Verdict(Status.FAIL, "; ".join(problems), "fix state_file or its directory: the agent refuses to "
                       "start", details)
    if warnings or advice:
        fixes = (["check state_file as the user the agent runs as"] if warnings else []) \
            + (["change what each warning names (coordinator check-config lists them)"] if advice else [])
        return Verdict(Status.WARN, "; ".join([*warnings, *advice]), "; ".join(fixes), details)
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


#: What a 429 means and what to do, for the document and for the compute metadata alike: nothing here is
#: misconfigured, the VM's shared budget of IMDS requests was spent when the check asked.
_RATE_LIMITED = ("IMDS answered 429 (too many requests) to every attempt: its 5 requests per second are shared by "
                 "every IMDS user on this VM, the running agent included")
_RATE_LIMITED_FIX = "run coordinator doctor again; if it keeps happening, find what else on this VM polls IMDS"


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
    rate_limited: bool = False,
    compute_rate_limited: bool = False,
) -> Verdict:
    """Scheduled Events read through the agent's IMDS client (``error`` set if it failed), and this VM's
    name as the configuration and IMDS's compute metadata give it. ``rate_limited`` (the document) and
    ``compute_rate_limited`` (the name): IMDS kept answering 429 after the check's retries. That blames
    nothing on this VM's network or configuration, so it is a WARN to run again, not a FAIL advising a
    route, a proxy or vm_name."""
    details: dict[str, Any] = {"url": url, "incarnation": incarnation, "events": events,
                               "seconds": round(seconds, 3), "vm_name": configured_name, "imds_name": imds_name}
    if error is not None and rate_limited:
        return Verdict(Status.WARN, f"Scheduled Events at {url} not read: {_RATE_LIMITED}", _RATE_LIMITED_FIX,
                       {**details, "error": error, "rate_limited": True})
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
    if compute_error is not None and configured_name is None and compute_rate_limited:
        return Verdict(Status.WARN, f"{found}, but this VM's name was not read: {_RATE_LIMITED}", _RATE_LIMITED_FIX,
                       {**details, "compute_error": compute_error, "rate_limited": True})
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
