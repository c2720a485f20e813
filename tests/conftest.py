"""Shared fixtures. Each real component has its own plugin module; they are loaded here."""

pytest_plugins = [
    "tests.plugins.zookeeper",
    "tests.plugins.simulator",
    "tests.plugins.haproxy",
]
