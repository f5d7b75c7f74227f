"""The configuration's schema: one dataclass per section of ``conf/``, as ``params.yaml`` holds it.

Each stage reads its sections through :func:`elmolab.core.config.section`, which checks the section
against its dataclass here (unknown keys, missing keys and wrong types are errors naming the file
and the key). :data:`SECTIONS` maps every top-level key of the composed config to its schema;
composition checks every section against it (:func:`elmolab.core.config.check_config`), so a preset
that does not fit the schema cannot be composed. The values and the reasons for them live in
``conf/`` and ``docs/decisions.md``; the checks below are those the types cannot express. What the
stages do with a value is documented where it is used.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from omegaconf.errors import ValidationError

from elmolab.core.errors import ElmolabError

# --- corpus: the prepare stage (conf/corpus/) ---


@dataclass
class SourceConfig:
    reader: str
    path: str


@dataclass
class CorpusConfig:
    """Schema of the ``corpus`` config section (the values and their reasons live in conf/)."""

    sources: dict[str, SourceConfig | None]
    valid_fraction: float
    test_fraction: float
    max_sentence_tokens: int
    min_sentence_tokens: int
    vocab_max_size: int | None
    vocab_min_count: int
    shard_sentences: int
    max_documents: int | None = None


# --- model, pretrain, trainer: the pretrain stage (conf/model/, conf/pretrain/, conf/trainer/) ---


@dataclass
class SoftmaxConfig:
    kind: str
    n_negative_samples: int
    adaptive_cutoffs: list[int]
    share_negatives: bool = False


@dataclass
class LrScheduleConfig:
    kind: str = "constant"
    warmup_steps: int = 0
    final_fraction: float = 0.0


@dataclass
class PretrainConfig:
    """Schema of the ``pretrain`` config section (values and reasons: conf/pretrain/)."""

    batch_size: int
    unroll_steps: int
    softmax: SoftmaxConfig
    optimizer: dict[str, Any]
    scale_loss_by_unroll_steps: bool
    zero_state_share: float
    lr_schedule: LrScheduleConfig
    gradient_clip_val: float | None
    max_steps: int | None
    max_epochs: int | None
    max_time: str | None
    val_every_n_steps: int
    limit_val_batches: int | None
    checkpoint_every_n_steps: int
    lstm_path: str = "auto"
    eval_logits: str = "auto"


@dataclass
class TrainerConfig:
    """Schema of the ``trainer`` config section (conf/trainer/)."""

    accelerator: str
    devices: Any
    num_nodes: int
    strategy: str
    precision: str
    num_threads: int | None
    log_every_n_steps: int
    enable_progress_bar: bool
    deterministic: bool


@dataclass
class ModelConfig:
    """Schema of the ``model`` section: bilm-tf's options.json plus a preset name."""

    name: str
    lstm: dict[str, Any]
    char_cnn: dict[str, Any]
    dropout: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        return {"lstm": self.lstm, "char_cnn": self.char_cnn, "dropout": self.dropout}


# --- extract: probing datasets and encoders (conf/extract/) ---


class TaskKind(StrEnum):
    TOKEN = "token"  # one label per token
    PAIR = "pair"  # one label per (word, gold head) arc
    WSD = "wsd"  # 1-NN word sense disambiguation
    ARC = "arc"  # which word is each word's head (deparc): attachment accuracy
    STRUCTURAL = "structural"  # Hewitt and Manning's structural probe: UUAS, distance Spearman
    SENTENCE = "sentence"  # one label per sentence, from its tokens' features mean-pooled

    @property
    def is_tree(self) -> bool:
        """Read whole dependency trees (heads and punctuation), not labels."""
        return self in (TaskKind.ARC, TaskKind.STRUCTURAL)


AUTO_SCHEME = "auto"  # columns.scheme: the scheme detect_scheme finds in the train split


