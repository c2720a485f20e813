"""The Windows service with a fake pywin32: stop and start paths, failures reported to the framework, and
``coordinator service ...`` (refused off Windows; the service manager calls on a patched platform).
tests/integration/test_platform_layer.py stops a real agent through the same service class."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from coordinator import winservice
from coordinator.cli import main
from coordinator.errors import ConfigError
from coordinator.runtime import Stopper
from coordinator.winservice import (
    CLASS_STRING,
    SERVICE_NAME,
    ServiceBody,
    ServiceFailed,
    Win32,
    command,
    service_class,
)

STOP_PENDING, STOPPED, RUNNING, AUTO_START = 3, 1, 4, 2


class FakeFramework:
    """pywin32's ServiceFramework as far as the service uses it: it records the statuses reported."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.statuses: list[tuple[int, dict[str, int]]] = []

    def ReportServiceStatus(self, status: int, **kwargs: int) -> None:
        self.statuses.append((status, kwargs))


class PywinError(Exception):
    def __init__(self, winerror: int, strerror: str = "refused") -> None:
        super().__init__(winerror, "Call", strerror)
        self.winerror, self.strerror = winerror, strerror


class FakeUtil:
    ServiceFramework = FakeFramework

    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail or {}
        self.options: dict[str, str] = {}

    def _call(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if name in self.fail:
            raise PywinError(self.fail[name])

    def InstallService(self, *args: Any, **kwargs: Any) -> None:
        self._call("InstallService", *args, **kwargs)

    def ChangeServiceConfig(self, *args: Any, **kwargs: Any) -> None:
        self._call("ChangeServiceConfig", *args, **kwargs)

    def SetServiceCustomOption(self, name: str, option: str, value: str) -> None:
        self._call("SetServiceCustomOption", name, option, value)
        self.options[option] = value

    def GetServiceCustomOption(self, name: str, option: str, default: Any = None) -> Any:
        return self.options.get(option, default)

    def RemoveService(self, name: str) -> None:
        self._call("RemoveService", name)

    def StartService(self, name: str) -> None:
        self._call("StartService", name)

    def StopService(self, name: str) -> None:
        self._call("StopService", name)

    def WaitForServiceStatus(self, name: str, status: int, seconds: float) -> None:
        self._call("WaitForServiceStatus", name, status, seconds)


class EventLog:
    def __init__(self) -> None:
        self.info: list[str] = []
        self.errors: list[str] = []

    def LogInfoMsg(self, text: str) -> None:
        self.info.append(text)

    def LogErrorMsg(self, text: str) -> None:
        self.errors.append(text)


def fake_win32(util: FakeUtil | None = None) -> Win32:
    return Win32(
        win32serviceutil=util or FakeUtil(),
        win32service=SimpleNamespace(SERVICE_STOP_PENDING=STOP_PENDING, SERVICE_STOPPED=STOPPED,
                                     SERVICE_RUNNING=RUNNING, SERVICE_AUTO_START=AUTO_START),
        servicemanager=EventLog(),
        pywintypes=SimpleNamespace(error=PywinError),
    )


class Agent:
    """Stands in for ``run_agent``: runs until its stopper is told to stop, then returns ``code``."""

    def __init__(self, code: int = 0, *, obey: bool = True) -> None:
        self.code, self.obey = code, obey
        self.started = threading.Event()
        self.release = threading.Event()
        self.settings: Any = None

    def __call__(self, settings: Any, stopper: Stopper) -> int:
        self.settings = settings
        self.started.set()
        (stopper.event if self.obey else self.release).wait(30)
        return self.code


def settings(level: str = "WARNING", fmt: str = "json") -> Any:
    return SimpleNamespace(logging=SimpleNamespace(level=level, format=fmt))


def body(agent: Agent, logged: list[tuple[str, str, Path]], *, stop_timeout: float = 10.0,
         load: Any = None) -> ServiceBody:
    return ServiceBody(
        Path("C:/ProgramData/coordinator/coordinator.yaml"),
        log_file=Path("C:/ProgramData/coordinator/coordinator.log"),
        stop_timeout=stop_timeout,
        load=load or (lambda path: settings()),
        configure_logging=lambda level, fmt, file: logged.append((level, fmt, file)),
        runner=agent,
    )


def start(service: Any) -> threading.Thread:
    thread = threading.Thread(target=service.SvcDoRun, daemon=True)
    thread.start()
    return thread


def test_svcstop_sets_the_stop_event_and_the_agent_returns() -> None:
    agent, logged, exits = Agent(), [], []
    win32 = fake_win32()
    service = service_class(win32, body=lambda: body(agent, logged), exit_process=exits.append)(["coordinator"])
    thread = start(service)
    assert agent.started.wait(5)
    assert logged == [("WARNING", "json", Path("C:/ProgramData/coordinator/coordinator.log"))]

    service.SvcStop()

    thread.join(5)
    assert not thread.is_alive()
    assert service.body.stopper.event.is_set()
    # STOP_PENDING with a wait hint covering the bounded wait; SERVICE_STOPPED is the framework's, after
    # SvcDoRun returns (nothing else reported here).
    assert service.statuses == [(STOP_PENDING, {"waitHint": 15000})]
    assert exits == []
    assert win32.servicemanager.info[-1] == "coordinator: stopped"


def test_shutdown_stops_the_same_way() -> None:
    cls = service_class(fake_win32(), body=lambda: body(Agent(), []))
    assert cls.SvcShutdown is cls.SvcStop
    assert cls._svc_name_ == SERVICE_NAME
    assert f"{cls.__module__}.{cls.__qualname__}" == CLASS_STRING


def test_an_agent_that_does_not_stop_in_time_ends_the_process_as_stopped_with_an_error() -> None:
    agent, exits = Agent(obey=False), []
    win32 = fake_win32()
    service = service_class(win32, body=lambda: body(agent, [], stop_timeout=0.05),
                            exit_process=exits.append)(["coordinator"])
    thread = start(service)
    assert agent.started.wait(5)
    service.SvcStop()
    assert exits == [1]
    assert service.statuses[-1] == (STOPPED, {"win32ExitCode": 1066, "svcExitCode": 1})
    assert "did not stop in time" in win32.servicemanager.errors[0]
    agent.release.set()
    thread.join(5)


def test_a_failing_agent_makes_svcdorun_raise_so_recovery_restarts_it() -> None:
    agent = Agent(code=2, obey=False)
    agent.release.set()
    win32 = fake_win32()
    service = service_class(win32, body=lambda: body(agent, []))(["coordinator"])
    with pytest.raises(ServiceFailed, match="the agent exited with status 2"):
        service.SvcDoRun()
    assert "the agent exited with status 2; see" in win32.servicemanager.errors[0]


def test_a_bad_configuration_is_logged_to_the_file_and_fails_the_service() -> None:
    def load(path: Path) -> Any:
        raise ConfigError(f"{path}: invalid configuration:\n  cluster: Field required")

    logged: list[tuple[str, str, Path]] = []
    agent = Agent()
    service_body = body(agent, logged, load=load)
    assert service_body.run() == 2
    assert not agent.started.is_set()
    assert logged == [("INFO", "text", Path("C:/ProgramData/coordinator/coordinator.log"))]
    assert service_body.failure is not None and "cluster: Field required" in service_body.failure
    assert service_body.done.is_set()


def test_the_service_reads_the_configuration_stored_at_install() -> None:
    util = FakeUtil()
    util.options["config"] = r"E:\conf\agent.yaml"
    service = service_class(fake_win32(util))(["coordinator"])
    assert str(service.body.config) == r"E:\conf\agent.yaml"
    assert service.body.stop_timeout == winservice.STOP_TIMEOUT


def test_the_module_imports_off_windows_but_has_no_service_class_there() -> None:
    with pytest.raises(ImportError):
        winservice.CoordinatorService  # noqa: B018 (the attribute access is the test)


# -- coordinator service ... -----------------------------------------------------------------------------


def test_the_service_command_refuses_off_windows(capsys: pytest.CaptureFixture[str]) -> None:
    for action in ("install", "remove", "start", "stop"):
        assert main(["service", action]) == 2
        err = capsys.readouterr().err
        assert "Windows services exist only on Windows" in err and "systemd" in err


def args(action: str, config: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(action=action, config=Path(config) if config else None, wait=30.0)


def test_install_registers_an_automatic_service_and_its_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    util = FakeUtil()
    assert command(args("install"), system="win32", win32=fake_win32(util)) == 0
    name, positional, kwargs = util.calls[0]
    assert (name, positional) == ("InstallService", (CLASS_STRING, SERVICE_NAME, winservice.DISPLAY_NAME))
    assert kwargs["startType"] == AUTO_START
    assert util.calls[1][:2] == ("SetServiceCustomOption", (SERVICE_NAME, "config", util.options["config"]))
    assert util.options["config"].endswith("coordinator.yaml")
    assert "installed (automatic start" in capsys.readouterr().out


def test_install_again_updates_the_service_in_place() -> None:
    util = FakeUtil(fail={"InstallService": winservice.ERROR_SERVICE_EXISTS})
    assert command(args("install", "E:/conf/agent.yaml"), system="win32", win32=fake_win32(util)) == 0
    assert [c[0] for c in util.calls] == ["InstallService", "ChangeServiceConfig", "SetServiceCustomOption"]
    assert util.options["config"] == str(Path("E:/conf/agent.yaml"))


def test_remove_start_and_stop_are_idempotent() -> None:
    util = FakeUtil(fail={"RemoveService": winservice.ERROR_SERVICE_DOES_NOT_EXIST,
                          "StartService": winservice.ERROR_SERVICE_ALREADY_RUNNING,
                          "StopService": winservice.ERROR_SERVICE_NOT_ACTIVE})
    win32 = fake_win32(util)
    assert [command(args(a), system="win32", win32=win32) for a in ("remove", "start", "stop")] == [0, 0, 0]
    waits = [c[1] for c in util.calls if c[0] == "WaitForServiceStatus"]
    assert waits == [(SERVICE_NAME, RUNNING, 30.0), (SERVICE_NAME, STOPPED, 30.0)]


def test_a_refusal_of_the_service_manager_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    util = FakeUtil(fail={"InstallService": 5})  # ERROR_ACCESS_DENIED: not an elevated prompt
    assert command(args("install"), system="win32", win32=fake_win32(util)) == 1
    assert "coordinator: service install: refused" in capsys.readouterr().err
