"""What runs inside the user's training process: the trial API (``autotune.batch_size``, ``prepare``,
``step``), the hooks that count steps and apply plans without a change to the script, the harness
(``python -m autotune.runtime.harness train.py``), and the sitecustomize injected into commands that are
not ``python ...``. Never imports torch before the script does.
"""
