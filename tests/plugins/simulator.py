"""IMDS simulator fixtures.

``imds_sim`` is a factory: ``sim = imds_sim(vms=("vm0", "vm1"), approval_delay=0.5)`` starts
``python -m azuresim`` as a subprocess on free loopback ports, waits for its ready file and
returns a ``RunningSimulator`` (``control``, ``urls``, ``pid``, ``url(vm)``, ``stderr()``). Each call
starts a separate simulator. For the common case the factory also acts as a default simulator:
``imds_sim.control``, ``imds_sim.urls`` and ``imds_sim.pid`` start one with vm0, vm1, vm2 on first use.
At teardown every simulator is sent SIGTERM (by its own PID, nothing else) and must exit with 0.

``imds_sim_inprocess`` is the same factory without a subprocess: the server runs on threads of the
test process, ``group`` gives direct access to the ``SimulatedGroup``, ``clock`` may be injected and
``group_options`` passes further ``SimulatedGroup`` arguments (a fake ``signal_sender``, for example).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from azuresim import SimControl, SimulatedGroup, SimulatorServer, VmInfo
from azuresim.clock import Clock

__all__ = ["ARM_POOL", "RunningSimulator", "SimulatorFactory", "two_vms_with_arm"]

_REPO_ROOT = Path(__file__).resolve().parents[2]
_START_TIMEOUT = 15.0
_STOP_TIMEOUT = 10.0


@dataclass
class RunningSimulator:
    """A started simulator. ``pid`` is None (and ``group`` set) for the in-process variant."""

    control: SimControl
    urls: dict[str, str]
    pid: int | None
    group: SimulatedGroup | None = None
    arm_url: str | None = None  # the simulated ARM's base URL, when started with --arm
    stderr_path: Path | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _server: SimulatorServer | None = field(default=None, repr=False)

    @property
    def control_url(self) -> str:
        return self.control.url

    def url(
        self, vm: str, path: str = "/metadata/scheduledevents", api_version: str | None = "2020-07-01"
    ) -> str:
        """Full URL of ``path`` on ``vm``'s IMDS port (with ``?api-version=`` unless None)."""
        query = f"?api-version={api_version}" if api_version else ""
        return f"{self.urls[vm]}{path}{query}"

    def stderr(self) -> str:
        """What the subprocess wrote to stderr so far ("" in process)."""
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> int | None:
        """Stop this simulator (SIGTERM to its PID) and return its exit status (None in process)."""
        self.control.close()
        if self._server is not None:
            self._server.stop()
            return None
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise AssertionError(
                    f"simulator pid {process.pid} ignored SIGTERM for {_STOP_TIMEOUT:g} s; killed.\n"
                    + self.stderr()
                ) from None
        return process.returncode