@dataclass
class CarveDevConfig:
    """A dev split carved from train (``elmolab.data.conll.carve_dev``)."""

    fraction: float  # share of the training sentences moved to dev
    seed: int  # fixed here, not the global seed: sweeping seeds must not move sentences


@dataclass
class ColumnsConfig:
    """How a ``columns`` dataset's files are read (``elmolab.data.conll.read_columns``)."""

    token_column: int = 0  # 0-based field index of the token (negative: from the end)
    label_column: int = -1  # field index of the span tag; -1: the last field
    separator: str = "whitespace"  # a Separator: whitespace (runs of spaces/tabs) or tab
    scheme: str = AUTO_SCHEME  # a TagScheme (IO, IOB1, IOB2, BIOES), or auto: found in train


@dataclass
class DatasetConfig:
    """Schema of ``extract.datasets.<name>``."""

    format: str  # a DatasetFormat
    splits: dict[str, str]  # split name -> source file, under root
    root: str  # the folder holding every file of the dataset (what DVC's extract stage tracks)
    carve_dev: CarveDevConfig | None = None  # carve "dev" out of "train" (then "train" shrinks)
    columns: ColumnsConfig | None = None  # format columns only; None: the defaults


# A task's splits by role: train fits the model, dev selects (the epoch, the best layer), test is
# scored once with the state chosen on dev.
SPLIT_ROLES = ("train", "dev", "test")
EVAL_ROLES = SPLIT_ROLES[1:]  # the splits a trained model is scored on


@dataclass
class TaskConfig:
    """Schema of a task, ``grid.tasks.<name>`` (``conf/tasks/<name>.yaml``)."""

    name: str  # the results folder: artifacts/probes/<name>/...
    kind: str  # a TaskKind
    train: str  # "<dataset>/<split>", the dataset a key of extract.datasets
    dev: str  # model selection (and nothing else)
    test: str  # scored once, with the state chosen on dev
    field: str | None  # token and pair tasks: the label field of the sentence records
    metric: str  # a TaskMetric, or "f1" for wsd
    unseen: str  # a dev/test label absent from train: "raise" or "keep" (never right)
    control_seed: int | None  # set: the control task of this task, mapping fixed by the seed
    wordnet: str | None  # wsd: WordNet's index.sense (candidate senses, first sense)
    family: str  # a TaskFamily: syntactic, semantic or control (the report groups tasks by it)
    # Token tasks: the online code length of the labels (MDL, Voita and Titov 2020) per feature
    # mode, encoder and seed (probe.online_code_fractions).
    mdl: bool = False
    # Token tasks: conditional probing (Hewitt et al. 2021), probes on [layer0; layer k] for
    # k = 1, 2 and the scalar mix beside the layer-0 probe; the information beyond layer 0.
    conditional: bool = False
    # Sentence tasks: each label of the data -> the label the probe learns, null: the sentence is
    # left out (every label of the data must be a key); None: the data's labels as they are.
    label_map: dict[str, str | None] | None = None
    # A control task (family control): the task of grid.tasks whose labels it draws at random
    # per word type, the one its selectivity is measured against (the report pairs them).
    control_of: str | None = None

    def datasets(self) -> list[str]:
        """The datasets the task's splits come from, each once, in role order."""
        return list(dict.fromkeys(dataset for dataset, _ in self.split_refs().values()))

    def split_refs(self) -> dict[str, tuple[str, str]]:
        """Role (train, dev, test) -> (dataset, split)."""
        refs = {}
        for role in SPLIT_ROLES:
            ref = getattr(self, role)
            dataset, slash, split = ref.partition("/")
            if not slash or not dataset or not split or "/" in split:
                raise ElmolabError(f"task.{role}: expected '<dataset>/<split>', got {ref!r}")
            refs[role] = (dataset, split)
        return refs


# bilm-tf's files by role: the keys of an encoder's mapping form, and (as ``*<name>``) the names
# a folder's files may end with.
BILM_TF_FILES = {"options": "options.json", "weights": "weights.hdf5"}


