"""Checkpoints: the on-disk layout (``layout``), saving and restoring a run (``checkpointer``),
each replica's own on-read state (``replicas``), the model as a checkpoint sees it (``graph``),
and looking into a directory (``inspect``)."""

from tfdist.checkpoint.checkpointer import (
    Checkpointer,
    CheckpointOptions,
    ResumePoint,
    TrainingState,
    refuse_a_checkpoint_prefix,
    refuse_to_start_over,
)
from tfdist.checkpoint.layout import Metadata, RunMetadata

__all__ = [
    "Checkpointer", "CheckpointOptions", "ResumePoint", "TrainingState", "refuse_a_checkpoint_prefix", "refuse_to_start_over", "Metadata", "RunMetadata",
]
