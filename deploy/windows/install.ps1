<#
.SYNOPSIS
    Installs the coordinator agent as a Windows service. Safe to run again.

.DESCRIPTION
    From an elevated PowerShell prompt, in a copy of the source tree (or with -Package):
      1. a virtualenv in -Prefix (default C:\Program Files\coordinator), created with -Python;
      2. the package installed into it (again only when its version changed, or with -Reinstall);
      3. %ProgramData%\coordinator\coordinator.yaml from deploy\coordinator.example.yaml if there is none,
         readable by Administrators and SYSTEM only (it may hold webhook tokens and ZooKeeper passwords);
      4. the service "coordinator" (automatic start) through "coordinator service install", with recovery
         actions: restart after 5 s, 5 s, then 30 s; the failure count resets after a day;
      5. an inbound Windows Firewall rule for the health probe port (default 8090), which the load balancer
         and the peers probe.
    -WhatIf prints every step and changes nothing. The service is started only with -Start, and only if
    "coordinator check-config" accepts the configuration.

.EXAMPLE
    .\deploy\windows\install.ps1 -WhatIf
    .\deploy\windows\install.ps1 -Python C:\Python312\python.exe -Start
#>
[CmdletBinding(SupportsShouldProcess = $true)]
param(
    [string] $Python = "python.exe",
    [string] $Prefix = "C:\Program Files\coordinator",
    [string] $Package = "",
    [string] $ConfigDir = (Join-Path $env:ProgramData "coordinator"),
    [int] $ProbePort = 8090,
    [string[]] $ProbeRemoteAddress = @("Any"),
    [switch] $Reinstall,
    [switch] $Start
)

Set-StrictMode -Version Latest
$ErrorActionPreference = "Stop"

$ServiceName = "coordinator"
$FirewallRule = "coordinator-probe"
$SourceTree = Split-Path -Parent (Split-Path -Parent $PSScriptRoot)
$Example = Join-Path $SourceTree "deploy\coordinator.example.yaml"
$ConfigFile = Join-Path $ConfigDir "coordinator.yaml"
$VenvPython = Join-Path $Prefix "Scripts\python.exe"
$Coordinator = Join-Path $Prefix "Scripts\coordinator.exe"
if ($Package -eq "") { $Package = $SourceTree }

function Invoke-Checked {
    param([string] $What, [scriptblock] $Command)
    Write-Host "install: $What"
    & $Command
    if ($LASTEXITCODE -ne 0) { throw "install: $What failed (exit $LASTEXITCODE)" }
}

$principal = New-Object Security.Principal.WindowsPrincipal([Security.Principal.WindowsIdentity]::GetCurrent())
if (-not $WhatIfPreference -and -not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) {
    throw "install: run this from an elevated PowerShell prompt (Run as administrator)"
}

# 1. The virtualenv.
if (-not (Test-Path $VenvPython)) {
    if ($PSCmdlet.ShouldProcess($Prefix, "create a virtualenv with $Python")) {
        Invoke-Checked "virtualenv $Prefix" { & $Python -m venv $Prefix }
    }
} else {
    Write-Host "install: virtualenv $Prefix exists"
}

# 2. The package, when missing, changed or forced.
$installed = ""
if (Test-Path $VenvPython) {
    $installed = (& $VenvPython -c "import importlib.metadata as m; print(m.version('azure-maintenance-coordinator'))" 2>$null)
}
$wanted = ""
if (Test-Path (Join-Path $Package "pyproject.toml")) {
    $match = Select-String -Path (Join-Path $Package "pyproject.toml") -Pattern '^version = "([^"]+)"' | Select-Object -First 1
    if ($match) { $wanted = $match.Matches[0].Groups[1].Value }
}
$upgraded = $false
if ($Reinstall -or $installed -eq "" -or $installed -ne $wanted) {
    if ($PSCmdlet.ShouldProcess($Prefix, "pip install $Package (installed: '$installed', wanted: '$wanted')")) {
        Invoke-Checked "pip install $Package" { & $VenvPython -m pip install --no-cache-dir --upgrade $Package }
        $upgraded = $true
    }
} else {
    Write-Host "install: package $installed already installed"
}

# 3. The configuration, readable by Administrators (S-1-5-32-544) and SYSTEM (S-1-5-18) only.
if (-not (Test-Path $ConfigDir)) {
    if ($PSCmdlet.ShouldProcess($ConfigDir, "create the configuration directory")) {
        New-Item -ItemType Directory -Path $ConfigDir | Out-Null
    }
}
if (-not (Test-Path $ConfigFile)) {
    if ($PSCmdlet.ShouldProcess($ConfigFile, "write from $Example")) {
        Copy-Item -Path $Example -Destination $ConfigFile
    }
} else {
    Write-Host "install: keeping the existing $ConfigFile"
}
if ($PSCmdlet.ShouldProcess($ConfigFile, "restrict to Administrators and SYSTEM")) {
    Invoke-Checked "ACL of $ConfigFile" { icacls.exe $ConfigFile /inheritance:r /grant:r "*S-1-5-32-544:(F)" "*S-1-5-18:(F)" }
}

# 4. The service, with recovery actions. failureflag 1: a stop with an error (the agent exited non-zero)
#    counts as a failure too, not only a crash of the process.
if ($PSCmdlet.ShouldProcess($ServiceName, "install the service (automatic start) reading $ConfigFile")) {
    Invoke-Checked "service $ServiceName" { & $Coordinator service install --config $ConfigFile }
    Invoke-Checked "recovery actions" { sc.exe failure $ServiceName reset= 86400 actions= restart/5000/restart/5000/restart/30000 }
    Invoke-Checked "recovery on error exits" { sc.exe failureflag $ServiceName 1 }
}

# 5. The probe port, for the load balancer and the peers.
if (-not (Get-NetFirewallRule -Name $FirewallRule -ErrorAction SilentlyContinue)) {
    if ($PSCmdlet.ShouldProcess("TCP $ProbePort", "allow inbound (firewall rule $FirewallRule)")) {
        New-NetFirewallRule -Name $FirewallRule -DisplayName "coordinator health probe" -Direction Inbound `
            -Protocol TCP -LocalPort $ProbePort -RemoteAddress $ProbeRemoteAddress -Action Allow | Out-Null
    }
} else {
    if ($PSCmdlet.ShouldProcess("TCP $ProbePort", "update firewall rule $FirewallRule")) {
        Set-NetFirewallRule -Name $FirewallRule -Protocol TCP -LocalPort $ProbePort -RemoteAddress $ProbeRemoteAddress
    }
}

# Start (or restart after an upgrade) only with a configuration this version accepts.
if ($Start -or $upgraded) {
    $service = Get-Service -Name $ServiceName -ErrorAction SilentlyContinue
    $running = $service -and $service.Status -eq "Running"
    if ($Start -or $running) {
        if ($PSCmdlet.ShouldProcess($ServiceName, "check the configuration, then (re)start")) {
            Invoke-Checked "check-config $ConfigFile" { & $Coordinator check-config --config $ConfigFile | Out-Null }
            if ($running) { Restart-Service -Name $ServiceName } else { Start-Service -Name $ServiceName }
        }
    }
}
Write-Host "install: done. Log: $(Join-Path $ConfigDir 'coordinator.log')"
