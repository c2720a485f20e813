"""``python -m coordinator.sim``: the IMDS simulator, same options as ``coordinator imds-sim``."""

import argparse

from coordinator.sim.cli import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coordinator.sim",
        description="Simulated Azure IMDS Scheduled Events for a group of VMs, one port per VM.",
    )
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
