"""The documents cite tests and files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


def test_every_test_cited_by_the_simulator_doc_exists() -> None:
    cited = set(re.findall(r"\b(test_\w+)\b", (ROOT / "docs/simulator.md").read_text()))
    modules = {path.stem for path in (ROOT / "tests").rglob("test_*.py")}
    assert len(cited) > 50
    missing = sorted(cited - _defined_tests() - modules)
    assert missing == [], f"docs/simulator.md cites tests that do not exist: {missing}"


def test_every_path_cited_by_the_docs_exists() -> None:
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for path in re.findall(r"`((?:coordinator|tests|docs|deploy|bench|scripts)/[\w./-]+\.(?:py|md|yaml|json))`",
                               doc.read_text()):
            assert (ROOT / path).exists(), f"{doc.name} cites {path}, which does not exist"


def test_every_test_cited_by_the_safety_doc_exists() -> None:
    cited = set(re.findall(r"`(test_\w+)`", (ROOT / "docs/safety.md").read_text()))
    assert len(cited) > 10
    missing = sorted(cited - _defined_tests())
    assert missing == [], f"docs/safety.md cites tests that do not exist: {missing}"


def test_every_metric_is_documented_and_every_documented_metric_exists() -> None:
    from prometheus_client import CollectorRegistry

    from coordinator.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    served = {f"{family.name}_total" if family.type == "counter" else family.name for family in registry.collect()}
    documented = set(re.findall(r"^\| `(coordinator_\w+)`", (ROOT / "docs/metrics.md").read_text(), re.M))
    assert sorted(served - documented) == [], "served but not in docs/metrics.md"
    assert sorted(documented - served) == [], "in docs/metrics.md but not served"


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_every_doc_is_listed_in_the_readme() -> None:
    listed = _readme_section("Documentation")
    missing = sorted(p.name for p in (ROOT / "docs").glob("*.md") if f"`docs/{p.name}`" not in listed)
    assert missing == [], f"docs not in the README's Documentation list: {missing}"


def test_every_deploy_directory_is_in_the_readme_layout() -> None:
    layout = _readme_section("Layout")
    missing = sorted(p.name for p in (ROOT / "deploy").iterdir() if p.is_dir() and f"{p.name}/" not in layout)
    assert missing == [], f"deploy/ directories not in the README's Layout: {missing}"


def test_the_docs_use_the_installers_configuration_path() -> None:
    installer = (ROOT / "deploy/systemd/install.sh").read_text()
    config_dir = re.search(r"^CONFIG_DIR=(\S+)$", installer, re.M)
    config = re.search(r"^CONFIG=\$CONFIG_DIR(/\S+)$", installer, re.M)
    assert config_dir and config
    path = config_dir.group(1) + config.group(1)
    assert path == "/etc/coordinator/coordinator.yaml"
    assert f"--config {path}" in _readme_section("Running it on VMs")
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        others = set(re.findall(r"/etc/coordinator[\w./-]*\.ya?ml", doc.read_text())) - {path}
        assert not others, f"{doc.name} names {sorted(others)}, not the installer's {path}"


def test_the_readme_names_everything_setup_installs() -> None:
    setup = (ROOT / "scripts/setup.sh").read_text()
    packages = set(re.findall(r"need_apt\+=\(([\w.-]+)\)", setup))
    assert {"zookeeper", "haproxy", "prometheus", "prometheus-alertmanager"} <= packages
    said = _readme_section("Two commands: the local group, and the tests")
    missing = sorted(p for p in packages if p not in said)
    assert missing == [], f"scripts/setup.sh installs {missing}, which the README does not say"
    assert "compose" in said and ".venv" in said


def test_the_readme_shows_the_operators_path_before_the_development_commands() -> None:
    text = (ROOT / "README.md").read_text()
    operator = text.index("## Running it on VMs")
    assert operator < text.index("## Two commands")
    section = _readme_section("Running it on VMs")
    for step in ("pip install", "check-config", "coordinator run", "coordinator status"):
        assert step in section, step
    assert "venv" in section and "pipx" in section  # a bare pip install meets PEP 668 on Debian 12


@pytest.mark.parametrize("package", ["coordinator", "sim/azuresim"])
def test_every_module_of_the_package_is_in_the_architecture_table(package: str) -> None:
    table = (ROOT / "docs" / "architecture.md").read_text()
    if package != "coordinator":
        table = table[table.index("## The simulator's package"):]
    path = ROOT / package
    modules = {p.name for p in path.glob("*.py") if not p.name.startswith("__")}
    modules |= {f"{p.name}/" for p in path.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(name for name in modules if f"`{name}`" not in table)
    assert not missing, f"docs/architecture.md does not say what these are for: {missing}"


def test_every_function_the_safety_doc_names_exists() -> None:
    import importlib

    text = (ROOT / "docs" / "safety.md").read_text()
    table = text[text.index("| invariant | the pure functions that keep it |"):text.index("Words used below")]
    names = re.findall(r"`(\w+)\.(\w+)(?:\.(\w+))?`", table)
    assert len(names) >= 20
    missing = []
    for first, second, third in names:
        # `module.function`, `module.Class.member`, or `Class.member` of the snapshot module
        if first.islower():
            owner: object = importlib.import_module(f"coordinator.{first}")
            path = [second, third] if third else [second]
        else:
            owner, path = importlib.import_module("coordinator.snapshot"), [first, second]
        *outer, last = path
        for part in outer:
            owner = getattr(owner, part, None)
        if owner is None or not (hasattr(owner, last) or last in getattr(owner, "__dataclass_fields__", {})):
            missing.append(".".join(p for p in (first, second, third) if p))
    assert not missing, f"docs/safety.md names what the code does not have: {missing}"


def test_the_architecture_layout_table_lists_the_layouts_nodes() -> None:
    """docs/architecture.md's "ZooKeeper layout" table is the layout of ``coordinator.store.zk_paths.NODES``:
    the same nodes, in the same order, each with its lifetime, its writers (the ACL) and its readers."""
    from coordinator.store.base import Part
    from coordinator.store.zk_paths import NODES

    readers = {Part.OWN: "every agent", Part.NAMED: "every VM an event names, the leader",
               Part.LEAD: "the leader, an approver", Part.WHOLE: "an approver", None: "no agent"}
    writers = {"agents": "agents", "operators": "agents, operators"}

    def words(node: object) -> tuple[str, str, str, str]:
        assert isinstance(node, type(NODES[0]))
        read = readers[node.read_from] + (f"; its own: {readers[node.own_from]}" if node.own_from else "")
        return node.path, node.lifetime, writers[node.writers], read

    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## ZooKeeper layout", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:5] for line in section.splitlines() if line.startswith("| `/")]
    table = [(path.strip().strip("`"), kind.strip().split(",")[0], acl.strip(), read.strip())
             for path, kind, acl, read in rows]
    assert table == [words(node) for node in NODES]
