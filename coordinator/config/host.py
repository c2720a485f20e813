"""What this machine must allow beside a valid file: the state file and its directory writable by the
agent's user.
"""

from __future__ import annotations

import os

from coordinator.config.settings import Settings

__all__ = ["host_problems"]


def host_problems(settings: Settings, *, at_start: bool) -> tuple[list[str], list[str]]:
    """What this machine would refuse the agent that the file alone cannot tell, as (errors, warnings): the
    state file must be writable, with its directory (it is replaced atomically), or every cycle would fail
    to save it. A directory still missing is created by the agent (or by systemd's StateDirectory before
    it starts): ``check-config`` (``at_start`` False), perhaps run by another user, only warns when this
    user could not create it; the agent itself (``at_start`` True) refuses to start."""
    path = settings.state_file
    if path is None:
        return [], []
    as_user = f" (checked as user {_user_name()})"
    if path.is_dir():
        return [f"state_file: {path} is a directory; name a file in it"], []
    if path.exists() and not os.access(path, os.W_OK):
        return [f"state_file: cannot write {path}: permission denied{as_user}"], []
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return [f"state_file: cannot create {path}: {ancestor} is not a directory"], []
    if os.access(ancestor, os.W_OK | os.X_OK):
        return [], []
    if ancestor == path.parent:
        return [f"state_file: cannot write files in {ancestor}: permission denied{as_user}"], []
    message = f"state_file: cannot create {path.parent} in {ancestor}: permission denied{as_user}"
    if at_start:
        return [message], []
    return [], [message + "; fine if the agent runs as another user or systemd creates it (StateDirectory)"]


def _user_name() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "?"
