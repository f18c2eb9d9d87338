"""On-policy distillation's teacher: a driver-side rollout stage whose Ray actors score every sampled response token
with the teacher model (:mod:`r3_rllib.distill.teacher`); the learner's term is :mod:`r3_rllib.core.distill`."""

from r3_rllib.distill.teacher import (
    TeacherScorer,
    TeacherStage,
    TeacherVocabularyError,
    check_teacher_vocabulary,
    first_vocabulary_difference,
)

__all__ = [
    "TeacherScorer",
    "TeacherStage",
    "TeacherVocabularyError",
    "check_teacher_vocabulary",
    "first_vocabulary_difference",
]
