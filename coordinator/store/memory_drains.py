"""Drains by hand in the in-memory store, as the ZooKeeper store keeps them (``coordinator.store.zk_drains``):
an operator's drain per VM, numbered as ZooKeeper numbers a node's creation, and the leader's admissions,
each naming the drain it admits. Not locked by itself: ``MemoryCluster`` calls it holding its lock."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from coordinator.names import normalize_vm_name
from coordinator.store.base import HandDrain, WriteResult

__all__ = ["HandDrains"]


@dataclass
class HandDrains:
    drains: dict[str, HandDrain] = field(default_factory=dict)  # ``/drains/{vm}``
    admitted: dict[str, tuple[str, float, int]] = field(default_factory=dict)  # vm -> (by, at, the drain admitted)
    asked: int = 0  # the "creation zxid" of the last drain asked for

    def ask(self, vm: str, reason: str, by: str, at: float) -> None:
        """``coordinator drain VM``: a drain already asked for is kept as it is."""
        vm = normalize_vm_name(vm)
        if vm not in self.drains:
            self.asked += 1
            self.drains[vm] = HandDrain(reason=reason, by=by, at=at, asked=self.asked)

    def undo(self, vm: str) -> None:
        """``coordinator undrain VM``: the drain goes, its admission stays until the leader forgets it."""
        self.drains.pop(normalize_vm_name(vm), None)

    def view(self) -> tuple[dict[str, HandDrain], frozenset[str]]:
        """The drains, each with its admission if one admits it, and the VMs whose admission admits none."""
        found: dict[str, HandDrain] = {}
        for vm, drain in self.drains.items():
            by, at, asked = self.admitted.get(vm, (None, None, None))
            found[vm] = replace(drain, admitted_by=by, admitted_at=at) if asked == drain.asked else drain
        stale = frozenset(vm for vm, (_, _, asked) in self.admitted.items()
                          if vm not in self.drains or self.drains[vm].asked != asked)
        return found, stale

    def admit(self, vm: str, asked: int, by: str, at: float) -> WriteResult:
        vm = normalize_vm_name(vm)
        drain = self.drains.get(vm)
        if drain is None or drain.asked != asked:
            return WriteResult.MISSING
        if self.admitted.get(vm, (None, None, None))[2] == asked:
            return WriteResult.EXISTS
        self.admitted[vm] = (normalize_vm_name(by), at, asked)
        return WriteResult.DONE

    def forget(self, vm: str) -> WriteResult:
        vm = normalize_vm_name(vm)
        admission = self.admitted.get(vm)
        if admission is None:
            return WriteResult.MISSING
        drain = self.drains.get(vm)
        if drain is not None and drain.asked == admission[2]:
            return WriteResult.EXISTS
        del self.admitted[vm]
        return WriteResult.DONE
