"""ZooKeeper fixtures (see coordinator.localzk)."""
