"""The container kit: docker-compose.yml checked by the real Compose binary, HAProxy's and Prometheus's
configurations checked by haproxy and promtool at the paths compose mounts them, the Dockerfile read
instruction by instruction, and all of them checked against one another and against what `make demo`
runs. No container engine runs here: the image is never built, the stack never started."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry

from coordinator.actions.probe import ProbeState
from coordinator.config import HAProxyActionConfig, Settings, load_settings
from coordinator.httpserver import HttpSurface
from coordinator.testbed import demo
from coordinator.testbed.cluster import LocalCluster

ROOT = Path(__file__).parent.parent.parent
COMPOSE = ROOT / ".venv" / "tools" / "docker-compose"
VMS = ("vm0", "vm1", "vm2")
ZOOKEEPERS = ("zk1", "zk2", "zk3")


def _missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        _missing(f"{name} is missing: scripts/setup.sh installs it")
    assert path is not None
    return path


def compose_config() -> dict[str, Any]:
    if not COMPOSE.exists():
        _missing(f"{COMPOSE} missing: scripts/setup.sh installs it")
    result = subprocess.run([str(COMPOSE), "-f", str(ROOT / "docker-compose.yml"), "config", "--format", "json"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    found: dict[str, Any] = compose_config()["services"]
    return found


def _agent_settings(services: dict[str, Any], vm: str) -> Settings:
    return load_settings(None, environ=services[vm]["environment"])


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _mirror_mounts(service: dict[str, Any], root: Path) -> None:
    """Copy each bind mount of ``service`` to ``root`` + its target: the files as the container sees them."""
    for volume in service.get("volumes", []):
        if volume["type"] != "bind":
            continue
        source, target = Path(volume["source"]), root / volume["target"].lstrip("/")
        assert source.exists(), f"bind mount source {source} does not exist"
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)


# -- compose ----------------------------------------------------------------------------------------------


def test_compose_file_is_valid_and_every_agent_configuration_too(services: dict[str, Any]) -> None:
    expected = {*ZOOKEEPERS, "imds-sim", *VMS, *(f"app-{vm}" for vm in VMS), "haproxy", "load", "prometheus",
                "grafana"}
    assert expected <= set(services), sorted(expected - set(services))
    sim = services["imds-sim"]["command"]
    assert sim[:2] == ["coordinator", "imds-sim"]
    bindings = dict(arg.split("=", 1) for arg in sim[sim.index("--vm"):] if "=" in arg)
    for vm in VMS:
        settings = _agent_settings(services, vm)
        assert settings.vm_name == vm
        assert services[vm]["command"][:2] == ["coordinator", "run"]
        imds = urlsplit(settings.imds.url)
        assert (imds.hostname, imds.port) == ("imds-sim", _port(bindings[vm])), f"{vm} reads another VM's IMDS"
        # the drain state survives a new container, in a volume of its own
        assert settings.state_file is not None
        mounts = {v["target"]: v for v in services[vm]["volumes"]}
        assert mounts[str(settings.state_file.parent)]["type"] == "volume"
    sources = {services[vm]["volumes"][0]["source"] for vm in VMS}
    assert len(sources) == len(VMS), "two agents share a state volume"


def test_the_zookeeper_ensemble_has_three_nodes_and_the_agents_use_all_of_them(services: dict[str, Any]) -> None:
    ids = {}
    for name in ZOOKEEPERS:
        service = services[name]
        assert service["image"].startswith("zookeeper:3.8")
        environment = service["environment"]
        ids[name] = environment["ZOO_MY_ID"]
        servers = dict(entry.split("=", 1) for entry in environment["ZOO_SERVERS"].split())
        assert servers == {f"server.{i}": f"{zk}:2888:3888;2181" for i, zk in enumerate(ZOOKEEPERS, 1)}
    assert ids == {zk: str(i) for i, zk in enumerate(ZOOKEEPERS, 1)}
    for vm in VMS:
        hosts = _agent_settings(services, vm).zookeeper.hosts
        assert sorted(hosts.split(",")) == [f"{zk}:2181" for zk in ZOOKEEPERS]
        assert set(ZOOKEEPERS) <= set(services[vm]["depends_on"])


def _demo_settings(vm: str) -> Settings:
    """The local group's configuration for ``vm`` (``LocalCluster``, with ``coordinator demo``'s drain wait)."""
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args([])
    cluster = LocalCluster(Path("/nonexistent"), drain_wait=args.drain_wait)
    cluster.zk_hosts = "127.0.0.1:2181"
    cluster.imds_urls = {name: f"http://127.0.0.1:{18100 + i}" for i, name in enumerate(VMS)}
    config = cluster.agent_config(vm, 8090, 9110)
    # demo's HAProxy action (LocalCluster._start_haproxy), on a UNIX socket there
    config["actions"] = [{"type": "haproxy", "runtime": "/run/admin.sock", "backend": "be_app", "server": vm,
                          "drain_timeout_seconds": 10}]
    return Settings.model_validate(config)


# Where the containers differ from the processes of the local group (documented in docs/deployment.md):
# addresses (container names, not loopback ports), where the state file lives, and how the HAProxy action
# reaches the runtime API (TCP inside the compose network, not a UNIX socket).
_DIFFERENT = {"imds": {"url"}, "zookeeper": {"hosts"}, "probe": {"listen"}, "http": {"listen"}, "state_file": True}


def _without_addresses(settings: Settings) -> dict[str, Any]:
    data = settings.model_dump(mode="json")
    for section, fields in _DIFFERENT.items():
        if fields is True:
            data.pop(section)
        else:
            for name in fields:
                data[section].pop(name)
    for action in data["actions"]:
        action.pop("runtime")
    return data


def test_the_agents_run_as_make_demo_runs_them(services: dict[str, Any]) -> None:
    for vm in VMS:
        compose, local = _agent_settings(services, vm), _demo_settings(vm)
        assert _without_addresses(compose) == _without_addresses(local)
        assert compose.cluster == "demo"
        assert compose.probe.path == local.probe.path == "/health"


def test_the_app_servers_share_their_agents_address_as_on_a_vm(services: dict[str, Any]) -> None:
    for vm in VMS:
        app = services[f"app-{vm}"]
        assert app["network_mode"] == f"service:{vm}"
        command = app["command"]
        assert command[:3] == ["python", "-m", "coordinator.testbed.app"]
        assert command[command.index("--name") + 1] == vm
        # the module runs with these arguments (it is the demo's app server)
        probe = subprocess.run([sys.executable, *command[1:], "--help"], capture_output=True, text=True,
                               timeout=60, check=False)
        assert probe.returncode == 0, probe.stderr
    load = services["load"]["command"]
    assert load[:3] == ["python", "-m", "coordinator.testbed.load"]
    target = urlsplit(load[load.index("--url") + 1])
    frontend = re.search(r"^frontend \w+\n(?:\s+.*\n)*?\s+bind :(\d+)", _haproxy_text(), re.M)
    assert frontend is not None
    assert (target.hostname, target.port) == ("haproxy", int(frontend.group(1)))


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    compose_config()  # the binary is there
    broken = tmp_path / "docker-compose.yml"
    text = (ROOT / "docker-compose.yml").read_text()
    assert "depends_on: [zk1, zk2, zk3, imds-sim]" in text
    broken.write_text(text.replace("depends_on: [zk1, zk2, zk3, imds-sim]", "depends_on: [zk1, nowhere]"))
    result = subprocess.run([str(COMPOSE), "-f", str(broken), "config", "-q"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode != 0
    assert "nowhere" in result.stderr


# -- HAProxy ----------------------------------------------------------------------------------------------


def _haproxy_text() -> str:
    return (ROOT / "deploy" / "haproxy" / "haproxy.cfg").read_text()


@dataclass(frozen=True)
class _Server:
    name: str
    host: str
    port: int
    check_port: int | None


def _backend(text: str, name: str) -> tuple[list[str], list[_Server]]:
    match = re.search(rf"^backend {name}\n((?:[ \t]+.*\n|\s*\n)*)", text, re.M)
    assert match is not None, f"no backend {name}"
    lines = [line.strip() for line in match.group(1).splitlines() if line.strip()]
    servers = []
    for line in lines:
        words = line.split()
        if words[0] == "server":
            host, _, port = words[2].rpartition(":")
            check_port = int(words[words.index("port") + 1]) if "port" in words else None
            servers.append(_Server(words[1], host, int(port), check_port))
    return lines, servers


def test_haproxy_accepts_its_configuration_where_compose_mounts_it(services: dict[str, Any], tmp_path: Path) -> None:
    haproxy = _tool("haproxy")
    service = services["haproxy"]
    assert service["image"].startswith("haproxy:")
    _mirror_mounts(service, tmp_path)
    # the official image reads /usr/local/etc/haproxy/haproxy.cfg
    config = tmp_path / "usr/local/etc/haproxy/haproxy.cfg"
    assert config.exists()
    result = subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "[WARNING]" in line]
    # container names do not resolve outside the compose network: those servers start without an address
    assert all("could not resolve address" in line for line in warnings), warnings


def test_haproxy_checks_each_agent_probe_and_is_the_runtime_api_the_agents_use(services: dict[str, Any]) -> None:
    text = _haproxy_text()
    lines, servers = _backend(text, "be_app")
    assert [s.name for s in servers] == list(VMS)
    runtime = re.search(r"^\s+stats socket ipv4@[\d.]+:(\d+) level admin$", text, re.M)
    assert runtime is not None
    for server in servers:
        settings = _agent_settings(services, server.name)
        app = services[f"app-{server.name}"]["command"]
        assert server.host == server.name  # the agent's container, whose network the app shares
        assert server.port == int(app[app.index("--port") + 1])
        assert server.check_port == _port(settings.probe.listen)
        assert f"option httpchk GET {settings.probe.path}" in lines
        [action] = settings.actions
        assert isinstance(action, HAProxyActionConfig)
        assert (action.backend, action.server) == ("be_app", server.name)
        assert action.runtime == f"haproxy:{runtime.group(1)}"
    assert "init-addr last,libc,none" in next(line for line in lines if line.startswith("default-server"))


def test_a_broken_haproxy_configuration_is_rejected(tmp_path: Path) -> None:
    haproxy = _tool("haproxy")
    broken = tmp_path / "haproxy.cfg"
    broken.write_text(_haproxy_text().replace("option httpchk", "option httpcheck"))
    result = subprocess.run([haproxy, "-c", "-f", str(broken)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode != 0


# -- Prometheus and Grafana -------------------------------------------------------------------------------


def _prometheus_config_path(service: dict[str, Any]) -> str:
    [flag] = [arg for arg in service["command"] if arg.startswith("--config.file=")]
    return flag.removeprefix("--config.file=")


def test_promtool_accepts_the_compose_prometheus_configuration_as_mounted(
    services: dict[str, Any], tmp_path: Path,
) -> None:
    promtool = _tool("promtool")
    service = services["prometheus"]
    _mirror_mounts(service, tmp_path)
    config = tmp_path / _prometheus_config_path(service).lstrip("/")
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # the alert rules are loaded: the file compose mounts is deploy/prometheus/alerts.yml
    rules = yaml.safe_load(config.read_text())["rule_files"]
    assert [(config.parent / rule).resolve().read_text() for rule in rules] == [
        (ROOT / "deploy/prometheus/alerts.yml").read_text()]


def test_prometheus_scrapes_every_agent_admin_listener(services: dict[str, Any]) -> None:
    path = _prometheus_config_path(services["prometheus"])
    mount = next(v for v in services["prometheus"]["volumes"] if path.startswith(v["target"] + "/"))
    config = yaml.safe_load((Path(mount["source"]) / path.removeprefix(mount["target"] + "/")).read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = {t: group["labels"] for group in job["static_configs"] for t in group["targets"]}
    expected = {}
    for vm in VMS:
        settings = _agent_settings(services, vm)
        expected[f"{vm}:{_port(settings.http.listen)}"] = {"vm": vm, "cluster": settings.cluster}
        assert settings.http.listen.startswith("0.0.0.0:"), "Prometheus scrapes from another container"
    assert targets == expected


def test_grafana_is_provisioned_with_the_dashboard_and_the_compose_prometheus(
    services: dict[str, Any], tmp_path: Path,
) -> None:
    service = services["grafana"]
    _mirror_mounts(service, tmp_path)
    provisioning = tmp_path / "etc/grafana/provisioning"
    [datasource] = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"]
    url = urlsplit(datasource["url"])
    assert url.hostname == "prometheus" and url.port == 9090
    assert int(services["prometheus"]["ports"][0]["target"]) == 9090
    [provider] = yaml.safe_load((provisioning / "dashboards/coordinator.yml").read_text())["providers"]
    dashboards = sorted((tmp_path / provider["options"]["path"].lstrip("/")).glob("*.json"))
    assert [d.name for d in dashboards] == ["coordinator.json"]
    assert json.loads(dashboards[0].read_text())["panels"]


# -- Dockerfile -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Instruction:
    keyword: str
    args: str


def _dockerfile() -> list[_Instruction]:
    text = re.sub(r"\\\n(?:\s*#.*\n)*", " ", (ROOT / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, args = line.partition(" ")
            found.append(_Instruction(keyword.upper(), " ".join(args.split())))
    return found


def _stages(instructions: list[_Instruction]) -> Iterator[list[_Instruction]]:
    stage: list[_Instruction] = []
    for instruction in instructions:
        if instruction.keyword == "FROM" and stage:
            yield stage
            stage = []
        stage.append(instruction)
    yield stage


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list)
    return [str(v) for v in value]


def test_the_image_runs_as_an_unprivileged_user_from_a_small_base() -> None:
    *build, final = list(_stages(_dockerfile()))
    assert build, "multi-stage: the build stage's tools stay behind"
    assert re.fullmatch(r"python:3\.\d+-slim", final[0].args)
    [user] = [i.args for i in final if i.keyword == "USER"]
    uid = user.partition(":")[0]
    assert uid not in {"root", "0", ""}
    run = " ".join(i.args for i in final if i.keyword == "RUN")
    assert f"--uid {uid}" in run
    # no compilers or package caches in the final image; pip never keeps its cache
    assert "apt-get" not in run and "gcc" not in run
    for stage in (*build, final):
        for instruction in stage:
            if instruction.keyword == "RUN" and "pip install" in instruction.args:
                assert "--no-cache-dir" in instruction.args


def test_the_state_directory_is_a_volume_owned_by_the_user(services: dict[str, Any]) -> None:
    final = list(_stages(_dockerfile()))[-1]
    state = _agent_settings(services, "vm0").state_file
    assert state is not None
    volumes = [v for i in final if i.keyword == "VOLUME" for v in _exec_form(i.args)]
    assert str(state.parent) in volumes
    run = " ".join(i.args for i in final if i.keyword == "RUN")
    [useradd] = [part.split() for part in run.split("&&") if "useradd" in part]
    [user] = [i.args for i in final if i.keyword == "USER"]
    assert useradd[useradd.index("--uid") + 1] == user.partition(":")[0]
    name = useradd[-1]
    assert re.search(rf"install -d -o {name} -g {name} -m 07[05]0 {re.escape(str(state.parent))}\b", run)


def test_the_healthcheck_asks_the_agent_livez_on_its_admin_port(services: dict[str, Any]) -> None:
    final = list(_stages(_dockerfile()))[-1]
    [healthcheck] = [i.args for i in final if i.keyword == "HEALTHCHECK"]
    command = _exec_form(healthcheck.partition("CMD ")[2])
    url = urlsplit(command[-1])
    assert (url.hostname, url.path) == ("127.0.0.1", "/livez")
    for vm in VMS:
        listen = _agent_settings(services, vm).http.listen
        assert listen.rpartition(":")[0] in {"0.0.0.0", "127.0.0.1"}
        assert url.port == _port(listen), f"{vm}'s admin listener is not where the HEALTHCHECK asks"
        assert "healthcheck" not in services[vm], "the agents keep the image's HEALTHCHECK"
    # the script the HEALTHCHECK runs is the one copied into the image
    copies = {dest: src for i in final if i.keyword == "COPY" and "--from" not in i.args
              for src, dest in [i.args.split()]}
    assert command[1] in copies
    [cmd] = [_exec_form(i.args) for i in final if i.keyword == "CMD"]
    assert cmd[:2] == ["coordinator", "run"]
    # the other services run from the image set a check of their own, or none
    for name in ("imds-sim", *(f"app-{vm}" for vm in VMS), "load"):
        assert "healthcheck" in services[name], name


def test_every_path_the_dockerfile_copies_exists_and_reaches_the_build_context() -> None:
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", ".dockerignore keeps the context small: everything out, then the few paths in"
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    copied = 0
    for instruction in _dockerfile():
        if instruction.keyword in {"COPY", "ADD"} and "--from" not in instruction.args:
            *sources, _dest = instruction.args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which does not exist"
                assert any(source.rstrip("/") == a or source.startswith(a + "/") for a in allowed), source
                copied += 1
    assert copied >= 3


def test_the_healthcheck_script_follows_the_agent_livez() -> None:
    """The HEALTHCHECK's script against the product's own admin listener: 200, then 503, then nothing."""
    final = list(_stages(_dockerfile()))[-1]
    [healthcheck] = [i.args for i in final if i.keyword == "HEALTHCHECK"]
    image_path = _exec_form(healthcheck.partition("CMD ")[2])[1]
    copies = {dest: src for i in final if i.keyword == "COPY" and "--from" not in i.args
              for src, dest in [i.args.split()]}
    script = ROOT / copies[image_path]

    @dataclass
    class Live:
        ok: bool = True
        detail: str = "test"
        lead: str | None = None

    live = Live()
    surface = HttpSurface(probe_listen="127.0.0.1:0", probe_path="/health", admin_listen="127.0.0.1:0",
                          probe=ProbeState(), registry=CollectorRegistry(), status=dict, live=lambda: live)
    surface.start()
    try:
        url = f"http://127.0.0.1:{surface.admin_address[1]}/livez"

        def check() -> int:
            return subprocess.run([sys.executable, str(script), url], capture_output=True, timeout=30,
                                  check=False).returncode

        assert check() == 0
        live.ok = False
        assert check() == 1
    finally:
        surface.stop()
    assert check() == 1  # nothing listens any more


def test_the_documented_compose_commands_name_real_services(services: dict[str, Any]) -> None:
    doc = (ROOT / "docs" / "deployment.md").read_text()
    named = [name for command in re.findall(r"^docker compose (?:logs -f|restart|stop|start) (.+)$", doc, re.M)
             for name in shlex.split(command.split("#")[0]) if not name.startswith("-")]
    assert named
    for name in named:
        assert name in services, f"docs/deployment.md names a service {name} that compose lacks"
