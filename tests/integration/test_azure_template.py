"""The Azure template (deploy/azure/coordinator.json), checked structurally: no Azure subscription is
reachable here, so it is never deployed, nor validated by Azure Resource Manager.

The cloud-init documents the VMs receive are built in the template by ARM expressions (format(), base64(),
if() over parameters and variables). Rather than copying them into the test with placeholders filled in
by hand, which could drift from what the template really computes, a small evaluator below runs the
template's own expressions, for the handful of ARM functions the template uses. Any other function in
the template fails `test_the_template_uses_only_functions_the_evaluator_knows`, so what is rendered here
is what the template says. The rendered agent configuration is then loaded by the agent's own
`load_settings`, and compared with the load balancer's probe, the ZooKeeper servers and the systemd kit.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from coordinator.config import Settings, load_settings

ROOT = Path(__file__).parent.parent.parent
TEMPLATE_PATH = ROOT / "deploy" / "azure" / "coordinator.json"
UNIT = ROOT / "deploy" / "systemd" / "coordinator.service"
INSTALL = ROOT / "deploy" / "systemd" / "install.sh"
AGENT_CONFIG = "/etc/coordinator/coordinator.yaml"
PASSWORD_FILE = "/etc/coordinator/zookeeper-password"
REQUIREMENTS = "/etc/coordinator/requirements.txt"


# --- a small evaluator of ARM template expressions ------------------------------------------------------


@dataclass(frozen=True)
class Lit:
    value: str | int


@dataclass(frozen=True)
class Call:
    name: str  # lower case: ARM function names are case-insensitive
    args: tuple[Node, ...]


@dataclass(frozen=True)
class Index:
    target: Node
    key: Node


@dataclass(frozen=True)
class Member:
    target: Node
    name: str


Node = Lit | Call | Index | Member


@dataclass(frozen=True)
class ResourceId:
    """What resourceId() returns here: the type and the name segments, compared with the template's resources."""

    type: str
    names: tuple[str, ...]


class NotEvaluated(Exception):
    """reference() reads a deployed resource: it has no value before a deployment."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def parse(self) -> Node:
        node = self._expr()
        self._skip()
        if self.pos != len(self.text):
            raise SyntaxError(f"unexpected {self.text[self.pos:]!r} in {self.text!r}")
        return node

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1

    def _eat(self, char: str) -> bool:
        self._skip()
        if self.text.startswith(char, self.pos):
            self.pos += 1
            return True
        return False

    def _expect(self, char: str) -> None:
        if not self._eat(char):
            raise SyntaxError(f"expected {char!r} at {self.pos} in {self.text!r}")

    def _expr(self) -> Node:
        self._skip()
        node: Node
        if self._eat("'"):
            value = []
            while True:
                end = self.text.index("'", self.pos)
                value.append(self.text[self.pos:end])
                self.pos = end + 1
                if not self.text.startswith("'", self.pos):
                    break
                value.append("'")  # '' inside a string literal is one quote
                self.pos += 1
            node = Lit("".join(value))
        elif match := re.compile(r"-?\d+").match(self.text, self.pos):
            node, self.pos = Lit(int(match.group())), match.end()
        elif match := re.compile(r"[A-Za-z][A-Za-z0-9_.]*").match(self.text, self.pos):
            self.pos = match.end()
            self._expect("(")
            args: list[Node] = []
            if not self._eat(")"):
                args.append(self._expr())
                while self._eat(","):
                    args.append(self._expr())
                self._expect(")")
            node = Call(match.group().lower(), tuple(args))
        else:
            raise SyntaxError(f"unexpected {self.text[self.pos:]!r} in {self.text!r}")
        while True:
            if self._eat("["):
                node = Index(node, self._expr())
                self._expect("]")
            elif self._eat("."):
                self._skip()
                name = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.pos)
                assert name is not None, self.text
                node, self.pos = Member(node, name.group()), name.end()
            else:
                return node


def expression(value: str) -> Node | None:
    """The parsed expression of a template string, or None for a literal (ARM: '[[' escapes a literal '[')."""
    if value.startswith("[") and value.endswith("]") and not value.startswith("[["):
        return _Parser(value[1:-1]).parse()
    return None


def _dotnet_format(template: str, *args: Any) -> str:
    """ARM's format(): .NET composite formatting, {n} and the escapes {{ and }}."""

    def one(match: re.Match[str]) -> str:
        if match.group() in ("{{", "}}"):
            return match.group()[0]
        if match.group(1) is None:
            raise ValueError(f"stray brace in format string: {template!r}")
        return _string(args[int(match.group(1))])

    return re.sub(r"\{\{|\}\}|\{(\d+)\}|[{}]", one, template)


