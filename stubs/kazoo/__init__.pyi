# Minimal type stubs for the parts of kazoo 2.x that coordinator uses. Extend as needed.
