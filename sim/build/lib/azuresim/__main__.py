"""``azure-sim`` and ``python -m azuresim``: the IMDS simulator, same options as ``coordinator imds-sim``."""

import argparse

from azuresim.cli import add_arguments, run


def main(prog: str = "azure-sim") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Simulated Azure IMDS Scheduled Events for a group of VMs, one port per VM.",
    )
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main("python -m azuresim"))