def _string(value: Any) -> str:
    if isinstance(value, bool):
        raise TypeError("a bool in a string: ARM would write True/False")
    if isinstance(value, str | int):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


class Template:
    """The template for one set of parameter values: evaluates its expressions as ARM would."""

    def __init__(self, data: Mapping[str, Any], parameters: Mapping[str, Any] | None = None) -> None:
        self.data = data
        given = dict(parameters or {})
        unknown = set(given) - set(data["parameters"])
        assert not unknown, f"not parameters of the template: {unknown}"
        self.parameters: dict[str, Any] = {}
        for name, spec in data["parameters"].items():
            if name in given:
                self.parameters[name] = given[name]
            else:
                assert "defaultValue" in spec, f"parameter {name} has no default: give it"
                self.parameters[name] = self.resolve(spec["defaultValue"])
        self._variables: dict[str, Any] = {}
        self._evaluating: set[str] = set()

    FUNCTIONS = frozenset({"parameters", "variables", "format", "string", "base64", "if", "equals", "empty",
                           "not", "copyindex", "resourceid", "resourcegroup", "reference"})

    def resolve(self, value: Any, copy_index: int | None = None) -> Any:
        """``value`` with every expression in it evaluated (``copy_index``: inside a copy loop)."""
        if isinstance(value, str):
            node = expression(value)
            if node is None:
                return value[1:] if value.startswith("[[") else value
            return self.evaluate(node, copy_index)
        if isinstance(value, list):
            return [self.resolve(item, copy_index) for item in value]
        if isinstance(value, dict):
            return {key: self.resolve(item, copy_index) for key, item in value.items()}
        return value

    def variable(self, name: str) -> Any:
        if name not in self._variables:
            assert name not in self._evaluating, f"variable {name} refers to itself"
            self._evaluating.add(name)
            self._variables[name] = self.resolve(self.data["variables"][name])
            self._evaluating.discard(name)
        return self._variables[name]

    def evaluate(self, node: Node, copy_index: int | None = None) -> Any:
        if isinstance(node, Lit):
            return node.value
        if isinstance(node, Index):
            return self.evaluate(node.target, copy_index)[self.evaluate(node.key, copy_index)]
        if isinstance(node, Member):
            return self.evaluate(node.target, copy_index)[node.name]
        if node.name == "if":  # only the branch taken is evaluated, as in ARM
            condition, then, otherwise = node.args
            return self.evaluate(then if self.evaluate(condition, copy_index) else otherwise, copy_index)
        args = [self.evaluate(arg, copy_index) for arg in node.args]
        functions: dict[str, Callable[..., Any]] = {
            "parameters": lambda name: self.parameters[name],
            "variables": self.variable,
            "format": _dotnet_format,
            "string": _string,
            "base64": lambda text: base64.b64encode(text.encode()).decode(),
            "equals": lambda a, b: a == b,
            "empty": lambda value: len(value) == 0,
            "not": lambda value: not value,
            "copyindex": lambda offset=0: self._copy_index(copy_index) + offset,
            "resourceid": lambda type_, *names: ResourceId(type_, tuple(names)),
            "resourcegroup": lambda: {"name": "rg", "location": "westeurope"},
        }
        if node.name == "reference":
            raise NotEvaluated("reference() needs a deployment")
        assert set(functions) | {"if", "reference"} == self.FUNCTIONS
        return functions[node.name](*args)

    @staticmethod
    def _copy_index(copy_index: int | None) -> int:
        assert copy_index is not None, "copyIndex() outside a copy loop"
        return copy_index

    # resources

    def count(self, resource: Mapping[str, Any]) -> int | None:
        """How many copies of ``resource`` (None: not a copy loop)."""
        if "copy" not in resource:
            return None
        count = self.resolve(resource["copy"]["count"])
        assert isinstance(count, int)
        return count

    def instances(self, resource: Mapping[str, Any]) -> Iterator[tuple[int | None, dict[str, Any]]]:
        """Each deployed copy of ``resource`` with its copy index, fully evaluated (reference() excepted)."""
        count = self.count(resource)
        for index in [None] if count is None else range(count):
            yield index, self.resolve(dict(resource), index)

    def resources(self, type_: str) -> list[dict[str, Any]]:
        return [instance for resource in self.data["resources"] if resource["type"] == type_
                for _, instance in self.instances(resource)]

    def resource(self, type_: str, name: str) -> dict[str, Any]:
        found = [r for r in self.resources(type_) if r["name"] == name]
        assert len(found) == 1, (type_, name)
        return found[0]


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(TEMPLATE_PATH.read_text())
    return loaded


