"""The local launchers that the demo, the tests and the benchmarks use to run real ZooKeeper, HAProxy,
app servers, the simulator and agents on loopback.

Not part of the agent running on a VM: the agent never imports this package; only the ``coordinator demo``
command does.
"""

__all__: list[str] = []
