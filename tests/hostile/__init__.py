"""Hostile input at the product's real edges: the IMDS document over HTTP and the nodes of ZooKeeper.

Shared by the tests (``tests/integration/test_hostile_*.py``, few examples, derandomized) and by
``scripts/hostile.py`` (many examples, counted): ``inputs`` generates the inputs, ``imds_bench`` and
``zk_bench`` feed them to the real code and judge what it did.
"""