# An encoder as configured: a biLM folder, or {options: <file>, weights: <file>}.
EncoderSource = str | os.PathLike[str] | Mapping[str, str]


@dataclass
class ExtractConfig:
    """Schema of the ``extract`` section (``conf/extract/default.yaml`` gives every value)."""

    encoders: dict[str, Any]  # name -> biLM folder, or {options: <file>, weights: <file>}
    datasets: dict[str, DatasetConfig]  # name -> format and split files
    encoder: str | None  # only this one of ``encoders``; None: all
    dataset: str | None  # only this one of ``datasets`` (DVC: a stage per dataset); None: all
    batch_size: int  # sentences per batch
    stateful: bool  # carry LSTM states between batches (bilm-tf), file order
    dtype: str  # storage type: float16 or float32
    num_threads: int  # torch intra-op threads
    device: str  # cpu, cuda, cuda:<n>, or auto (cuda when available)
    max_sentences: int | None  # the first this-many sentences of each split (None: all)
    # bilm-tf models from elsewhere (a published ELMo), name -> folder: extracted only when
    # ``encoder`` names one, each in a study of its own (``elmolab.core.config.external_study``)
    external: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # OmegaConf cannot type "a string or a mapping of two strings"; the shape is checked here,
        # raised as OmegaConf's own error so that ``elmolab.core.config.section`` names the config
        # file and key as it does for any other value of the wrong type. Files are checked at
        # extraction (the probe stage reads this section too, and needs no biLM).
        for name, source in self.encoders.items():
            if not is_encoder_source(source):
                error = ValidationError(
                    f"expected a biLM folder or {{options: <file>, weights: <file>}},"
                    f" got {source!r}"
                )
                error.full_key = f"encoders.{name}"
                raise error
        for name, folder in self.external.items():
            if name in self.encoders or not _is_path(folder):
                error = ValidationError(
                    f"{name!r} is also one of extract.encoders: give the external one another name"
                    if name in self.encoders
                    else f"expected the folder of a bilm-tf model, got {folder!r}"
                )
                error.full_key = f"external.{name}"
                raise error

    def selected_encoders(self) -> dict[str, tuple[str, EncoderSource]]:
        """The encoders to extract, name -> (config key, source): ``encoder`` alone (one of
        ``encoders`` or ``external``), else every one of ``encoders``."""
        named = {name: (f"extract.encoders.{name}", s) for name, s in self.encoders.items()}
        if self.encoder is None:
            return named
        named |= {name: (f"extract.external.{name}", s) for name, s in self.external.items()}
        if self.encoder not in named:
            raise ElmolabError(
                f"extract.encoder: {self.encoder!r} is not one of extract.encoders or"
                f" extract.external ({', '.join(named)})"
            )
        return {self.encoder: named[self.encoder]}


def is_encoder_source(source: Any) -> bool:
    """Whether ``source`` has an encoder's shape: a non-empty path, or a mapping of exactly
    ``options`` and ``weights`` to non-empty paths."""
    if isinstance(source, Mapping):
        return sorted(source) == sorted(BILM_TF_FILES) and all(
            _is_path(source[role]) for role in BILM_TF_FILES
        )
    return _is_path(source)


def _is_path(value: Any) -> bool:
    return isinstance(value, os.PathLike) or (isinstance(value, str) and bool(value))


# --- controls: the pretrain_random and token_control stages (conf/controls/) ---


