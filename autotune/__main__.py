"""``python -m autotune``: the same as the ``autotune`` console script."""

from autotune.cli import main

main()
