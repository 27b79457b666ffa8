"""Recompute backends: how a plan is found and applied inside a trial.

``torch_modules`` (module-level activation checkpointing) is the primary backend. Backends run inside the
trial process only, so they may import torch at module level.
"""
