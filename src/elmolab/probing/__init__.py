"""Probing what the biLM's layers know: the probe engine on frozen features, metrics, WSD 1-NN."""

from elmolab.probing.datasets import FeatureDataset, TreeDataset
from elmolab.probing.engine import EpochRecord, Head, ProbeResult, ProbeSettings, train_heads
from elmolab.probing.metrics import (
    ControlTask,
    LabelVocabulary,
    TaskMetric,
    accuracy,
    selectivity,
    span_f1,
    task_score,
    untyped_span_f1,
)
from elmolab.probing.wsd import (
    SenseCentroids,
    SensePrediction,
    WsdResult,
    WsdScores,
    evaluate_1nn,
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
    "WsdResult",
    "WsdScores",
    "accuracy",
    "evaluate_1nn",
    "fit_sense_centroids",
    "predict_senses",
    "score_senses",
    "selectivity",
    "span_f1",
    "task_score",
    "train_heads",
    "untyped_span_f1",
    "wsd_vectors",
]
