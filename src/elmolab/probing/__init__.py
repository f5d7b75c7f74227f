"""Probing what the biLM's layers know: the probes (``probes``, the reference; ``engine``, the
batched path the stage runs) on frozen features, metrics, WSD 1-NN."""

from elmolab.core.schema import ProbeSettings
from elmolab.data.labels import ControlTask, LabelVocabulary, TaskMetric
from elmolab.probing.datasets import FeatureDataset, TreeDataset
from elmolab.probing.engine import train_heads
from elmolab.probing.heads import EpochRecord, ProbeResult
from elmolab.probing.metrics import accuracy, span_f1, task_score, untyped_span_f1
from elmolab.probing.probes import Head
from elmolab.probing.wsd import (
    SenseCentroids,
    SensePrediction,
    WsdScores,
    fit_sense_centroids,
    predict_senses,
    score_senses,
    wsd_vectors,
)

__all__ = [
    "ControlTask",
    "EpochRecord",
    "FeatureDataset",
    "Head",
    "LabelVocabulary",
    "ProbeResult",
    "ProbeSettings",
    "SenseCentroids",
    "SensePrediction",
    "TaskMetric",
    "TreeDataset",
    "WsdScores",
    "accuracy",
    "fit_sense_centroids",
    "predict_senses",
    "score_senses",
    "span_f1",
    "task_score",
    "train_heads",
    "untyped_span_f1",
    "wsd_vectors",
]
