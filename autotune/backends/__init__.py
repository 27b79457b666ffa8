"""Recompute backends: each backend's plans, how a probe finds them, and how a trial applies them.

Two sides, like a trial itself:
- tuner side, torch-free: ``probe_report`` (the probe's typed report), ``probe`` (what a torch plan is
  predicted to save, from the report), ``ort_plans`` (ORT plan strings and the environment that applies
  them);
- trial side, imported only inside a trial (they import torch): ``torch_modules`` (module and operator-level
  activation checkpointing), ``torch_probe`` (the probe's instruments), ``ops`` (aten op kinds), ``ort``
  (ORTModule, a deprecated compatibility backend).
"""

from __future__ import annotations

from autotune.backends.ort_plans import OrtPlan, parse_ort_plan
from autotune.core.plans import Backend, Plan, parse_plan

AnyPlan = Plan | OrtPlan


def parse_backend_plan(text: str, backend: Backend | str) -> AnyPlan:
    """A plan of ``backend``: :class:`~autotune.core.plans.Plan` for torch, :class:`OrtPlan` for ort.

    Raises:
        InputError: a bad plan, or an unknown backend.
    """
    if Backend.parse(backend) is Backend.ORT:
        return parse_ort_plan(text)
    return parse_plan(text)
