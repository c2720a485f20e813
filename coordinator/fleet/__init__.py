"""``coordinator fleet``: every pending Scheduled Event of one or more subscriptions, from Azure Resource
Graph, joined with the coordinated groups of a ZooKeeper root (who holds each event, and why), and the
events no agent coordinates. See ``docs/fleet.md``.

Layout: ``options`` (the command line, light), ``model`` (the JSON model), ``join`` (Resource Graph events
and group statuses to the model, pure), ``read`` (the groups, read-only, from ZooKeeper), ``render`` (the
text) and ``command`` (the command, once or ``--watch``)."""
