"""The simulator is a package of its own: the agent's command line runs it when it is installed, and says
what to install when it is not; its own command takes the same options."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The agent's command line as it runs where the simulator's package is not installed.
WITHOUT_SIMULATOR = "import sys; sys.modules['azuresim'] = None; from coordinator.cli import main; main(sys.argv[1:])"


@pytest.mark.parametrize("argv", [["imds-sim", "--vms", "vm0"], ["imds-sim", "--help"], ["demo", "--help"]])
def test_without_the_simulator_the_commands_that_run_it_say_what_to_install(argv: list[str]) -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_SIMULATOR, *argv], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert f"coordinator {argv[0]}: error:" in result.stderr
    assert "pip install ./sim" in result.stderr and "Traceback" not in result.stderr


def test_the_agent_runs_without_the_simulator() -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_SIMULATOR, "check-config", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_simulators_own_command_and_the_agents_take_the_same_options() -> None:
    own = subprocess.run([sys.executable, "-m", "azuresim", "--help"], capture_output=True, text=True, timeout=60)
    agent = subprocess.run([sys.executable, "-m", "coordinator", "imds-sim", "--help"], capture_output=True,
                           text=True, timeout=60)
    assert own.returncode == agent.returncode == 0
    assert own.stdout.startswith("usage: python -m azuresim")

    def options(text: str) -> set[str]:
        return {word.rstrip(",") for word in text.split() if word.startswith("--")}

    assert options(own.stdout) == options(agent.stdout) and "--lb-haproxy" in options(own.stdout)