def _strings(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every string value of the template with its location (property names are never expressions)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}")


def _nodes(node: Node) -> Iterator[Node]:
    yield node
    if isinstance(node, Call):
        for arg in node.args:
            yield from _nodes(arg)
    elif isinstance(node, Index):
        yield from _nodes(node.target)
        yield from _nodes(node.key)
    elif isinstance(node, Member):
        yield from _nodes(node.target)


def _calls(value: Any) -> Iterator[tuple[str, Call]]:
    for where, text in _strings(value):
        node = expression(text)
        if node is not None:
            for sub in _nodes(node):
                if isinstance(sub, Call):
                    yield where, sub


def test_the_evaluator_follows_arm() -> None:
    template = Template({"parameters": {"p": {"type": "int", "defaultValue": 7}},
                         "variables": {"v": "[format('{{{0}}}-{1}', parameters('p'), 'it''s')]", "w": "[[x]"}})
    assert template.variable("v") == "{7}-it's"
    assert template.variable("w") == "[x]"  # an escaped literal
    assert template.resolve("[if(equals(parameters('p'), 7), 'yes', reference('x').y)]") == "yes"
    with pytest.raises(ValueError, match="stray brace"):
        template.resolve("[format('{a}', 1)]")


# --- the template as a document ---------------------------------------------------------------------------


def test_the_template_is_an_arm_deployment_template(data: dict[str, Any]) -> None:
    assert data["$schema"].endswith("/deploymentTemplate.json#")
    assert set(data) == {"$schema", "contentVersion", "metadata", "parameters", "variables", "resources", "outputs"}
    types = {resource["type"] for resource in data["resources"]}
    assert types == {
        "Microsoft.Network/networkSecurityGroups", "Microsoft.Network/publicIPAddresses",
        "Microsoft.Network/natGateways", "Microsoft.Network/virtualNetworks", "Microsoft.Network/loadBalancers",
        "Microsoft.Compute/availabilitySets", "Microsoft.Network/networkInterfaces",
        "Microsoft.Compute/virtualMachines",
    }
    for resource in data["resources"]:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", resource["apiVersion"]), resource["type"]
        assert resource["location"] == "[parameters('location')]"


def test_the_template_uses_only_functions_the_evaluator_knows(data: dict[str, Any]) -> None:
    used = {call.name for _, call in _calls(data)}
    assert used <= Template.FUNCTIONS, used - Template.FUNCTIONS
    # every expression parses, and variables() and parameters() are always given a literal name
    for where, call in _calls(data):
        if call.name in ("parameters", "variables"):
            assert len(call.args) == 1 and isinstance(call.args[0], Lit), where


def test_every_parameter_and_variable_is_defined_and_used(data: dict[str, Any]) -> None:
    referenced: dict[str, set[str]] = {"parameters": set(), "variables": set()}
    for _, call in _calls(data):
        if call.name in referenced:
            referenced[call.name].add(str(call.args[0].value))  # type: ignore[union-attr]
    assert referenced["parameters"] == set(data["parameters"])
    assert referenced["variables"] == set(data["variables"])


def test_copy_index_is_used_only_inside_copy_loops(data: dict[str, Any]) -> None:
    outside = [resource for resource in data["resources"] if "copy" not in resource]
    outputs = [output for output in data["outputs"].values() if "copy" not in output]
    for value in [data["variables"], data["parameters"], *outside, *outputs]:
        assert not [where for where, call in _calls(value) if call.name == "copyindex"]
    assert [where for where, call in _calls(data) if call.name == "copyindex"]


# children named by resourceId() that live in a property of their parent resource
CHILD_PROPERTIES = {
    "Microsoft.Network/virtualNetworks/subnets": "subnets",
    "Microsoft.Network/loadBalancers/frontendIPConfigurations": "frontendIPConfigurations",
    "Microsoft.Network/loadBalancers/backendAddressPools": "backendAddressPools",
    "Microsoft.Network/loadBalancers/probes": "probes",
}
SCENARIOS = [{}, {"loadBalancerType": "Internal", "appVmCount": 5}]


