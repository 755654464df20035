"""Exceptions raised by tfdist; each message names the input, the value received and the fix."""

from __future__ import annotations


class TfdistError(Exception):
    """Base class of every error tfdist raises on purpose."""


class ClusterConfigError(TfdistError, ValueError):
    """The cluster description (TF_CONFIG, Slurm variables, flags) is invalid."""


class StrategyError(TfdistError, ValueError):
    """A strategy name or its options are invalid, or do not fit the cluster."""


class BatchSizeError(TfdistError, ValueError):
    """Batch sizes, replicas and accumulation steps do not divide."""


class DataError(TfdistError, ValueError):
    """The training data cannot be read or does not have the expected form."""


class ModelError(TfdistError, TypeError):
    """The model cannot be used: a Keras 3 model, an uncompiled model, a subclassed model..."""


class CheckpointError(TfdistError, RuntimeError):
    """A checkpoint could not be written, read or verified."""


class CheckpointMismatchError(TfdistError, ValueError):
    """The checkpoint in the directory was written by a different run."""


class PeerUnavailableError(TfdistError, RuntimeError):
    """Another task of the cluster died or never came up."""


class PlanError(TfdistError, ValueError):
    """The inputs of a training plan are invalid."""


class LaunchError(TfdistError, RuntimeError):
    """A local cluster could not be launched."""
