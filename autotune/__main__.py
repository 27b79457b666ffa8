"""``python -m autotune``: the same as the ``autotune`` console script."""

from autotune.cli.commands import main

main()
