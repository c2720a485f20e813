"""deploy/windows/install.ps1, read structurally (no PowerShell here): its syntax is balanced, every variable
it reads is a parameter, an automatic variable or assigned, and its names, paths and ports are the
agent's and the example configuration's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from coordinator.config import Settings
from coordinator.httpserver import split_host_port
from coordinator.support.hostos import default_config_file, default_log_file
from coordinator.winservice import SERVICE_NAME

ROOT = Path(__file__).parent.parent.parent
SCRIPT = ROOT / "deploy/windows/install.ps1"
# PowerShell's own variables the script reads.
AUTOMATIC = {"true", "false", "null", "env", "PSScriptRoot", "PSCmdlet", "LASTEXITCODE", "WhatIfPreference",
             "ErrorActionPreference"}


def code_of(text: str) -> str:
    """The script without comments, block comments and here-strings: what the checks below read."""
    text = re.sub(r"<#.*?#>", "", text, flags=re.S)
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())


def unbalanced(code: str) -> list[str]:
    """Brackets and quotes that do not pair up, PowerShell's quoting rules simplified: '' inside single
    quotes, a backtick escape inside double quotes and outside, $( ) inside double quotes."""
    problems: list[str] = []
    stack: list[tuple[str, int]] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    line, i, quote = 1, 0, ""
    while i < len(code):
        c = code[i]
        if c == "\n":
            line += 1
        if quote == "'":
            if c == "'" and code[i + 1 : i + 2] == "'":
                i += 1
            elif c == "'":
                quote = ""
        elif quote == '"':
            if c == "`":
                i += 1
            elif c == "$" and code[i + 1 : i + 2] == "(":
                stack.append(('"$(', line))
                quote = ""
                i += 1
            elif c == '"':
                quote = ""
        elif c == "`":
            i += 1
        elif c in "'\"":
            quote = c
        elif c in "([{":
            stack.append((c, line))
        elif c in ")]}":
            if not stack:
                problems.append(f"line {line}: {c} closes nothing")
            else:
                opened, at = stack.pop()
                if opened == '"$(' and c == ")":
                    quote = '"'
                elif pairs[c] != opened:
                    problems.append(f"line {line}: {c} closes {opened} of line {at}")
        i += 1
    if quote:
        problems.append(f"an unterminated {quote} string")
    problems += [f"line {at}: {opened} never closed" for opened, at in stack]
    return problems


def test_the_checker_catches_broken_syntax() -> None:
    assert unbalanced('if ($a) { "x $(Get-Date) y" }') == []
    assert unbalanced("$a = 'it''s'") == []
    assert unbalanced("if ($a) { $b") == ["line 1: { never closed"]
    assert unbalanced('Write-Host "oops') == ['an unterminated " string']
    assert unbalanced("f(]") == ["line 1: ] closes ( of line 1"]


def test_the_script_is_balanced() -> None:
    assert unbalanced(code_of(SCRIPT.read_text())) == []


def parameters(code: str) -> set[str]:
    block = code.split("param(", 1)[1]
    depth = 1
    for end, c in enumerate(block):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0:
            return set(re.findall(r"\]\s*\$(\w+)", block[:end]))
    raise AssertionError("param( is never closed")


def test_every_variable_read_is_declared_or_assigned() -> None:
    code = code_of(SCRIPT.read_text())
    params = parameters(code)
    assert params == {"Python", "Prefix", "Package", "ConfigDir", "ProbePort", "ProbeRemoteAddress",
                      "Reinstall", "Start"}
    assigned = set(re.findall(r"^\s*\$(\w+)\s*=", code, re.M))
    function_params = set(re.findall(r"\[(?:string|scriptblock)\]\s*\$(\w+)", code.split("param(", 2)[-1]))
    used = set(re.findall(r"\$(\w+)", code))
    undeclared = used - params - assigned - function_params - AUTOMATIC
    assert undeclared == set(), f"variables read but never declared: {sorted(undeclared)}"
    unused = {p for p in params if len(re.findall(rf"\${p}\b", code)) < 2}  # the declaration and a use
    assert unused == set(), f"parameters never used: {sorted(unused)}"


def test_what_if_and_elevation() -> None:
    code = code_of(SCRIPT.read_text())
    assert "[CmdletBinding(SupportsShouldProcess = $true)]" in code
    # Every command that changes the machine runs inside the block of a $PSCmdlet.ShouldProcess(...) test.
    changes = list(re.finditer(r"New-Item|Copy-Item|icacls\.exe|service install|sc\.exe failure|New-NetFirewallRule|"
                               r"Set-NetFirewallRule|Start-Service|Restart-Service|-m venv|pip install --", code))
    assert len(changes) == 12
    for change in changes:
        guard = code.rfind("$PSCmdlet.ShouldProcess(", 0, change.start())
        assert guard >= 0, f"{change.group()} is not guarded by ShouldProcess"
        between = code[guard : change.start()]
        assert between.count("{") - between.count("}") > 0, f"{change.group()} is outside its ShouldProcess block"
    assert "IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)" in code


def test_names_paths_and_ports_match_the_agent_and_the_example() -> None:
    text = SCRIPT.read_text()
    assert f'$ServiceName = "{SERVICE_NAME}"' in text
    assert '[string] $Prefix = "C:\\Program Files\\coordinator"' in text
    # The configuration and log paths the script uses are the service's defaults.
    env = {"ProgramData": r"C:\ProgramData"}
    assert str(default_config_file("win32", env)) == r"C:\ProgramData\coordinator\coordinator.yaml"
    assert '(Join-Path $env:ProgramData "coordinator")' in text
    assert '$ConfigFile = Join-Path $ConfigDir "coordinator.yaml"' in text
    assert str(default_log_file(env)).endswith(r"\coordinator\coordinator.log") and "'coordinator.log'" in text
    # The example exists where the script looks (two levels above the script) and its probe port is the
    # script's and the agent's default.
    assert '"deploy\\coordinator.example.yaml"' in text
    example = yaml.safe_load((ROOT / "deploy/coordinator.example.yaml").read_text())
    port = int(re.search(r"\[int\] \$ProbePort = (\d+)", text).group(1))  # type: ignore[union-attr]
    assert port == split_host_port(example["probe"]["listen"])[1] == split_host_port(Settings.model_fields[
        "probe"].default.listen)[1] == 8090
    # The script reads the version the package declares.
    assert re.search(r'^version = "[^"]+"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert "importlib.metadata as m; print(m.version('azure-maintenance-coordinator'))" in text


def test_recovery_acl_and_firewall() -> None:
    code = code_of(SCRIPT.read_text())
    assert "sc.exe failure $ServiceName reset= 86400 actions= restart/5000/restart/5000/restart/30000" in code
    assert "sc.exe failureflag $ServiceName 1" in code
    # Administrators and SYSTEM by well-known SID (names are localised), nothing inherited.
    assert 'icacls.exe $ConfigFile /inheritance:r /grant:r "*S-1-5-32-544:(F)" "*S-1-5-18:(F)"' in code
    assert re.search(r"New-NetFirewallRule -Name \$FirewallRule .*-Direction Inbound `\n\s+-Protocol TCP "
                     r"-LocalPort \$ProbePort", code)
    # Idempotent: an existing rule and an existing configuration are kept, not duplicated or overwritten.
    assert "Get-NetFirewallRule -Name $FirewallRule -ErrorAction SilentlyContinue" in code
    assert "if (-not (Test-Path $ConfigFile))" in code
    # The service is (re)started only once check-config accepts the configuration.
    assert code.index("check-config --config $ConfigFile") < code.index("Restart-Service")
