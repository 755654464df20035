"""Planning a run before it starts: the arithmetic (``planner``), human units (``units``) and the
measured inputs (``measure``: parameter counts, step time). Imports no TensorFlow."""

from tfdist.planning.planner import Plan, plan

__all__ = ["Plan", "plan"]
