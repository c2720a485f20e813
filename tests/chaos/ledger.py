"""The long run's file: every run's JSON, what they add up to, and which code ran them.

A long run (200 runs, about three hours) is made in parts: ``--resume`` reads the file a previous part
wrote, plays only the seeds it does not hold, and writes the file again after each run. Parts may only
be joined when they ran the same code: ``code_identity`` is a digest of every source file of the
package (the agent and this harness alike), with the git commit beside it where there is one, and a
file made by other code, or with another configuration, is refused with what differs. Each part is
listed with its seeds, its commit and how long it took, so the page that reports the run can say what
was measured, and when.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import coordinator

__all__ = ["Ledger", "LedgerError", "code_identity"]

_PACKAGE = Path(coordinator.__file__).resolve().parent
_TOTALS = ("events", "approved_early", "started_at_not_before", "started_without_notice", "requests",
           "requests_failed", "requests_failed_without_notice", "requests_failed_other")


class LedgerError(Exception):
    """The file cannot be resumed: why, in one line."""


def code_identity(package: Path = _PACKAGE) -> dict[str, Any]:
    """The digest of the package's source (each ``.py`` file's path and bytes, in path order), and in a
    git checkout the commit and whether the package differs from it. Only the digest decides whether
    two parts ran the same code; the commit is for the reader."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    identity: dict[str, Any] = {"digest": digest.hexdigest()[:16], "commit": None, "uncommitted_changes": None}
    try:
        identity["commit"] = _git(package, "rev-parse", "HEAD") or None
        identity["uncommitted_changes"] = bool(_git(package, "status", "--porcelain", "--", "."))
    except (OSError, subprocess.SubprocessError):
        pass  # not a git checkout (an installed package): the digest alone
    return identity


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10,
                          check=True).stdout.strip()


@dataclass
class Ledger:
    """Every finished run's JSON (``RunResult.to_json``) with the configuration and code they ran on."""

    config: dict[str, Any]
    code: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def resume(cls, path: Path, config: Mapping[str, Any], code: Mapping[str, Any]) -> Ledger:
        """The ledger in ``path`` to go on with; a new one if there is no such file. Refused (``LedgerError``)
        when the file is not one this command wrote, or was made with another configuration or other code."""
        if not path.exists():
            return cls(dict(config), dict(code))
        try:
            body = json.loads(path.read_text())
            results, parts, old_config, old_code = body["results"], body.get("parts", []), body["config"], body["code"]
            if not (isinstance(results, list) and isinstance(parts, list) and isinstance(old_config, dict)
                    and isinstance(old_code, dict)):
                raise TypeError("results, parts, config or code of the wrong type")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"{path}: not a file of this command's runs ({type(exc).__name__}: {exc})") from exc
        differs = [f"{key} {old_config.get(key)!r} (now {value!r})" for key, value in config.items()
                   if old_config.get(key) != value]
        if differs:
            raise LedgerError(f"{path}: its runs used another configuration: {'; '.join(differs)}")
        if old_code.get("digest") != code.get("digest"):
            raise LedgerError(f"{path}: its runs ran other code (commit {old_code.get('commit') or 'unknown'}, "
                              f"source digest {old_code.get('digest')}; now {code.get('digest')}): "
                              "start a new file, or check out that code to go on")
        return cls(dict(old_config), dict(old_code), list(results), list(parts))

    def done(self) -> set[int]:
        """Seeds with a result (a run that could not be carried out included: it is reported, not retried)."""
        return {int(r["seed"]) for r in self.results}

    def start_part(self, code: Mapping[str, Any]) -> dict[str, Any]:
        """A new part of the run: it lists the first and last seed it played, as it plays them."""
        part: dict[str, Any] = {
            "seeds": [], "runs": 0, "commit": code.get("commit"),
            "uncommitted_changes": code.get("uncommitted_changes"),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "wall_seconds": 0.0, "interrupted": False,
        }
        self.parts.append(part)
        return part

    def add(self, result: Mapping[str, Any], part: dict[str, Any], wall_seconds: float) -> None:
        self.results.append(dict(result))
        self.results.sort(key=lambda r: int(r["seed"]))
        part["runs"] += 1
        seed = int(result["seed"])
        part["seeds"] = [min(part["seeds"][0], seed), max(part["seeds"][1], seed)] if part["seeds"] else [seed, seed]
        part["wall_seconds"] = round(wall_seconds, 1)

    def to_json(self) -> dict[str, Any]:
        totals: dict[str, int] = {}
        faults: dict[str, int] = {}
        ticks: dict[str, int] = {}
        layouts: dict[str, int] = {}
        violations = 0
        for result in self.results:
            if result.get("layout"):
                name = f"{result['layout']['name']}" + (" (told)" if result["layout"].get("told") else "")
                layouts[name] = layouts.get(name, 0) + 1
            for kind, n in (result.get("faults") or {}).items():
                faults[kind] = faults.get(kind, 0) + int(n)
            if result.get("tick_time_ms") is not None:
                tick = str(result["tick_time_ms"])
                ticks[tick] = ticks.get(tick, 0) + 1
            verdict = result.get("verdict")
            if verdict is None:
                continue
            violations += len(verdict.get("violations") or ())
            for key in _TOTALS:
                totals[key] = totals.get(key, 0) + int((verdict.get("stats") or {}).get(key, 0))
        return {
            "config": self.config,
            "code": self.code,
            "runs": len(self.results),
            "violations": violations,
            "runs_not_completed": sum(1 for r in self.results if r.get("error")),
            "wall_seconds": round(sum(float(p.get("wall_seconds") or 0) for p in self.parts), 1),
            "parts": self.parts,
            "totals": totals,
            "faults": dict(sorted(faults.items())),
            "runs_by_tick_time_ms": dict(sorted(ticks.items(), key=lambda kv: int(kv[0]))),
            "runs_by_layout": dict(sorted(layouts.items())),
            "results": self.results,
        }

    def write(self, path: Path) -> None:
        """Written whole to a file beside ``path`` and renamed over it: a part stopped mid-write leaves the
        previous file, never half of one, for the next part to resume."""
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(temporary, path)
