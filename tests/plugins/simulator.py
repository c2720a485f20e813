"""IMDS simulator fixtures."""
