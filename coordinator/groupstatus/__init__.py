"""``coordinator status`` for the whole group: read ZooKeeper (read-only) and the agents' ``/status``
(``read``), work out approvers, blockers and what looks stuck into one model (``analyse``, ``model``),
show it (``render``) or dump it as JSON; ``command`` is the command line."""
