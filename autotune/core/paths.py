"""Where autotune keeps its files: the cache directory (database, trial logs)."""

from __future__ import annotations

import getpass
import itertools
import os
import re
import tempfile
import time
from pathlib import Path

import platformdirs

from autotune.core.errors import InputError

_counter = itertools.count()


def cache_dir(override: str | Path | None = None, *, create: bool = True) -> Path:
    """``override`` (``--cache-dir`` / ``AUTOTUNE_CACHE_DIR``), else the platform's user cache dir; created
    if missing (unless ``create`` is False: the commands that only answer create nothing).

    Raises:
        InputError: it is a file, or cannot be created.
    """
    path = Path(override) if override else Path(platformdirs.user_cache_dir("autotune", appauthor=False))
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(
            f"the cache dir {path} is a file, not a directory (--cache-dir, AUTOTUNE_CACHE_DIR)"
        ) from None
    except OSError as e:
        raise InputError(f"cannot create the cache dir {path}: {e.strerror}") from None
    return path


def default_storage_url(root: Path) -> str:
    """The embedded default: SQLite in the cache dir."""
    return f"sqlite:///{root / 'autotune.db'}"


def location_words(display_url: str) -> list[str]:
    """The options a command printed for the user to paste needs to find this database (issue 27: hints
    without them failed for any other location): none for the default, ``--cache-dir DIR`` for another
    cache dir's database, else ``--storage URL`` (as displayed: a password stays hidden, to be filled in;
    AUTOTUNE_STORAGE, if that is where it came from, still gives it)."""
    if display_url == default_storage_url(cache_dir(create=False)):
        return []
    prefix = "sqlite:///"
    if display_url.startswith(prefix) and display_url.endswith("/autotune.db"):
        return ["--cache-dir", display_url[len(prefix) : -len("/autotune.db")]]
    if os.environ.get("AUTOTUNE_STORAGE"):
        return []  # the environment holds the URL, password included
    return ["--storage", display_url]


COMPILE_CACHE_ENV = (
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
)  # inductor's (FX graphs, kernels), Triton's


def torch_default_inductor_dir() -> str:
    """Where torch puts inductor's cache when told nothing (torch._inductor.runtime.cache_dir_utils), without
    importing torch. Importing torch writes it into ``$TORCHINDUCTOR_CACHE_DIR``, so a process that imported
    torch (a notebook calling autotune's API, a test) shows it there although nobody chose it."""
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def compile_cache_dir(root: Path, fingerprint: str) -> Path:
    """Where a workload's torch.compile caches live: one folder per workload under the cache dir, so its
    later trials reuse what its earlier ones compiled, and removing it removes only that workload's."""
    return root / "compile" / fingerprint[:16]


def new_trial_dir(root: Path) -> Path:
    """A fresh folder for one trial's request, report and logs, named by time for humans."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / "trials" / f"{stamp}-{os.getpid()}-{next(_counter)}"
    path.mkdir(parents=True)
    return path
