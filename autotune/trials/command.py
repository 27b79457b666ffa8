"""What a trial runs: a script (``train.py ARGS``) or a command template (``python train.py --bs {batch_size}``).

A script runs under ``python -m autotune.runtime.harness`` with the tuner's interpreter. A template that starts
with a Python interpreter gets the harness injected after the interpreter's own flags; any other command
(a shell wrapper, say) gets autotune's sitecustomize on its PYTHONPATH. Either way step counting and the
recompute plan work without changing the script. ``{batch_size}`` is replaced in every word of a template,
and ``{grad_accum}`` by the micro-batches the trial accumulates per optimizer step (1 without a global batch
or ``--grad-accum``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import autotune
from autotune.core.batches import check_trial_sizes
from autotune.core.errors import InputError

PLACEHOLDER = "{batch_size}"
ACCUM_PLACEHOLDER = "{grad_accum}"
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?", re.ASCII)
_FLAGS_WITH_VALUE = ("-W", "-X")
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")  # what torchrun is, run as a module
_LAUNCHERS = ("torchrun",)
_RENDEZVOUS = ("node-rank", "master-addr", "master-port", "rdzv-endpoint", "rdzv-backend", "rdzv-id")
SCRIPT_SUFFIXES = (".py", ".sh", ".bash")  # the words of a command that name a script it runs
_PACKAGE_PARENT = str(Path(autotune.__file__).resolve().parent.parent)
_INJECT_DIR = str(Path(autotune.__file__).resolve().parent / "runtime" / "_inject")


@dataclass(frozen=True)
class TrialCommand:
    """A validated trial command. ``words`` is the script and its arguments, or the template."""

    words: tuple[str, ...]
    is_template: bool
    cwd: str | None = None  # where the trial runs (None: the tuner's working directory)

    @classmethod
    def parse(cls, words: Sequence[str]) -> TrialCommand:
        """``[script.py, args...]`` or a command template.

        Raises:
            InputError: no command, a missing script or one Python cannot compile, a placeholder other than
                ``{batch_size}`` and ``{grad_accum}`` or one left unclosed, or a ``python -c`` template.
        """
        if not words:
            raise InputError(
                "no training script given: autotune measure SCRIPT [-- ARGS] or -- COMMAND {batch_size}"
            )
        words = tuple(words)
        if Path(words[0]).is_dir():
            raise InputError(f"{words[0]} is a directory: give the training script (train.py) or a command")
        if words[0].endswith(".py"):
            if not Path(words[0]).is_file():
                raise InputError(f"script not found: {words[0]}")
            _check_syntax(words[0])
            return cls(words, is_template=False)
        _check_program(words[0])
        _check_placeholders(words)
        command = cls(words, is_template=True)
        command.argv(1)  # validates the template once, here
        if (script := command.script_path()) is not None and _runs_our_python(words[0]):
            _check_syntax(script)  # another Python may take syntax this one does not: its trial will say
        return command

    def argv(self, batch_size: int, grad_accum: int | None = None) -> list[str]:
        """The command line of a trial with ``batch_size`` (accumulating ``grad_accum`` micro-batches)."""
        if not self.is_template:
            return [sys.executable, "-m", "autotune.runtime.harness", *self.words]
        words = fill(self.words, batch_size, grad_accum)
        if python_program(self) is None:
            return words  # the runtime comes in through sitecustomize, in every rank
        i = 1
        while i < len(words) and words[i].startswith("-") and words[i] not in ("-m", "-c", "-"):
            i += 2 if words[i] in _FLAGS_WITH_VALUE else 1
        if i < len(words) and words[i] == "-c":
            raise InputError("a 'python -c' command cannot be measured: put the code in a script")
        return [*words[:i], "-m", "autotune.runtime.harness", *words[i:]]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` plus what the trial's Python needs to import autotune (and, for other commands, inject it)."""
        if not self.is_template:
            return dict(base)
        paths = []
        if python_program(self) is None:
            paths.append(_INJECT_DIR)
        elif _same_interpreter(self.words[0]):
            return dict(base)
        paths.append(_PACKAGE_PARENT)
        if base.get("PYTHONPATH"):
            paths.append(base["PYTHONPATH"])
        return {**base, "PYTHONPATH": os.pathsep.join(paths)}

    @property
    def runs_launcher_module(self) -> bool:
        """``python -m torch.distributed.run …``: torchrun run as a module (its ranks need the runtime too)."""
        words = self.words
        return any(words[i] == "-m" and words[i + 1] in _LAUNCHER_MODULES for i in range(len(words) - 1))

    @property
    def launcher(self) -> bool:
        """Whether the command starts its training processes through torchrun."""
        return self.is_template and (
            os.path.basename(self.words[0]) in _LAUNCHERS or self.runs_launcher_module
        )

    @property
    def deepspeed_launcher(self) -> bool:
        """Whether the command starts its ranks through DeepSpeed's launcher (``deepspeed train.py``)."""
        return self.is_template and os.path.basename(self.words[0]) == "deepspeed"

    @property
    def accelerate_launcher(self) -> bool:
        """Whether the command starts its ranks through Accelerate's launcher (``accelerate launch train.py``)."""
        return (
            self.is_template
            and os.path.basename(self.words[0]) == "accelerate"
            and self.words[1:2] == ("launch",)
        )

    def world_size(self, gpus: int = 1) -> int:
        """The ranks a trial of this command runs: torchrun's ``--nnodes`` x ``--nproc-per-node`` (``gpu`` and
        ``auto`` count the trial's ``gpus``); DeepSpeed's launcher's ``--num_nodes`` x ``--num_gpus`` (or
        ``--num_accelerators``; without it, every device it sees: the trial's ``gpus``); Accelerate's
        ``--num_processes`` (all machines' together: :func:`_accelerate_processes`); 1 for another command.

        Raises:
            InputError: an elastic node range or a process count that is not a number.
        """
        if self.accelerate_launcher:
            return _accelerate_processes(self.words, gpus)
        if self.deepspeed_launcher:
            nodes = _option(self.words, "num_nodes", "1")
            per_node = _option(self.words, "num_gpus", "") or _option(
                self.words, "num_accelerators", str(gpus)
            )
            if not nodes.isdigit() or not per_node.isdigit() or int(nodes) < 1 or int(per_node) < 1:
                raise InputError(
                    f"deepspeed --num_nodes {nodes} --num_gpus {per_node}: autotune needs the number of ranks "
                    "of a trial; give both as whole numbers"
                )
            return int(nodes) * int(per_node)
        if not self.launcher:
            return 1
        nodes, per_node = _option(self.words, "nnodes", "1"), _option(self.words, "nproc-per-node", "1")
        if per_node in ("gpu", "auto"):
            per_node = str(gpus)
        if not nodes.isdigit() or not per_node.isdigit() or int(nodes) < 1 or int(per_node) < 1:
            raise InputError(
                f"torchrun --nnodes {nodes} --nproc-per-node {per_node}: autotune needs the number of ranks "
                "of a trial; give both as whole numbers"
            )
        return int(nodes) * int(per_node)

    @property
    def nodes(self) -> int:
        """torchrun's ``--nnodes`` (1 for a command that is not torchrun)."""
        if not self.launcher:
            return 1
        nodes = _option(self.words, "nnodes", "1")
        return int(nodes) if nodes.isdigit() else 1

    def check_placeable(self) -> None:
        """A multi-node torchrun template whose rendezvous autotune sets on a cluster (``on_node``).

        Raises:
            InputError: the template sets a rendezvous option itself.
        """
        for name in _RENDEZVOUS:
            if _option(self.words, name, "") != "":
                raise InputError(
                    f"the command sets torchrun's --{name}: on a cluster autotune places each trial and sets "
                    f"its rendezvous (--node-rank, --master-addr, --master-port); remove --{name}"
                )

    def on_node(self, node_rank: int, master: str, port: int) -> TrialCommand:
        """This torchrun template as node ``node_rank`` of its trial runs it: static rendezvous at
        ``master:port`` (node 0's address and a port free there)."""
        i = next(
            i for i, w in enumerate(self.words) if os.path.basename(w) in _LAUNCHERS or w in _LAUNCHER_MODULES
        )
        added = ("--node-rank", str(node_rank), "--master-addr", master, "--master-port", str(port))
        return TrialCommand((*self.words[: i + 1], *added, *self.words[i + 1 :]), self.is_template, self.cwd)

    def script_path(self) -> str | None:
        """The Python script this command runs, if one can be seen (the first ``*.py`` word)."""
        return next((w for w in self.words if w.endswith(".py") and Path(w).is_file()), None)

    def __str__(self) -> str:
        return " ".join(self.words)