def _ids(value: Any) -> Iterator[ResourceId]:
    if isinstance(value, ResourceId):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _ids(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _ids(item)


@pytest.mark.parametrize("parameters", SCENARIOS)
def test_every_resource_id_and_dependency_resolves(data: dict[str, Any], parameters: dict[str, Any],
                                                   ssh_key: dict[str, str]) -> None:
    template = Template(data, {**ssh_key, **parameters})
    deployed: dict[tuple[str, str], dict[str, Any]] = {}
    skipped: set[tuple[str, str]] = set()  # condition false: not deployed, and dropped from dependsOn by ARM
    for resource in data["resources"]:
        for _, instance in template.instances(resource):
            key = (instance["type"], instance["name"])
            assert key not in deployed and key not in skipped, f"two resources {key}"
            if instance.get("condition", True):
                deployed[key] = instance
            else:
                skipped.add(key)

    def exists(ref: ResourceId) -> bool:
        if ref.type in CHILD_PROPERTIES:
            parent_type = ref.type.rpartition("/")[0]
            parent = deployed.get((parent_type, ref.names[0]))
            return parent is not None and len(ref.names) == 2 and ref.names[1] in {
                child["name"] for child in parent["properties"][CHILD_PROPERTIES[ref.type]]}
        return len(ref.names) == 1 and (ref.type, ref.names[0]) in deployed

    checked = 0
    for (type_, name), instance in deployed.items():
        for ref in _ids({key: value for key, value in instance.items() if key != "dependsOn"}):
            assert exists(ref), f"{type_} {name} names {ref}, which the template does not create"
            checked += 1
        for dependency in instance.get("dependsOn", []):
            assert isinstance(dependency, ResourceId), f"{name}: dependsOn {dependency!r} is not a resourceId()"
            assert exists(dependency) or (dependency.type, *dependency.names) in skipped, \
                f"{name} depends on {dependency}, which the template does not create"
            assert dependency.type not in CHILD_PROPERTIES
    assert checked > 20
    assert len(skipped) == (template.parameters["loadBalancerType"] == "Internal")  # the frontend's public IP
    # each VM waits for its NIC and its availability set, each NIC for the network (and the LB for app NICs)
    for vm in template.resources("Microsoft.Compute/virtualMachines"):
        nic = vm["properties"]["networkProfile"]["networkInterfaces"][0]["id"]
        assert nic in vm["dependsOn"] and vm["properties"]["availabilitySet"]["id"] in vm["dependsOn"]
    app_vms = [vm for vm in template.resources("Microsoft.Compute/virtualMachines") if vm["tags"]["role"] == "app"]
    assert len(app_vms) == template.parameters["appVmCount"]


@pytest.fixture
def ssh_key() -> dict[str, str]:
    return {"sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKeyForTheTemplateTestOnly admin"}


# --- parameters -------------------------------------------------------------------------------------------


PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "securestring": str, "int": int, "bool": bool, "array": list, "object": dict,
    "secureobject": dict,
}


def _fits(value: Any, kind: str) -> bool:
    return isinstance(value, PYTHON_TYPES[kind]) and not (kind == "int" and isinstance(value, bool))


def test_parameters_are_consistent(data: dict[str, Any]) -> None:
    for name, spec in data["parameters"].items():
        kind = spec["type"].lower()
        assert kind in PYTHON_TYPES, name
        assert spec["metadata"]["description"], name
        default = spec.get("defaultValue")
        if isinstance(default, str) and expression(default) is not None:
            assert kind == "string", name  # the location's resourceGroup().location
            continue
        values: list[Any] = [default] if "defaultValue" in spec else []
        values += spec.get("allowedValues", [])
        for value in values:
            assert _fits(value, kind), name
            if "minValue" in spec:
                assert value >= spec["minValue"], name
            if "maxValue" in spec:
                assert value <= spec["maxValue"], name
            if "minLength" in spec and kind != "securestring":
                assert len(value) >= spec["minLength"], name
            if "maxLength" in spec:
                assert len(value) <= spec["maxLength"], name
        if "allowedValues" in spec and "defaultValue" in spec:
            assert default in spec["allowedValues"], name
        if "minValue" in spec and "maxValue" in spec:
            assert spec["minValue"] <= spec["maxValue"], name
        assert not ({"minValue", "maxValue"} & set(spec)) or kind == "int", name
    # what each deployment must give: the SSH key only
    assert [name for name, spec in data["parameters"].items() if "defaultValue" not in spec] == ["sshPublicKey"]


