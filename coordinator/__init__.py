"""Coordinated drain and approval of Azure Scheduled Events across a group of VMs."""

__version__ = "0.1.0"
__all__ = ["__version__"]
