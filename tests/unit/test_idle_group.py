"""What an idle group asks of its peers: nothing beyond its own polls. The leader probes its peers only
while an event is known, and the VMs an event names while it names them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordinator.snapshot import PeerSeen
from tests.unit.test_safety_regressions import Bench, E


class RecordingPeers:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.wanted: dict[str, bool] = {}

    def seen(self) -> dict[str, PeerSeen]:
        return {name: PeerSeen(vm.probe.serving, self.bench.clock.mono, "serving")
                for name, vm in self.bench.vms.items()}

    def confirm(self) -> dict[str, PeerSeen]:
        return self.seen()

    def follow(self, store: Any, members: Any, me: str, wanted: bool) -> None:
        self.wanted[me] = wanted


def test_peers_are_probed_only_while_an_event_is_known(tmp_path: Path) -> None:
    bench = Bench(tmp_path)
    peers = RecordingPeers(bench)
    bench.peers = peers  # type: ignore[assignment]
    for name in ("vm0", "vm1", "vm2"):
        bench.add(name)
    bench.run(5)
    assert peers.wanted == {"vm0": False, "vm1": False, "vm2": False}  # idle: nobody probes
    bench.group.schedule(E, ["vm1"], in_s=100)
    bench.step()
    assert peers.wanted == {"vm0": True, "vm1": True, "vm2": False}  # the leader, and the VM named
    bench.run(60, until=lambda: bool(bench.group.approved(E)))
    assert bench.group.approved(E)
    bench.group.remove(E)  # the maintenance is over
    bench.run(10)
    assert peers.wanted == {"vm0": False, "vm1": False, "vm2": False}  # idle again once it is gone