@dataclass
class ControlsConfig:
    """Schema of the ``controls`` section: each control of the trained biLM, drawn several times
    (every comparison with a control uses all its instances). An instance is an encoder of
    ``extract.encoders`` -> the seed of its draw: that seed, not the global ``seed``, draws its
    weights (the first instance keeps seed 1, the global default, so its weights never changed).
    Its stage writes ``<paths.artifacts>/bilm_<instance>``, where ``extract.encoders`` must find it
    (the stage's outs in dvc.yaml are named by the instance)."""

    random: dict[str, int]  # the random initialisation (pretrain_random stage)
    token_layer: dict[str, int]  # the trained token layer under random LSTMs (token_control stage)

    def check(self) -> None:
        """Each control has an instance, and no encoder is an instance of two."""
        controls = {"random": self.random, "token_layer": self.token_layer}
        for control, instances in controls.items():
            if not instances:
                raise ElmolabError(f"controls.{control}: no instance (name at least one encoder)")
        for name in self.random.keys() & self.token_layer.keys():
            raise ElmolabError(
                f"controls.token_layer.{name}: {name!r} is an instance of controls.random too"
            )

    def check_encoders(self, encoders: Mapping[str, Any], artifacts: str) -> None:
        """Each instance is an encoder of ``encoders`` (``extract.encoders``) whose folder is the
        one its stage writes, ``<artifacts>/bilm_<instance>``."""
        for control, instances in (("random", self.random), ("token_layer", self.token_layer)):
            for name in instances:
                key = f"controls.{control}.{name}"
                if name not in encoders:
                    raise ElmolabError(
                        f"{key}: {name!r} is not one of extract.encoders ({', '.join(encoders)})"
                    )
                folder = f"{artifacts}/{control_folder(name)}"
                if os.fspath(encoders[name]) != folder:
                    raise ElmolabError(
                        f"{key}: extract.encoders.{name} is {encoders[name]!r}, not {folder!r},"
                        " the folder its stage writes"
                    )

    def instances(self) -> frozenset[str]:
        """Every encoder that is an instance of a control."""
        return frozenset(self.random) | frozenset(self.token_layer)


def control_folder(instance: str) -> str:
    """The folder, under ``paths.artifacts``, of a control's ``instance``: ``bilm_<instance>``."""
    return f"bilm_{instance}"


# --- probe, grid, features: the probe stage (conf/probe/, grid/, task/, features/) ---

PRECISIONS = ("auto", "32-true", "bf16-mixed")


@dataclass
class TreeSettings:
    """Schema of ``probe.tree``: what the tree probes (deparc, structural) do differently."""

    lr: float  # Adam, the probe's own parameters
    lr_decay: float  # lr factor after an epoch without improvement
    batch_tokens: int  # whole sentences per step, about this many words
    max_epochs: int
    patience: int  # epochs without improvement before a head stops
    max_stalls: int  # epochs without improvement in all (not in a row) before a head stops
    rank: int  # structural probe: rows of the linear map B