def test_no_secret_has_a_default_or_leaves_the_deployment(data: dict[str, Any]) -> None:
    secure = {name for name, spec in data["parameters"].items() if spec["type"].lower().startswith("secure")}
    assert secure == {"zookeeperPassword"}
    for name in secure:
        # empty means "no ZooKeeper authentication"; no password is ever a default
        assert data["parameters"][name].get("defaultValue", "") == "", name
    for where, call in _calls(data["outputs"]):
        assert not (call.name == "parameters" and call.args[0] in {Lit(name) for name in secure}), where
    # the password reaches the VMs only through customData (never returned by Azure's API), base64-encoded
    for where, call in _calls(data):
        if call.name == "parameters" and call.args == (Lit("zookeeperPassword"),):
            assert where in {".variables.zookeeperAuth", ".variables.appCloudConfig"}, where


# --- what the application VMs run -------------------------------------------------------------------------


def _cloud_config(custom_data: str) -> dict[str, Any]:
    text = base64.b64decode(custom_data).decode()
    assert text.startswith("#cloud-config\n")
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def _files(cloud_config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    files = {}
    for entry in cloud_config["write_files"]:
        content = entry["content"]
        if entry.get("encoding") == "b64":
            content = base64.b64decode(content).decode()
        files[entry["path"]] = {**entry, "content": content}
    return files


def _app_cloud_config(template: Template) -> dict[str, Any]:
    custom_data = {vm["properties"]["osProfile"]["customData"]
                   for vm in template.resources("Microsoft.Compute/virtualMachines") if vm["tags"]["role"] == "app"}
    assert len(custom_data) == 1, "every application VM gets the same configuration (vm_name comes from IMDS)"
    return _cloud_config(custom_data.pop())


def _agent_settings(files: Mapping[str, Mapping[str, Any]], tmp_path: Path) -> Settings:
    """The agent's configuration as written to the VM, loaded by the agent; a password file it names is
    written to ``tmp_path`` with the content cloud-init would give it."""
    text = files[AGENT_CONFIG]["content"]
    if PASSWORD_FILE in files:
        secret = tmp_path / "zookeeper-password"
        secret.write_text(files[PASSWORD_FILE]["content"])
        text = text.replace(PASSWORD_FILE, str(secret))
    path = tmp_path / "coordinator.yaml"
    path.write_text(text)
    return load_settings(path, environ={})


PROBES = [
    {},  # Azure's defaults: 15 s x 2
    {"probePort": 9000, "probePath": "/ready", "probeIntervalSeconds": 5, "probeThreshold": 3,
     "loadBalancerType": "Internal"},
]


@pytest.mark.parametrize("parameters", PROBES)
def test_the_load_balancer_probes_what_the_agent_serves(data: dict[str, Any], parameters: dict[str, Any],
                                                        ssh_key: dict[str, str], tmp_path: Path) -> None:
    template = Template(data, {**ssh_key, **parameters})
    [lb] = template.resources("Microsoft.Network/loadBalancers")
    assert lb["sku"]["name"] == "Standard"
    [probe] = lb["properties"]["probes"]
    [rule] = lb["properties"]["loadBalancingRules"]
    assert rule["properties"]["probe"]["id"] == ResourceId("Microsoft.Network/loadBalancers/probes",
                                                           (lb["name"], probe["name"]))
    settings = _agent_settings(_files(_app_cloud_config(template)), tmp_path)
    assert probe["properties"]["protocol"] == "Http"
    assert probe["properties"]["port"] == int(settings.probe.listen.rpartition(":")[2])
    assert probe["properties"]["requestPath"] == settings.probe.path
    assert probe["properties"]["intervalInSeconds"] == settings.drain.probe_interval_seconds
    assert probe["properties"]["probeThreshold"] == probe["properties"]["numberOfProbes"]
    assert probe["properties"]["probeThreshold"] == settings.drain.probe_threshold
    assert settings.probe.listen.startswith("0.0.0.0:")  # the load balancer and the peers reach it
    if not parameters:
        assert (probe["properties"]["port"], probe["properties"]["requestPath"]) == (8090, "/health")
        assert (probe["properties"]["intervalInSeconds"], probe["properties"]["probeThreshold"]) == (15, 2)
        assert settings.drain.effective_wait == 35  # 15 s x 2 + the agent's 5 s grace
    # the drain wait follows the template's probe parameters: interval x threshold + grace
    given = template.parameters
    assert settings.drain.effective_wait == (given["probeIntervalSeconds"] * given["probeThreshold"]
                                             + settings.drain.grace_seconds)
    frontend = lb["properties"]["frontendIPConfigurations"][0]["properties"]
    if template.parameters["loadBalancerType"] == "Public":
        assert set(frontend) == {"publicIPAddress"}
    else:
        assert frontend["subnet"]["id"].names[1] == template.variable("appSubnetName")


def _script_value(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", INSTALL.read_text(), re.M)
    assert match is not None, name
    return re.sub(r"\$(\w+)", lambda m: _script_value(m.group(1)), match.group(1))


def test_the_agent_is_installed_as_install_sh_installs_it(data: dict[str, Any], ssh_key: dict[str, str],
                                                          tmp_path: Path) -> None:
    template = Template(data, {**ssh_key, "packageSpec": "azure-maintenance-coordinator==0.1.0"})
    cloud_config = _app_cloud_config(template)
    files = _files(cloud_config)
    assert set(files) == {AGENT_CONFIG, REQUIREMENTS, _script_value("UNIT")}
    assert _script_value("CONFIG") == AGENT_CONFIG
    # the unit is embedded as it is shipped
    assert files[_script_value("UNIT")]["content"] == UNIT.read_text()
    assert files[AGENT_CONFIG]["permissions"] == "0640"
    assert files[REQUIREMENTS]["content"] == "azure-maintenance-coordinator==0.1.0"
    assert {"python3", "python3-venv"} <= set(cloud_config["packages"])

    commands = [command if isinstance(command, list) else shlex.split(command) for command in cloud_config["runcmd"]]
    # the user exactly as install.sh creates it
    line = next(line for line in INSTALL.read_text().splitlines() if "run useradd" in line)
    useradd = [_script_value(m.group(1)) if (m := re.fullmatch(r'"\$(\w+)"', word)) else word
               for word in shlex.split(line.strip(), posix=False)[1:]]
    assert commands[0] == useradd
    assert ["chgrp", _script_value("USER_NAME"), AGENT_CONFIG] in commands
    venv = _script_value("VENV")
    assert ["python3", "-m", "venv", venv] in commands
    pip = next(command for command in commands if command[0] == f"{venv}/bin/pip")
    assert pip[1] == "install" and pip[-2:] == ["--requirement", REQUIREMENTS]
    # started only once the installed agent accepts the configuration written
    assert commands[-1][:2] == ["sh", "-c"]
    check, _, start = commands[-1][2].partition(" && ")
    assert shlex.split(check) == [f"{venv}/bin/coordinator", "check-config", "--config", AGENT_CONFIG]
    assert start == "systemctl enable --now coordinator.service"
    assert commands.index(pip) < commands.index(["systemctl", "daemon-reload"]) < len(commands) - 1

    settings = _agent_settings(files, tmp_path)
    assert settings.cluster == template.parameters["clusterName"]
    assert settings.zookeeper.auth is None  # no password given
    assert settings.http.listen == "127.0.0.1:9110"


def test_zookeeper_authentication_comes_from_the_secure_parameter(data: dict[str, Any], ssh_key: dict[str, str],
                                                                  tmp_path: Path) -> None:
    password = "correct horse: battery 'staple'"
    template = Template(data, {**ssh_key, "zookeeperPassword": password, "zookeeperAuthUsername": "agents"})
    cloud_config = _app_cloud_config(template)
    files = _files(cloud_config)
    assert files[PASSWORD_FILE]["content"] == password
    assert files[PASSWORD_FILE]["permissions"] == "0640"
    assert ["chgrp", "coordinator", PASSWORD_FILE] in cloud_config["runcmd"]
    assert password not in files[AGENT_CONFIG]["content"]
    settings = _agent_settings(files, tmp_path)
    assert settings.zookeeper.auth is not None
    assert settings.zookeeper.auth.username == "agents"
    assert settings.zookeeper.auth.credential == f"agents:{password}"
    assert yaml.safe_load(files[AGENT_CONFIG]["content"])["zookeeper"]["auth"]["password_file"] == PASSWORD_FILE
    # without a password, neither the file nor anything about it
    plain = _app_cloud_config(Template(data, ssh_key))
    assert PASSWORD_FILE not in json.dumps(plain)


# --- the ZooKeeper ensemble -------------------------------------------------------------------------------


@pytest.mark.parametrize("parameters", [{}, {"zookeeperPrivateIps": ["10.0.2.10", "10.0.2.20", "10.0.2.30"],
                                             "zookeeperClientPort": 2281}])
def test_the_ensemble_and_the_agents_agree(data: dict[str, Any], parameters: dict[str, Any],
                                           ssh_key: dict[str, str], tmp_path: Path) -> None:
    template = Template(data, {**ssh_key, **parameters})
    ips, port = template.parameters["zookeeperPrivateIps"], template.parameters["zookeeperClientPort"]
    nics = {nic["name"]: nic for nic in template.resources("Microsoft.Network/networkInterfaces")}
    servers = [vm for vm in template.resources("Microsoft.Compute/virtualMachines")
               if vm["tags"]["role"] == "zookeeper"]
    assert len(servers) == 3
    for number, vm in enumerate(servers, start=1):
        nic = nics[vm["properties"]["networkProfile"]["networkInterfaces"][0]["id"].names[0]]
        ip_config = nic["properties"]["ipConfigurations"][0]["properties"]
        assert ip_config["privateIPAllocationMethod"] == "Static"
        assert ip_config["privateIPAddress"] == ips[number - 1]
        assert ip_config["subnet"]["id"].names[1] == template.variable("zookeeperSubnetName")
        cloud_config = _cloud_config(vm["properties"]["osProfile"]["customData"])
        assert "zookeeperd" in cloud_config["packages"]
        files = _files(cloud_config)
        assert all(entry.get("defer") for entry in files.values())  # after the package made /etc/zookeeper/conf
        assert files["/etc/zookeeper/conf/myid"]["content"] == f"{number}\n"
        zoo_cfg = dict(line.split("=", 1) for line in files["/etc/zookeeper/conf/zoo.cfg"]["content"].splitlines()
                       if line and not line.startswith("#"))
        assert zoo_cfg["clientPort"] == str(port)
        assert {key: value for key, value in zoo_cfg.items() if key.startswith("server.")} == {
            f"server.{n}": f"{ip}:2888:3888" for n, ip in enumerate(ips, start=1)}
        assert zoo_cfg["dataDir"] == "/var/lib/zookeeper"  # where the package links myid
    hosts = template.variable("zookeeperHosts")
    assert hosts == ",".join(f"{ip}:{port}" for ip in ips)
    assert template.resolve(data["outputs"]["zookeeperHosts"]["value"]) == hosts
    assert _agent_settings(_files(_app_cloud_config(template)), tmp_path).zookeeper.hosts == hosts


# --- the network ------------------------------------------------------------------------------------------


def _inbound(nsg: Mapping[str, Any]) -> list[dict[str, Any]]:
    rules = []
    for rule in nsg["properties"]["securityRules"]:
        properties = rule["properties"]
        assert properties["direction"] == "Inbound"
        ports = properties.get("destinationPortRanges") or [properties["destinationPortRange"]]
        rules.append({"name": rule["name"], "access": properties["access"], "priority": properties["priority"],
                      "source": properties["sourceAddressPrefix"], "ports": set(ports)})
    return rules


@pytest.mark.parametrize("lb_type", ["Public", "Internal"])
def test_the_network_rules_let_in_only_what_the_group_needs(data: dict[str, Any], lb_type: str,
                                                            ssh_key: dict[str, str]) -> None:
    template = Template(data, {**ssh_key, "loadBalancerType": lb_type})
    p = template.parameters
    probe, app, client = str(p["probePort"]), str(p["backendPort"]), str(p["zookeeperClientPort"])
    clients = p["clientAddressPrefix"] if lb_type == "Public" else "VirtualNetwork"
    app_nsg = template.resource("Microsoft.Network/networkSecurityGroups", template.variable("appNsgName"))
    zk_nsg = template.resource("Microsoft.Network/networkSecurityGroups", template.variable("zookeeperNsgName"))
    expected = {
        app_nsg["name"]: {("AzureLoadBalancer", probe), (p["appSubnetPrefix"], probe), (clients, app)},
        zk_nsg["name"]: {(p["appSubnetPrefix"], client), (p["zookeeperSubnetPrefix"], "2888"),
                         (p["zookeeperSubnetPrefix"], "3888")},
    }
    for nsg in (app_nsg, zk_nsg):
        rules = _inbound(nsg)
        allowed = {(rule["source"], port) for rule in rules if rule["access"] == "Allow" for port in rule["ports"]}
        assert allowed == expected[nsg["name"]]
        # a deny-all after every allow: Azure's default rules would otherwise let the whole virtual network and
        # the load balancer's address in, on every port
        [deny] = [rule for rule in rules if rule["access"] == "Deny"]
        assert (deny["source"], deny["ports"]) == ("*", {"*"})
        assert deny["priority"] > max(rule["priority"] for rule in rules if rule["access"] == "Allow")
        assert deny["priority"] < 65000  # before AllowVnetInBound
    # the probe port: from the load balancer and the peers, nothing broader than the virtual network
    probe_sources = {source for source, port in expected[app_nsg["name"]] if port == probe}
    assert probe_sources == {"AzureLoadBalancer", p["appSubnetPrefix"]}
    # each subnet is bound to its rules and leaves through the NAT gateway; no VM has a public address
    [vnet] = template.resources("Microsoft.Network/virtualNetworks")
    bound = {subnet["name"]: subnet["properties"]["networkSecurityGroup"]["id"].names[0]
             for subnet in vnet["properties"]["subnets"]}
    assert bound == {template.variable("appSubnetName"): app_nsg["name"],
                     template.variable("zookeeperSubnetName"): zk_nsg["name"]}
    for nic in template.resources("Microsoft.Network/networkInterfaces"):
        assert "publicIPAddress" not in nic["properties"]["ipConfigurations"][0]["properties"]


def test_the_vms_and_outputs(data: dict[str, Any], ssh_key: dict[str, str]) -> None:
    template = Template(data, {**ssh_key, "appVmCount": 4})
    vms = template.resources("Microsoft.Compute/virtualMachines")
    app = [vm for vm in vms if vm["tags"]["role"] == "app"]
    for vm in vms:
        linux = vm["properties"]["osProfile"]["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True
        assert linux["ssh"]["publicKeys"][0]["keyData"] == ssh_key["sshPublicKey"]
        assert vm["properties"]["storageProfile"]["imageReference"]["publisher"] in {"Debian", "Canonical"}
    assert {vm["properties"]["availabilitySet"]["id"].names[0] for vm in app} == {
        template.variable("appAvailabilitySetName")}
    [app_set] = [s for s in template.resources("Microsoft.Compute/availabilitySets")
                 if s["name"] == template.variable("appAvailabilitySetName")]
    assert app_set["properties"]["platformFaultDomainCount"] == template.parameters["platformFaultDomainCount"]
    assert app_set["properties"]["platformUpdateDomainCount"] == template.parameters["platformUpdateDomainCount"]
    # What the agents need of the platform: user reboots and redeploys wait for their approval, and an event
    # while every instance is down (no agent left to approve) starts at once (doctor's azure-approve).
    assert app_set["properties"]["scheduledEventsPolicy"] == {
        "userInitiatedReboot": {"automaticallyApprove": False},
        "userInitiatedRedeploy": {"automaticallyApprove": False},
        "allInstancesDown": {"automaticallyApprove": True}}
    assert app_set["apiVersion"] >= "2025-04-01"  # the first Compute api-version with every field of the policy
    outputs = data["outputs"]
    assert set(outputs) == {"loadBalancerFrontend", "loadBalancerFrontendPort", "appVmNames", "zookeeperVmNames",
                            "zookeeperHosts"}
    names = [template.resolve(outputs["appVmNames"]["copy"]["input"], i)
             for i in range(template.resolve(outputs["appVmNames"]["copy"]["count"]))]
    assert names == [vm["name"] for vm in app]
    zk_names = [template.resolve(outputs["zookeeperVmNames"]["copy"]["input"], i)
                for i in range(outputs["zookeeperVmNames"]["copy"]["count"])]
    assert zk_names == [vm["name"] for vm in vms if vm["tags"]["role"] == "zookeeper"]
    with pytest.raises(NotEvaluated):  # the frontend's address is known only once deployed
        template.resolve(outputs["loadBalancerFrontend"]["value"])


def test_the_documentation_names_the_template_parameters(data: dict[str, Any]) -> None:
    doc = (ROOT / "docs" / "deployment-azure.md").read_text()
    given: set[str] = set()
    for command in re.findall(r"az deployment group create(?:[^\n]*\\\n)*[^\n]*", doc):
        given |= set(re.findall(r"(?:^|\s)(\w+)=", command.split("--parameters", 1)[1]))
    assert given and given <= set(data["parameters"]), given - set(data["parameters"])
    assert not [name for name in data["parameters"] if f"`{name}`" not in doc]