def scripts_named(words: Sequence[str], cwd: str) -> dict[str, str]:
    """The sha256 of every script a command's ``words`` name (each word, or ``--option=value``'s value,
    ending in .py, .sh or .bash that is a file, relative to ``cwd``), by the word as written."""
    hashes = {}
    for word in words:
        for path in {word, word.partition("=")[2]}:
            if path.endswith(SCRIPT_SUFFIXES) and (Path(cwd) / path).is_file():
                hashes[path] = file_sha256(Path(cwd) / path)
    return hashes


def file_sha256(path: Path) -> str:
    """The file's sha256, read a MiB at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fill(words: Sequence[str], batch_size: int, grad_accum: int | None) -> list[str]:
    """A template's words with ``{batch_size}`` and ``{grad_accum}`` (1 when not accumulating) filled in.

    Raises:
        InputError: either is not a whole number >= 1 (the words may be a shell's: nothing else goes in).
    """
    check_trial_sizes(batch_size, grad_accum)
    return [
        w.replace(PLACEHOLDER, str(batch_size)).replace(ACCUM_PLACEHOLDER, str(grad_accum or 1))
        for w in words
    ]


def _option(words: tuple[str, ...], name: str, default: str) -> str:
    """The value of a launcher's ``--NAME`` (also spelled with underscores, or ``--NAME=VALUE``) among the
    words before the training script."""
    spellings = (f"--{name}", f"--{name.replace('-', '_')}")
    for i, word in enumerate(words[: _script_index(words)]):
        key, eq, value = word.partition("=")
        if key in spellings:
            return value if eq else (words[i + 1] if i + 1 < len(words) else default)
    return default


def _accelerate_processes(words: tuple[str, ...], gpus: int) -> int:
    """The processes ``accelerate launch`` starts, as it counts them: ``--num_processes`` (every machine's
    together), else its config file's ``num_processes`` (``--config_file``, else Accelerate's default one
    under $HF_HOME, if there is one), else one per device it sees (the trial's ``gpus``; one with ``--cpu``).

    Raises:
        InputError: a count that is not a whole number >= 1, or a config file autotune cannot read one from.
    """
    given = _option(words, "num_processes", "")
    source = "--num_processes"
    if not given:
        config = _option(words, "config_file", "") or _accelerate_default_config()
        if config:
            given, source = _config_processes(Path(config)), f"num_processes in {config}"
        else:
            cpu = any(word == "--cpu" for word in words[: _script_index(words)])
            given, source = str(1 if cpu else max(gpus, 1)), "the devices it sees"
    if not given.isdigit() or int(given) < 1:
        raise InputError(
            f"accelerate launch: {source} is {given or 'not set'}: autotune needs the number of ranks of a "
            "trial; pass --num_processes N"
        )
    return int(given)


def _accelerate_default_config() -> str:
    """Accelerate's default config file where it exists (``accelerate config`` writes it), else ""."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    path = Path(home).expanduser() / "accelerate" / "default_config.yaml"
    return str(path) if path.is_file() else ""


def _config_processes(path: Path) -> str:
    """``num_processes`` of an Accelerate config file (YAML, or JSON: YAML reads both), as text; "" if unset.

    Raises:
        InputError: the file cannot be read.
    """
    import yaml  # only a template that runs accelerate reads it: the CLI's start-up does not import it

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise InputError(f"accelerate launch: cannot read its config file {path}: {e}") from None
    value = data.get("num_processes") if isinstance(data, dict) else None
    return "" if value is None else str(value)


def _script_index(words: tuple[str, ...]) -> int:
    """The index of the first word naming a ``.py`` script (len(words) if none)."""
    return next((i for i, word in enumerate(words) if word.endswith(".py")), len(words))


def _check_program(program: str) -> None:
    """A command template's program must be one a trial can start: an executable file, or on the PATH."""
    if os.sep in program or Path(program).is_file():
        path = Path(program)
        if not path.is_file():
            raise InputError(f"{program}: no such file")
        if not os.access(path, os.X_OK):
            raise InputError(
                f"{program} is not executable: chmod +x it, or name its interpreter (python {program})"
            )
    elif shutil.which(program) is None:
        raise InputError(f"{program}: command not found on the PATH")


def _runs_our_python(program: str) -> bool:
    """The template runs this Python: it, or a launcher (torchrun) installed beside it."""
    found = shutil.which(program)
    if found is None:
        return False
    ours = os.path.realpath(sys.executable)
    return os.path.realpath(found) == ours or os.path.dirname(os.path.abspath(found)) == os.path.dirname(
        os.path.abspath(sys.executable)
    )


def _same_interpreter(program: str) -> bool:
    found = shutil.which(program)
    return found is not None and same_interpreter(found, sys.executable)


def same_interpreter(a: str, b: str) -> bool:
    """Whether two interpreter paths are one environment: the same program in the same folder. (A virtual
    environment's ``python`` is a link to the system's: the same file, another environment.)"""
    return os.path.realpath(a) == os.path.realpath(b) and os.path.dirname(
        os.path.abspath(a)
    ) == os.path.dirname(os.path.abspath(b))


def python_program(command: TrialCommand) -> str | None:
    """The Python interpreter a template runs directly (its first word, ``python3.11`` or a path to one),
    else None (a launcher, a shell script, another program)."""
    if not command.is_template or command.runs_launcher_module:
        return None
    return command.words[0] if _PYTHON.fullmatch(os.path.basename(command.words[0])) else None


_NAMED = re.compile(r"\{([A-Za-z_]\w*)\}")  # {name}: a placeholder (JSON such as {"a": 1} is not one)
_UNCLOSED = re.compile(r"\{(batch_size|grad_accum)\b(?!\})")


def _check_placeholders(words: Sequence[str]) -> None:
    """Every ``{name}`` of a template is one autotune fills, and none is left open (a typo there would
    only show as a script that ignores the batch size, trial after trial)."""
    known = {PLACEHOLDER.strip("{}"), ACCUM_PLACEHOLDER.strip("{}")}
    for word in words:
        for name in _NAMED.findall(word):
            if name not in known:
                raise InputError(
                    f"unknown placeholder {{{name}}} in the command ({word!r}): autotune fills {PLACEHOLDER} "
                    f"and {ACCUM_PLACEHOLDER}"
                )
        if (open_ := _UNCLOSED.search(word)) is not None:
            raise InputError(
                f"unclosed placeholder {{{open_[1]} in the command ({word!r}): write {{{open_[1]}}}"
            )


def _check_syntax(script: str) -> None:
    """The script compiles: a syntax error is one line before any trial (each trial would fail on it)."""
    try:
        source = Path(script).read_bytes()
        compile(source, script, "exec", dont_inherit=True)
    except SyntaxError as error:
        where = f"{error.filename or script}:{error.lineno}" if error.lineno else script
        raise InputError(f"{where}: the script does not compile: {error.msg}") from None
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read the script {script}: {error}") from None