class SimulatorFactory:
    """Starts simulators for one test and stops them all at teardown. See the module docstring."""

    def __init__(self, tmp_path: Path, *, in_process: bool = False) -> None:
        self._tmp_path = tmp_path
        self._in_process = in_process
        self._started: list[RunningSimulator] = []
        self._default: RunningSimulator | None = None

    def __call__(
        self,
        vms: Sequence[str] = ("vm0", "vm1", "vm2"),
        *,
        approval_delay: float | None = None,
        started_for: float | None = None,
        rate_limit: int | None = None,
        unknown_approval_status: int | None = None,
        scale_set: str | None = None,
        time_scale: float | None = None,
        extra_args: Sequence[str] = (),
        clock: Clock | None = None,
        group_options: Mapping[str, Any] | None = None,
    ) -> RunningSimulator:
        """Start a simulator for ``vms``; options as the CLI flags of the same names.

        ``extra_args`` (subprocess only) are further CLI flags; ``clock`` (in process only) replaces
        ``time.time`` in the simulated group and ``group_options`` (in process only) are further
        ``SimulatedGroup`` arguments (``signal_sender``, ``first_call_delay``, ...).
        """
        if self._in_process:
            if extra_args:
                raise ValueError("extra_args only apply to the subprocess simulator")
            options = dict(group_options or {})
            if time_scale is not None:
                options["time_scale"] = time_scale
            sim = self._start_in_process(
                vms, approval_delay, started_for, rate_limit, unknown_approval_status, scale_set, clock, options
            )
        else:
            if clock is not None or group_options:
                raise ValueError("clock and group_options only apply to the in-process simulator")
            args = ["--vms", ",".join(vms)]
            for flag, value in (
                ("--approval-delay", approval_delay),
                ("--started-for", started_for),
                ("--rate-limit", rate_limit),
                ("--unknown-approval-status", unknown_approval_status),
                ("--scale-set", scale_set),
                ("--time-scale", time_scale),
            ):
                if value is not None:
                    args += [flag, str(value)]
            sim = self._start_subprocess([*args, *extra_args])
        self._started.append(sim)
        return sim

    # The factory doubles as a default simulator (vm0, vm1, vm2), started on first use.
    @property
    def default(self) -> RunningSimulator:
        if self._default is None:
            self._default = self()
        return self._default

    @property
    def control(self) -> SimControl:
        return self.default.control

    @property
    def urls(self) -> dict[str, str]:
        return self.default.urls

    @property
    def pid(self) -> int | None:
        return self.default.pid

    def stop_all(self) -> None:
        problems = []
        while self._started:
            sim = self._started.pop()
            status = sim.stop()
            if sim.pid is not None and status != 0:
                problems.append(f"simulator pid {sim.pid} exited with {status}:\n{sim.stderr()}")
        if problems:
            raise AssertionError("\n".join(problems))

    def _start_subprocess(self, args: list[str]) -> RunningSimulator:
        workdir = self._tmp_path / f"imds-sim-{len(self._started)}"
        workdir.mkdir(parents=True, exist_ok=True)
        ready_file = workdir / "ready.json"
        stderr_path = workdir / "stderr.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
        command = [
            sys.executable,
            "-m",
            "azuresim",
            "--base-port",
            "0",
            "--control",
            "127.0.0.1:0",
            "--ready-file",
            str(ready_file),
            "--log-level",
            "DEBUG",
            *args,
        ]
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env
            )

        def failure(reason: str) -> AssertionError:
            return AssertionError(f"simulator {reason}:\n{stderr_path.read_text(errors='replace')}")

        deadline = time.monotonic() + _START_TIMEOUT
        while not ready_file.exists():
            if process.poll() is not None:
                raise failure(f"exited with {process.returncode} before it was ready")
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise failure(f"not ready within {_START_TIMEOUT:g} s; killed")
            time.sleep(0.02)
        ready: dict[str, Any] = json.loads(ready_file.read_text())
        return RunningSimulator(
            control=SimControl(ready["control"]),
            urls=dict(ready["vms"]),
            pid=process.pid,
            arm_url=ready.get("arm"),
            stderr_path=stderr_path,
            _process=process,
        )

    def _start_in_process(
        self,
        vms: Sequence[str],
        approval_delay: float | None,
        started_for: float | None,
        rate_limit: int | None,
        unknown_approval_status: int | None,
        scale_set: str | None,
        clock: Clock | None,
        options: dict[str, Any],
    ) -> RunningSimulator:
        # Same placement as the CLI: fault domain i % 2, update domain i % 5.
        infos = [
            VmInfo(name, scale_set_name=scale_set or "", fault_domain=i % 2, update_domain=i % 5)
            for i, name in enumerate(vms)
        ]
        group = SimulatedGroup(
            infos,
            clock=clock,
            approval_delay=approval_delay or 0.0,
            started_for=5.0 if started_for is None else started_for,
            unknown_approval_status=unknown_approval_status or 200,
            **options,
        )
        server = SimulatorServer(
            group,
            {vm: ("127.0.0.1", 0) for vm in vms},
            ("127.0.0.1", 0),
            rate_limit=5 if rate_limit is None else rate_limit,
        )
        server.start()
        return RunningSimulator(
            control=SimControl(server.control_url),
            urls=server.urls,
            pid=None,
            group=group,
            _server=server,
        )


@pytest.fixture
def imds_sim(tmp_path: Path) -> Iterator[SimulatorFactory]:
    """Factory of simulator subprocesses; also a lazily started default simulator (vm0-vm2)."""
    factory = SimulatorFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def imds_sim_inprocess(tmp_path: Path) -> Iterator[SimulatorFactory]:
    """Like ``imds_sim`` but on threads of the test process; ``RunningSimulator.group`` is set."""
    factory = SimulatorFactory(tmp_path, in_process=True)
    try:
        yield factory
    finally:
        factory.stop_all()


#: The backend address pool ``two_vms_with_arm`` serves.
ARM_POOL = ("/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg-app/providers/"
            "Microsoft.Network/loadBalancers/lb-app/backendAddressPools/pool-web")


def two_vms_with_arm(imds_sim: SimulatorFactory, async_seconds: float) -> RunningSimulator:
    """A simulator process of vm0 and vm1 serving ARM (operations of ``async_seconds``, ``Retry-After: 0``)
    with one pool, ``ARM_POOL``, holding both VMs' addresses."""
    sim = imds_sim(("vm0", "vm1"), extra_args=["--arm", "127.0.0.1:0", "--arm-async-seconds", f"{async_seconds:g}",
                                               "--arm-retry-after", "0"])
    assert sim.arm_url
    sim.control.add_pool(ARM_POOL, [{"name": "vm0", "ip_address": "10.0.0.4"},
                                    {"name": "vm1", "ip_address": "10.0.0.5"}])
    return sim