@dataclass
class ProbeSettings:
    """Schema of the ``probe`` section (``conf/probe/default.yaml`` gives every value and why)."""

    features_dir: str  # the extract stage's output: <features_dir>/<encoder>/<dataset>/<split>
    encoders: list[str]  # names of extract.encoders, each probed in every cell
    # a control's instance (controls) runs only these of the grid's modes (elmolab.probing.modes)
    control_features: list[str]
    kind: str  # linear | mlp (token and pair tasks)
    hidden_dim: int  # mlp only
    dropout: float  # mlp only
    root: str  # pair and arc tasks: the vector standing for the root, learned | zeros
    lr: float  # Adam, the probe's own parameters (token tasks)
    pair_lr: float  # Adam, the probe's own parameters (pair tasks)
    mix_lr: float  # Adam, the learned scalar mix (every task)
    lr_decay: float  # lr factor after an epoch without improvement (token and pair tasks)
    weight_decay: float  # on the classifier (token and pair tasks)
    batch_size: int  # tokens per step (token and pair tasks)
    max_epochs: int
    patience: int  # epochs without progress in a row before a head stops
    max_stalls: int  # epochs without progress in all (not in a row) before a head stops
    min_delta: float  # progress: the dev score up by more than this (or the loss by this share)
    layer_norm: bool  # normalize each layer before mixing
    standardize: bool  # each layer's dimensions by the train split's mean and std (load_cell)
    l2_lambda: float  # L2 penalty on the learned scalar-mix logits
    num_threads: int  # torch intra-op threads of the cell's process (workers use one each)
    precision: str  # the probes' matrix products: auto (by the CPU) | 32-true | bf16-mixed
    workers: int  # jobs (an encoder and a training set each) side by side, one process each
    save_predictions: bool  # write test_predictions.txt beside metrics.json
    unseen: str | None  # raise | keep for every task (presets that cut the data); None: the task's
    train_fractions: list[float]  # token tasks: learning-curve points below the full train set
    subset_seed: int  # fixes the learning-curve subsets (never the probe seed)
    min_epoch_tokens: int  # an epoch cycles a small training set up to this many tokens
    # Online code (tasks with mdl): nested shares of the training sentences ending each block
    online_code_fractions: list[float]
    tree: TreeSettings

    def check(self) -> None:
        """Values the schema's types cannot rule out."""
        if self.kind not in ("linear", "mlp"):
            raise ElmolabError(f"probe.kind must be 'linear' or 'mlp', got {self.kind!r}")
        if self.root not in ("learned", "zeros"):
            raise ElmolabError(f"probe.root must be 'learned' or 'zeros', got {self.root!r}")
        if not self.encoders:
            raise ElmolabError("probe.encoders is empty: nothing to probe")
        if self.precision not in PRECISIONS:
            raise ElmolabError(
                f"probe.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        for key in ("batch_size", "max_epochs", "patience", "max_stalls", "workers", "hidden_dim"):
            if getattr(self, key) < 1:
                raise ElmolabError(f"probe.{key} must be at least 1, got {getattr(self, key)}")
        for key in ("batch_tokens", "max_epochs", "patience", "max_stalls", "rank"):
            if getattr(self.tree, key) < 1:
                raise ElmolabError(
                    f"probe.tree.{key} must be at least 1, got {getattr(self.tree, key)}"
                )
        for key, value in (
            ("lr", self.lr),
            ("pair_lr", self.pair_lr),
            ("mix_lr", self.mix_lr),
            ("tree.lr", self.tree.lr),
        ):
            if not value > 0:
                raise ElmolabError(f"probe.{key} must be positive, got {value}")
        for key, value in (("lr_decay", self.lr_decay), ("tree.lr_decay", self.tree.lr_decay)):
            if not 0 < value <= 1:
                raise ElmolabError(f"probe.{key} must lie in (0, 1], got {value}")
        if not 0 <= self.min_delta < 1:
            raise ElmolabError(f"probe.min_delta must lie in [0, 1), got {self.min_delta}")
        if not 0 <= self.dropout < 1:
            raise ElmolabError(f"probe.dropout must lie in [0, 1), got {self.dropout}")
        blocks = list(self.online_code_fractions)
        if (
            len(blocks) < 2
            or blocks[-1] != 1.0
            or blocks[0] <= 0
            or any(a >= b for a, b in itertools.pairwise(blocks))
        ):
            raise ElmolabError(
                "probe.online_code_fractions must rise strictly from above 0 to 1.0 (at least two"
                f" blocks), got {blocks}"
            )


@dataclass
class FeaturesConfig:
    """Schema of the ``features`` section (``conf/features/<mode>.yaml``)."""

    mode: str  # a FeatureMode: layer0, layer1, layer2, mean, scalar_mix, concat


@dataclass
class GridConfig:
    """Schema of the ``grid`` section: the axes of the probe stage."""

    tasks: dict[str, TaskConfig]  # conf/tasks/<name>.yaml under its name: one DVC cell each
    features: list[str]  # conf/features/<name>.yaml: every one inside each cell
    seeds: list[int]  # every seed runs inside each cell under DVC

    def task(self, name: str) -> TaskConfig:
        """The task ``name`` (the config's ``task``), as ``tasks`` holds it."""
        if name not in self.tasks:
            raise ElmolabError(f"task {name!r} is not one of grid.tasks ({', '.join(self.tasks)})")
        if self.tasks[name].name != name:
            raise ElmolabError(
                f"grid.tasks.{name}.name is {self.tasks[name].name!r}: a cell's results folder is"
                " its task's name, so the two must be the same"
            )
        return self.tasks[name]

    def check(self) -> None:
        """Each control task controls another task of the grid, itself no control task."""
        for name, task in self.tasks.items():
            if task.control_of is None:
                continue
            key = f"grid.tasks.{name}.control_of"
            if task.control_of not in self.tasks:
                raise ElmolabError(
                    f"{key}: {task.control_of!r} is not a task of grid.tasks"
                    f" ({', '.join(self.tasks)})"
                )
            if self.tasks[task.control_of].control_of is not None:
                raise ElmolabError(f"{key}: {task.control_of!r} is a control task itself")


# --- taskmodel: the task model stage (conf/taskmodel/) ---

BASELINE = "baseline"


MIX_PREFIX = "elmo_"


FINETUNE_PREFIX = "finetune_"


@dataclass
class TaskModelConfig:
    """Schema of the ``taskmodel`` section (``conf/taskmodel/default.yaml`` gives every value). Its
    task's splits, label field and metric are those of ``grid.tasks.<task>``."""

    task: str  # a key of grid.tasks: a token task scored by span F1
    unseen: str | None  # a dev/test tag absent from train: raise or keep; None: the task's
    features_dir: str  # the extract stage's folder: <features_dir>/<encoder>/<dataset>/
    token_encoder: str  # whose layer 0 is every input's context-free vector
    mix_encoders: list[str]  # one ELMo input per encoder
    seeds: list[int]  # of the baseline and every input that is not a control's instance
    control_seeds: list[int]  # of each instance of a control (the grouped test's unit: instance)
    max_epochs: int  # a cap early stopping should stop well before
    patience: int  # epochs without a better dev F1 before stopping
    batch_size: int  # sentences per training batch
    eval_batch_size: int  # sentences per evaluation batch
    lr: float  # Adam's learning rate of the tagger
    mix_lr: float  # Adam's learning rate of the mix (its weights and gamma)
    l2_lambda: float  # the mix weights' L2 penalty
    word_dim: int  # the learned word embedding's width (0: none)
    min_word_count: int  # training words seen fewer times share the unknown word's vector
    hidden_dim: int  # LSTM cells per direction
    lstm_layers: int
    dropout: float
    gradient_clip: float  # clip the gradient's norm at this
    standardize: bool  # each layer's dimensions by their train mean and deviation
    num_threads: int  # torch threads (of one worker)
    workers: int  # processes training the runs side by side (more than 1: one thread each)
    finetune_encoders: list[str]  # one fine-tuned input per encoder (its biLM trains too)
    finetune_lr: float  # Adam's learning rate of a fine-tuned biLM's parameters
    bootstrap_samples: int  # resamples of the two-level bootstrap comparing inputs
    bootstrap_seed: int  # its generator's seed
    inputs: list[str] = field(default_factory=list)  # filled in: baseline, elmo_<encoder>, ...

    def __post_init__(self) -> None:
        self.inputs = [
            BASELINE,
            *(MIX_PREFIX + name for name in self.mix_encoders),
            *(FINETUNE_PREFIX + name for name in self.finetune_encoders),
        ]

    def check(self) -> None:
        """Reject settings that cannot run, naming the key."""
        for key in ("seeds", "control_seeds"):
            if not getattr(self, key):
                raise ElmolabError(f"taskmodel.{key}: at least one seed")
        if self.unseen not in (None, "raise", "keep"):
            raise ElmolabError(f"taskmodel.unseen: 'raise', 'keep' or null, not {self.unseen!r}")
        for key in ("mix_encoders", "finetune_encoders"):
            names = getattr(self, key)
            if len(set(names)) != len(names):
                raise ElmolabError(f"taskmodel.{key}: repeated names in {names}")
        if self.finetune_encoders and not self.finetune_lr > 0:
            raise ElmolabError(f"taskmodel.finetune_lr: {self.finetune_lr} is not positive")
        keys = ("max_epochs", "patience", "batch_size", "eval_batch_size", "hidden_dim")
        for key in (*keys, "lstm_layers", "bootstrap_samples", "workers"):
            if getattr(self, key) < 1:
                raise ElmolabError(f"taskmodel.{key}: must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ElmolabError(f"taskmodel.dropout: {self.dropout} is not in [0, 1)")


# --- polysemy, report: the polysemy and report stages (conf/polysemy/, conf/report/) ---


@dataclass
class PolysemyWord:
    """A word and example sentences of different senses, the target in brackets."""

    word: str
    examples: list[str]


@dataclass
class PolysemyConfig:
    """Schema of the ``polysemy`` section (conf/polysemy/): the ELMo paper's Table 4."""

    bilm: str  # the trained biLM's folder (options.json, weights.hdf5)
    vocab: str  # the pretraining vocabulary: the candidates of the context-free neighbours
    semcor: str  # SemCor: the occurrences searched for contextual neighbours
    words: list[PolysemyWord]
    vocab_top_n: int
    neighbours: int
    contextual_layers: list[int]
    semcor_max_sentences: int


@dataclass
class InputsConfig:
    bilm: str
    bilm_random: str
    probes: str
    polysemy: str  # the polysemy stage's folder (its neighbours.json)
    taskmodel: str  # the task model stage's folder (its metrics.json)
    # More probe results: Hydra multirun or run folders, or probes folders (collect.probe_roots).
    sources: list[str] = field(default_factory=list)


@dataclass
class SignificanceConfig:
    alpha: float
    bootstrap_samples: int


@dataclass
class EncoderRolesConfig:
    """Schema of ``report.encoders``: which encoder (a name of ``extract.encoders``) plays each
    role in the report; None: no encoder does."""

    main: str | None  # the pretrained biLM, to which every other encoder is a baseline
    random: str | None  # its random initialisation: what pretraining added at all
    token_layer: str | None  # its token layer under random LSTMs: what the LSTMs' training added


@dataclass
class PaperLayersConfig:
    """Schema of ``report.paper_layers.<task>``: a published result on the two biLSTM layers."""

    measure: str  # what was measured: "POS, linear probe, accuracy"
    layer1: float  # the score of the first layer, a fraction
    layer2: float  # the score of the second layer


@dataclass
class ReportConfig:
    """Schema of the ``report`` config section (values and reasons in conf/report/)."""

    inputs: InputsConfig
    significance: SignificanceConfig
    quick_look: bool  # a preset that checks the pipeline (experiment=smoke): the report says so
    embed_figures: bool
    figure_dpi: int
    encoders: EncoderRolesConfig
    # A task of grid.tasks -> the ELMo paper's figures on it, beside the layer panel
    paper_layers: dict[str, PaperLayersConfig]


@dataclass
class PathsConfig:
    """Schema of ``paths``: where the raw inputs lie and where every stage writes."""

    data: str  # raw inputs (DVC-tracked); no stage writes here
    artifacts: str  # every stage's output folder lies under it


@dataclass
class LoggerConfig:
    """Schema of ``logger`` (conf/logger/): W&B's settings, read by :mod:`elmolab.core.tracking`."""

    wandb: bool  # log every stage to W&B too (CSV always)
    wandb_mode: str  # offline or online (elmolab.core.tracking.wandb_mode)


# Every top-level key of the composed config -> its schema (a type for a plain value).
SECTIONS: dict[str, Any] = {
    "seed": int,
    "study": str,
    "task": str,
    "paths": PathsConfig,
    "corpus": CorpusConfig,
    "model": ModelConfig,
    "pretrain": PretrainConfig,
    "trainer": TrainerConfig,
    "extract": ExtractConfig,
    "controls": ControlsConfig,
    "probe": ProbeSettings,
    "grid": GridConfig,
    "features": FeaturesConfig,
    "taskmodel": TaskModelConfig,
    "polysemy": PolysemyConfig,
    "report": ReportConfig,
    "logger": LoggerConfig,
}
