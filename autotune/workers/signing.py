"""Signed jobs: a worker runs only a job whose signature it can verify (issue 27).

A job row is the command a worker will run. Anyone who can write the database could otherwise make every
worker run any command, so ``autotune submit`` (and ``autotune run``, for its own job) signs the job: an
HMAC-SHA256, under a key the submitters and workers share out of band, over all that decides what runs —
the study name, the whole spec (the command and its arguments, the working directory, every option) and the
sha256 of every script the command names. A worker verifies the signature before it resolves the job and
refuses, in one line naming the job, a row that was changed after it was signed, one signed with another
key, and an unsigned one (unless it was started with ``--allow-unsigned``: a single-user database). Then it
checks each named script on its own host against the signed hash, so it runs the program that was submitted.

The key is ``AUTOTUNE_JOB_KEY`` (the secret itself), else the file ``AUTOTUNE_JOB_KEY_FILE`` names, else
``job.key`` in the user's config dir if it exists (``autotune keygen`` writes one). A key file must be the
user's own and readable by nobody else (0600), as ssh asks of a private key. The key never enters the
database, and trials do not see it (autotune.trials.measurement passes neither it nor the storage URL).

What it does not cover: a worker's own host (its Python, the packages the script imports, data files),
which the job cannot name, and the trials' outputs written back to the database, which any writer of the
database can still change (they decide an answer, not what runs).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from autotune.core.errors import InputError
from autotune.core.protocol import JOB_KEY_ENV, JOB_KEY_FILE_ENV

_VERSION = "v1"
_HEX8, _HEX64 = re.compile("[0-9a-f]{8}"), re.compile("[0-9a-f]{64}")  # a key id; an HMAC-SHA256


@dataclass(frozen=True)
class JobKey:
    secret: bytes
    source: str  # where it came from, for messages: AUTOTUNE_JOB_KEY, a file, or this run's own

    @property
    def key_id(self) -> str:
        """A short name for the key (a hash of it): a refusal can say "signed with another key" apart from
        "changed after it was signed", and an operator can compare hosts' keys without showing them."""
        return hashlib.sha256(b"autotune job key id\0" + self.secret).hexdigest()[:8]

    @classmethod
    def of_this_run(cls) -> JobKey:
        """A key no one else holds: ``autotune run`` without a shared key signs its job with it, so that only
        its own devices run the job."""
        return cls(secrets.token_hex(32).encode(), "this run's own key")


@dataclass(frozen=True)
class Trust:
    """What a worker runs: jobs whose signature verifies under ``key``, and unsigned ones only with
    ``allow_unsigned`` (``autotune worker --allow-unsigned``)."""

    key: JobKey | None
    allow_unsigned: bool = False

    def __post_init__(self) -> None:
        if self.key is None and not self.allow_unsigned:
            raise InputError(
                "autotune worker runs only signed jobs and holds no job key: set AUTOTUNE_JOB_KEY or "
                "AUTOTUNE_JOB_KEY_FILE to the submitters' key (autotune keygen writes one), or pass "
                "--allow-unsigned on a database only you can write"
            )


def default_key_file() -> Path:
    return platformdirs.user_config_path("autotune", appauthor=False) / "job.key"


