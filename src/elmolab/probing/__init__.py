"""Probing what the biLM's layers know: probes on frozen features, their metrics, and WSD 1-NN."""

from elmolab.probing.metrics import (
    ControlTask,
    LabelVocabulary,
    TaskMetric,
    accuracy,
    selectivity,
    span_f1,
    task_score,
)
from elmolab.probing.probes import ArcPair, LinearProbe, MLPProbe, ProbeModel, build_classifier
from elmolab.probing.train import (
    EpochRecord,
    FeatureDataset,
    ProbeConfig,
    ProbeResult,
    train_probe,
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
    "ArcPair",
    "ControlTask",
    "EpochRecord",
    "FeatureDataset",
    "LabelVocabulary",
    "LinearProbe",
    "MLPProbe",
    "ProbeConfig",
    "ProbeModel",
    "ProbeResult",
    "SenseCentroids",
    "SensePrediction",
    "TaskMetric",
    "WsdResult",
    "WsdScores",
    "accuracy",
    "build_classifier",
    "evaluate_1nn",
    "fit_sense_centroids",
    "predict_senses",
    "score_senses",
    "selectivity",
    "span_f1",
    "task_score",
    "train_probe",
    "wsd_vectors",
]
