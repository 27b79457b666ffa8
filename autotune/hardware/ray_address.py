"""Which Ray cluster a run (``--executor ray``) or ``autotune doctor`` connects to, decided before Ray's own
connection: Ray retries an address where nothing answers for minutes, silently.

Without an address (``--ray-address``, else RAY_ADDRESS), Ray connects to the cluster its address file names
(``ray_current_cluster`` in Ray's temporary folder, written by ``ray start``), else starts a local one. A
cluster that ended without ``ray stop`` (a killed ``ray start --block``, a Slurm job's end) leaves that file
behind: ``ray.init()`` then waited on the dead address for minutes (5 minutes here, still waiting). So the
recorded address must answer too; where it does not, a run starts a local cluster, as where none was
recorded, and says why.

No Ray import here: ``autotune doctor`` decides in its own process, and Ray may not be installed.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.core.errors import DeviceError

CONNECT_SECONDS = 5.0  # a cluster's address must accept a connection within this
NO_CLUSTER_HINT = "start one (ray start --head) or give its address (--ray-address, RAY_ADDRESS)"


def address_file() -> Path:
    """Ray's record of the cluster ``ray start`` last started on this host (Ray's own rule for its
    temporary folder: RAY_TMPDIR, else TMPDIR on Linux, else /tmp)."""
    if os.environ.get("RAY_TMPDIR"):
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and os.environ.get("TMPDIR"):
        base = os.environ["TMPDIR"]
    else:
        base = "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def unanswered(address: str, seconds: float = CONNECT_SECONDS) -> str | None:
    """Why nothing answers at ``host:port`` (None: something accepts a connection there)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
    except (OSError, ValueError) as e:
        return str(e) or type(e).__name__
    return None


def _checkable(address: str) -> bool:
    """A ``host:port`` to check (not Ray's ``auto`` or ``local``, nor a ``ray://`` client address)."""
    return address not in ("auto", "local") and "://" not in address and ":" in address


class NoClusterAnswers(DeviceError):
    """Nothing answers where the user pointed autotune (``reason`` says where, and why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}: {NO_CLUSTER_HINT}")
        self.reason = reason


@dataclass(frozen=True)
class Connection:
    """What to hand ``ray.init(address=...)``; ``passed_over``: the dead cluster Ray's address file names,
    which a new local cluster replaces."""

    init_address: str | None
    shown: str  # the address as the user knows it, for messages
    passed_over: str | None = None

    @property
    def note(self) -> str | None:
        """The line a run says where it starts a local cluster in place of a dead recorded one."""
        return None if self.passed_over is None else f"{self.passed_over}: starting a local Ray cluster"


def connection(address: str | None) -> Connection:
    """The cluster to connect to: ``address`` (else RAY_ADDRESS) if one answers there; without one, the
    cluster Ray recorded on this host if it answers, else a new local one (``local``).

    Raises:
        NoClusterAnswers: nothing answers at the address given (or, for ``auto``, at the one Ray recorded).
    """
    given = address or os.environ.get("RAY_ADDRESS") or None
    if given is not None and _checkable(given):
        why = unanswered(given)
        if why is not None:
            raise NoClusterAnswers(f"no Ray cluster answers at {given} ({why})")
        return Connection(address, given)
    if given not in (None, "auto"):
        return Connection(address, given)
    stale = stale_record()
    if stale is None:
        return Connection(address, given or "auto")
    if given == "auto":  # the user asked for the running cluster: there is none
        raise NoClusterAnswers(f"no Ray cluster answers at auto: {stale}")
    return Connection("local", "a new local cluster", stale)


def stale_record() -> str | None:
    """A line saying Ray's address file names a cluster where nothing answers (None: no file, or the
    cluster it names answers)."""
    path = address_file()
    try:
        recorded = path.read_text().strip()
    except OSError:
        return None
    if not recorded or not _checkable(recorded):
        return None
    why = unanswered(recorded)
    if why is None:
        return None
    return (
        f"Ray's address file {path} names {recorded}, where nothing answers ({why}; a cluster that ended "
        "without `ray stop`)"
    )


def token_auth_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What a Ray client's environment needs to join a cluster with token authentication: Ray (2.60) turns
    it on for ``ray start`` wherever a token is found, and off for a client unless RAY_AUTH_MODE says
    otherwise, so a client with the same token never joined (Ray's error: the token is missing). The same
    rule as ``ray start``'s, for the client: where RAY_AUTH_MODE is unset and a token is available (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token), token mode. A token-mode client joins a cluster without it too."""
    if "RAY_AUTH_MODE" in environ:
        return {}
    path = environ.get("RAY_AUTH_TOKEN_PATH") or str(
        Path(environ.get("HOME") or Path.home()) / ".ray" / "auth_token"
    )
    if environ.get("RAY_AUTH_TOKEN") or Path(path).is_file():
        return {"RAY_AUTH_MODE": "token"}
    return {}
