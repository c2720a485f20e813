"""The one exception tree of the project.

Every error the agent can meet at run time belongs to one of four families, and each family has one
safe reaction that the agent loop applies:

* ``ConfigError``: refuse to start, naming the field.
* ``ImdsError``: no fresh document this cycle; keep the last known drain state, approve nothing.
* ``StoreError``: the cluster view is unknown this cycle; keep drained, approve nothing.
* ``ActionError``: a drain or recover action failed; no acknowledgement (drain) or retry (recover).
"""

from __future__ import annotations

__all__ = [
    "ActionError",
    "ConfigError",
    "CoordinatorError",
    "DuplicateMember",
    "ImdsBadRequest",
    "ImdsError",
    "ImdsFenced",
    "ImdsUnavailable",
    "InvalidName",
    "LayoutMismatch",
    "MalformedDocument",
    "StoreError",
    "StoreUnavailable",
    "StoreUnknownOutcome",
]


class CoordinatorError(Exception):
    """Base of every error raised on purpose by this package."""


class ConfigError(CoordinatorError):
    """The configuration is invalid; the message names the offending field."""


class InvalidName(CoordinatorError, ValueError):
    """A VM name or event id is unsafe to use in a ZooKeeper path or a log line."""


class ImdsError(CoordinatorError):
    """Base of errors talking to the Instance Metadata Service."""


class ImdsUnavailable(ImdsError):
    """Transient: timeout, connection error, 410, 429 or 5xx, after the client's own retries."""

    def __init__(self, message: str, *, outcome: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class ImdsBadRequest(ImdsError):
    """IMDS answered 400 (or another 4xx): our request is wrong. A bug, never retried in a hot loop."""

    def __init__(self, message: str, *, status: int, body: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class ImdsFenced(ImdsError):
    """An approval was not sent (or not sent again): its fence closed. The agent's last check of its
    ZooKeeper session is too old, or the session is not CONNECTED, so the session may have lapsed."""


class MalformedDocument(ImdsError):
    """IMDS answered 200 with a body that is not a valid Scheduled Events document."""

    def __init__(self, message: str, *, content: str) -> None:
        super().__init__(message)
        self.content = content


class StoreError(CoordinatorError):
    """Base of coordination-store errors."""


class StoreUnavailable(StoreError):
    """A read failed or timed out: the cluster view is unknown."""


class LayoutMismatch(StoreUnavailable):
    """The group's ``/layout`` names another layout version than the one this agent reads: its view is
    unknown to this agent, which keeps drained what it drained and approves nothing."""


class StoreUnknownOutcome(StoreError):
    """A write failed or timed out: it may or may not have been applied. Treat as not done."""


class DuplicateMember(StoreError):
    """Another live agent holds this VM's member node and nothing proves it is this VM's previous agent
    process: two agents run with one VM name. The node is left to it; this agent is not a member (it
    neither leads nor approves) until that node is gone. The message says so in one line."""

    def __init__(self, vm: str, session: int, host: str | None, pid: int | None, since: str) -> None:
        super().__init__(
            f"another agent runs as {vm} (member node held by session 0x{session:x} from host {host or '?'} "
            f"pid {pid if pid is not None else '?'} since {since}): this agent stays out of rotation until it "
            "is gone; check vm_name in the configuration"
        )
        self.vm = vm
        self.session = session
        self.host = host
        self.pid = pid
        self.since = since

    def again(self) -> DuplicateMember:
        """The same refusal, as a new exception to raise (one raised again and again would keep growing
        its traceback)."""
        return DuplicateMember(self.vm, self.session, self.host, self.pid, self.since)


class ActionError(CoordinatorError):
    """A drain or recover action failed or timed out.

    ``outside_vm``: the failure lies outside this VM, in a remote service the action depends on (Azure
    Resource Manager for the ``azure-lb`` action): repairing, restarting or reimaging the VM would not fix
    it. The application health signal (``coordinator.apphealth``) never reports a recovery failing for
    such a reason as Unhealthy. False here; a subclass for such failures sets it True."""

    outside_vm: bool = False