def load_key(environ: Mapping[str, str]) -> JobKey | None:
    """The job key this process holds (the module docstring), or None.

    Raises:
        InputError: a key that is too short, a key file that is missing (when named), not a regular file,
            not the user's own, or readable by others.
    """
    text = environ.get(JOB_KEY_ENV)
    if text is not None:
        return JobKey(_checked(text.strip(), JOB_KEY_ENV), JOB_KEY_ENV)
    named = environ.get(JOB_KEY_FILE_ENV)
    path = Path(named).expanduser() if named else default_key_file()
    try:
        info = path.stat()
    except FileNotFoundError:
        if named:
            raise InputError(f"{JOB_KEY_FILE_ENV}: no job key file at {path}") from None
        return None
    except OSError as e:
        raise InputError(f"cannot read the job key file {path}: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"the job key file {path} is not a regular file")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise InputError(f"the job key file {path} belongs to another user (uid {info.st_uid})")
    if info.st_mode & 0o077:
        raise InputError(
            f"the job key file {path} can be read by others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"chmod 600 {path}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the job key file {path}: {getattr(e, 'strerror', e)}") from None
    return JobKey(_checked(text.strip(), str(path)), str(path))


def _checked(text: str, where: str) -> bytes:
    """The key, which must be what ``autotune keygen`` writes: 64 hex digits from the system's random
    source. A key a person chose (a passphrase) can be guessed offline by anyone who reads one stored
    signature, and with it they could sign jobs that every worker runs."""
    if not _HEX64.fullmatch(text.lower()):
        raise InputError(
            f"{where}: a job key must be 64 hex digits as autotune keygen writes them (a chosen key can be "
            f"guessed from the signatures stored in the database), got {len(text)} characters"
        )
    return text.encode()


def write_key_file(path: Path, force: bool = False) -> JobKey:
    """A new random key in ``path`` (mode 0600; its folder created 0700).

    Raises:
        InputError: ``path`` exists (unless ``force``), or cannot be written.
    """
    secret = secrets.token_hex(32)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if force:
            path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InputError(
            f"a job key file exists at {path} (--force replaces it; jobs signed with the old key then stop "
            "verifying)"
        ) from None
    except OSError as e:
        raise InputError(f"cannot write the job key file {path}: {e.strerror}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secret + "\n")
    return JobKey(secret.encode(), str(path))


def sign(key: JobKey, study_name: str, spec: dict[str, Any], scripts: dict[str, str], round: int = 0) -> str:
    """``v1:<key id>:<HMAC-SHA256 hex>`` over the job; from its second round on (``autotune submit --force``
    of a finished job), ``v2:<key id>:<round>:<hmac>``, the round signed too: a worker runs a signature it
    has run to its end only once (autotune.workers.worker), so a finished job a database writer sets back to
    open does not run again, and one its submitter submits again does."""
    if round == 0:
        return f"{_VERSION}:{key.key_id}:{_mac(key, study_name, spec, scripts)}"
    return f"v2:{key.key_id}:{round}:{_mac(key, study_name, spec, scripts, round)}"


def signature_round(signature: str | None) -> int:
    """The round a signature was made for (0: the first, or not one autotune writes)."""
    parts = _parts(signature or "")
    return parts[2] if parts is not None else 0


def _parts(signature: str) -> tuple[str, str, int, str] | None:
    """(version, key id, round, mac) of a signature autotune writes (round 0 for ``v1``); None for any other
    text (a database row: a MAC that is not hex once made ``hmac.compare_digest`` raise)."""
    version, _, rest = signature.partition(":")
    key_id, _, mac = rest.partition(":")
    round = 0
    if version == "v2":
        text, _, mac = mac.partition(":")
        round = int(text) if text.isascii() and text.isdigit() and int(text) > 0 else -1
    if (
        version not in (_VERSION, "v2")
        or round < 0
        or not _HEX8.fullmatch(key_id)
        or not _HEX64.fullmatch(mac)
    ):
        return None
    return version, key_id, round, mac


def _mac(key: JobKey, study_name: str, spec: dict[str, Any], scripts: dict[str, str], round: int = 0) -> str:
    signed: dict[str, Any] = {"study_name": study_name, "spec": spec, "scripts": scripts}
    if round:
        signed["round"] = round
    text = json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac.new(key.secret, text.encode(), hashlib.sha256).hexdigest()


def signature_error(
    key: JobKey, signature: str, study_name: str, spec: dict[str, Any], scripts: dict[str, str] | None
) -> str | None:
    """Why ``signature`` does not verify under ``key`` (None: it does)."""
    parts = _parts(signature)
    if parts is None:
        return f"its signature is not one this autotune writes ({_VERSION}:<key id>:<hmac>)"
    _, key_id, round, mac = parts
    if not hmac.compare_digest(mac, _mac(key, study_name, spec, scripts or {}, round)):
        if key_id != key.key_id:
            return (
                f"it was signed with another key (id {key_id}; this worker holds {key.key_id}, from "
                f"{key.source}): give submitters and workers the same key (a job of autotune run without a "
                "shared key runs on that run's devices only)"
            )
        return (
            "it was changed after it was signed (its command, options or script hashes are not what was "
            "submitted)"
        )
    return None
