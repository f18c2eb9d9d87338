"""Typed, versioned objects that cross a process boundary (stdlib + numpy only): the samples a runner returns and
the replay buffer stores (`samples.py`), and the columnar batch the learners train on (`batch.py`)."""

from r3_rllib.types.batch import TRAINING_BATCH_FORMAT, DeferredRanking, TrainableSample, TrainingBatch
from r3_rllib.types.samples import Group, ReplaySample, Sample

__all__ = [
    "TRAINING_BATCH_FORMAT",
    "DeferredRanking",
    "Group",
    "ReplaySample",
    "Sample",
    "TrainableSample",
    "TrainingBatch",
]
