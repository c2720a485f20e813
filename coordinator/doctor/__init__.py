"""``coordinator doctor``: checks, run on a VM with its agent's configuration, of what breaks coordination in
production (IMDS and its clock, ZooKeeper and its ACLs, the probe as peers reach it, the session timeout
against notices and drain waits, the group's members). ``checks`` and ``azure`` observe, on the shared
``context``; ``verdicts`` judges (pure functions, in ``outcome`` and the ``verdicts_*`` modules); ``command``
runs and prints; ``options`` holds the command line, imported on its own."""
