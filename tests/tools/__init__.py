"""Tools of the test suite that are not tests: the HTTP fuzzer of the agent's listeners (``httpfuzz``) and the
local Prometheus and Alertmanager the alert rules are delivered through (``monitoring``)."""
