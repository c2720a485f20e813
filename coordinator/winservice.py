"""The agent as a Windows service (pywin32), and ``coordinator service install|remove|start|stop``.

The service runs what ``coordinator run --config FILE`` runs, in the service process: the configuration
is ``%ProgramData%\\coordinator\\coordinator.yaml`` unless ``service install --config`` stored another
path in the service's registry parameters, and the log goes to ``%ProgramData%\\coordinator\\coordinator.log``
(rotated at 10 MiB, five old files kept) in the configured format.

Stopping (SCM stop, or system shutdown): ``SvcStop`` reports STOP_PENDING, asks the agent to stop
(``runtime.Stopper``: the same as SIGTERM on Linux; a drained VM stays drained on disk, as after any
restart) and waits at most ``STOP_TIMEOUT`` seconds for it to return. pywin32's framework then reports
SERVICE_STOPPED when ``SvcDoRun`` returns. If the agent has not returned by then, ``SvcStop`` reports
SERVICE_STOPPED itself, with an error code, and ends the process (as systemd's SIGKILL after
``TimeoutStopSec``; the state file is written before every drain, so this is safe). An agent that
returns a non-zero code (a configuration error, a port already taken) makes ``SvcDoRun`` raise, which
the framework reports as a failure: the service's recovery actions (``sc.exe failure``, with
``failureflag 1``) then restart it.

pywin32 is imported only when needed, and only on Windows: the module imports anywhere, and every
pywin32 call goes through a ``Win32`` bundle that tests replace with fakes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.support.hostos import default_config_file, default_log_file, is_windows

__all__ = [
    "DESCRIPTION",
    "DISPLAY_NAME",
    "SERVICE_NAME",
    "STOP_TIMEOUT",
    "ServiceBody",
    "Win32",
    "command",
    "load_win32",
    "service_class",
]

log = logging.getLogger(__name__)

SERVICE_NAME = "coordinator"
DISPLAY_NAME = "Azure maintenance coordinator"
DESCRIPTION = ("Drains this VM and approves Azure Scheduled Events together with the other VMs of its group, "
               "through ZooKeeper.")
#: Seconds ``SvcStop`` waits for the agent to return before it ends the process.
STOP_TIMEOUT = 20.0
#: The service's registry parameter holding the configuration path (``service install --config``).
CONFIG_OPTION = "config"
#: The Python class pythonservice.exe loads (``InstallService``'s class string).
CLASS_STRING = f"{__name__}.CoordinatorService"

ERROR_SERVICE_EXISTS = 1073
ERROR_SERVICE_DOES_NOT_EXIST = 1060
ERROR_SERVICE_SPECIFIC_ERROR = 1066
ERROR_SERVICE_ALREADY_RUNNING = 1056
ERROR_SERVICE_NOT_ACTIVE = 1062


@dataclass(frozen=True)
class Win32:
    """The pywin32 modules the service uses: ``win32serviceutil`` (its ``ServiceFramework`` is the base
    class), ``win32service`` (constants), ``servicemanager`` (event log) and ``pywintypes`` (``error``)."""

    win32serviceutil: Any
    win32service: Any
    servicemanager: Any
    pywintypes: Any


def load_win32() -> Win32:
    """Import pywin32. Raises ``ImportError`` (off Windows, or pywin32 not installed)."""
    import pywintypes  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import servicemanager  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import win32service  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import win32serviceutil  # type: ignore[import-untyped,import-not-found,unused-ignore]

    return Win32(win32serviceutil, win32service, servicemanager, pywintypes)


def _run_agent(settings: Any, stopper: Any) -> int:
    from coordinator.runtime import run_agent

    return run_agent(settings, stopper=stopper)


def _load_settings(path: Path) -> Any:
    from coordinator.config import load_settings

    return load_settings(path)


def _configure_logging(level: str, fmt: str, file: Path) -> None:
    from coordinator.logsetup import configure_logging

    configure_logging(level, fmt, file=file)


class ServiceBody:
    """What the service does, without pywin32: ``run`` (``SvcDoRun``) loads the configuration, sends the
    log to ``log_file`` and runs the agent until ``stop`` (``SvcStop``) is called; ``stop`` returns
    whether the agent returned within ``stop_timeout`` seconds.

    ``run`` returns the agent's exit code; 2 when the configuration cannot be loaded (logged, and the
    message kept in ``failure``). The collaborators are the real ones by default; tests pass fakes.
    """

    def __init__(
        self,
        config: Path,
        *,
        log_file: Path | None = None,
        stop_timeout: float = STOP_TIMEOUT,
        load: Callable[[Path], Any] = _load_settings,
        configure_logging: Callable[[str, str, Path], None] = _configure_logging,
        runner: Callable[[Any, Any], int] = _run_agent,
    ) -> None:
        from coordinator.runtime import Stopper

        self.config = config
        self.log_file = log_file if log_file is not None else default_log_file()
        self.stop_timeout = stop_timeout
        self.stopper = Stopper()
        self.done = threading.Event()
        self.failure: str | None = None
        self._load = load
        self._configure_logging = configure_logging
        self._runner = runner

    def run(self) -> int:
        from coordinator.errors import ConfigError

        try:
            try:
                settings = self._load(self.config)
            except ConfigError as exc:
                self.failure = str(exc)
                self._configure_logging("INFO", "text", self.log_file)
                log.error("service %s cannot start: %s", SERVICE_NAME, exc)
                return 2
            self._configure_logging(settings.logging.level, settings.logging.format, self.log_file)
            log.info("service %s starting with %s", SERVICE_NAME, self.config)
            code = int(self._runner(settings, self.stopper))
            if code != 0:
                self.failure = f"the agent exited with status {code}"
            return code
        finally:
            self.done.set()

    def stop(self) -> bool:
        self.stopper.stop(f"service {SERVICE_NAME} stop requested")
        return self.done.wait(self.stop_timeout)


class ServiceFailed(RuntimeError):
    """Raised by ``SvcDoRun`` when the agent returned non-zero, so that the framework reports a failure."""


def service_class(
    win32: Win32,
    *,
    body: Callable[[], ServiceBody] | None = None,
    exit_process: Callable[[int], None] = os._exit,
) -> type:
    """The service class, a ``win32serviceutil.ServiceFramework`` of ``win32``. ``body`` makes the
    ``ServiceBody`` (default: the configuration stored at install time, else the default path);
    ``exit_process`` ends the process when the agent does not stop in time."""
    framework: Any = win32.win32serviceutil.ServiceFramework
    ws = win32.win32service

    def default_body() -> ServiceBody:
        stored = win32.win32serviceutil.GetServiceCustomOption(SERVICE_NAME, CONFIG_OPTION, None)
        return ServiceBody(Path(stored) if stored else default_config_file())

    make_body = body if body is not None else default_body

    class CoordinatorService(framework):  # type: ignore[misc]
        _svc_name_ = SERVICE_NAME
        _svc_display_name_ = DISPLAY_NAME
        _svc_description_ = DESCRIPTION

        def __init__(self, args: Any) -> None:
            framework.__init__(self, args)
            self.body = make_body()

        def SvcStop(self) -> None:
            self.ReportServiceStatus(ws.SERVICE_STOP_PENDING, waitHint=int(self.body.stop_timeout * 1000) + 5000)
            if self.body.stop():
                return  # SvcDoRun has returned: the framework reports SERVICE_STOPPED
            log.error("the agent did not stop within %.0f s: ending the service process", self.body.stop_timeout)
            win32.servicemanager.LogErrorMsg(f"{SERVICE_NAME}: the agent did not stop in time; process ended")
            self.ReportServiceStatus(ws.SERVICE_STOPPED, win32ExitCode=ERROR_SERVICE_SPECIFIC_ERROR, svcExitCode=1)
            exit_process(1)

        SvcShutdown = SvcStop  # system shutdown: stop the same way

        def SvcDoRun(self) -> None:
            win32.servicemanager.LogInfoMsg(f"{SERVICE_NAME}: starting ({self.body.config})")
            code = self.body.run()
            if code != 0:
                win32.servicemanager.LogErrorMsg(f"{SERVICE_NAME}: {self.body.failure}; see {self.body.log_file}")
                raise ServiceFailed(self.body.failure or f"exit status {code}")
            win32.servicemanager.LogInfoMsg(f"{SERVICE_NAME}: stopped")

    CoordinatorService.__module__ = __name__
    CoordinatorService.__qualname__ = "CoordinatorService"
    return CoordinatorService


def __getattr__(name: str) -> Any:
    # pythonservice.exe imports CLASS_STRING: the class exists only where pywin32 does, and is made on
    # first use rather than at import.
    if name == "CoordinatorService":
        cls = service_class(load_win32())
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- coordinator service install|remove|start|stop --------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("install", "remove", "start", "stop"))
    parser.add_argument("--config", type=Path, default=None,
                        help="configuration file the service reads (install only; default "
                        r"%%ProgramData%%\coordinator\coordinator.yaml)")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds start and stop wait for the new state")


def command(args: argparse.Namespace, *, system: str | None = None, win32: Win32 | None = None) -> int:
    """``coordinator service ...``: 0 on success, 1 when the service manager refuses, 2 off Windows or
    without pywin32."""
    if not is_windows(system):
        print("coordinator: service: Windows services exist only on Windows; on Linux install the systemd "
              "unit (deploy/systemd/install.sh) and use systemctl", file=sys.stderr)
        return 2
    if win32 is None:
        try:
            win32 = load_win32()
        except ImportError as exc:
            print(f"coordinator: service: pywin32 is missing ({exc}); pip install pywin32", file=sys.stderr)
            return 2
    util, ws = win32.win32serviceutil, win32.win32service
    try:
        if args.action == "install":
            config = args.config if args.config is not None else default_config_file(system)
            options: dict[str, Any] = {"startType": ws.SERVICE_AUTO_START, "description": DESCRIPTION}
            try:
                util.InstallService(CLASS_STRING, SERVICE_NAME, DISPLAY_NAME, **options)
                done = "installed"
            except win32.pywintypes.error as exc:
                if exc.winerror != ERROR_SERVICE_EXISTS:
                    raise
                util.ChangeServiceConfig(CLASS_STRING, SERVICE_NAME, displayName=DISPLAY_NAME, **options)
                done = "updated"
            util.SetServiceCustomOption(SERVICE_NAME, CONFIG_OPTION, str(config))
            print(f"service {SERVICE_NAME} {done} (automatic start, configuration {config})")
        elif args.action == "remove":
            try:
                util.RemoveService(SERVICE_NAME)
            except win32.pywintypes.error as exc:
                if exc.winerror != ERROR_SERVICE_DOES_NOT_EXIST:
                    raise
                print(f"service {SERVICE_NAME} was not installed")
                return 0
            print(f"service {SERVICE_NAME} removed")
        elif args.action == "start":
            try:
                util.StartService(SERVICE_NAME)
            except win32.pywintypes.error as exc:
                if exc.winerror != ERROR_SERVICE_ALREADY_RUNNING:
                    raise
            util.WaitForServiceStatus(SERVICE_NAME, ws.SERVICE_RUNNING, args.wait)
            print(f"service {SERVICE_NAME} running")
        else:
            try:
                util.StopService(SERVICE_NAME)
            except win32.pywintypes.error as exc:
                if exc.winerror != ERROR_SERVICE_NOT_ACTIVE:
                    raise
            util.WaitForServiceStatus(SERVICE_NAME, ws.SERVICE_STOPPED, args.wait)
            print(f"service {SERVICE_NAME} stopped")
    except win32.pywintypes.error as exc:
        print(f"coordinator: service {args.action}: {getattr(exc, 'strerror', exc)}", file=sys.stderr)
        return 1
    return 0
