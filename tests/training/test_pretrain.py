"""The pretrain stage: real Lightning training of a tiny biLM on a tiny corpus."""

import csv
import dataclasses
import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from elmolab.core.config import section
from elmolab.core.errors import ElmolabError
from elmolab.core.hardware import PrecisionChoice
from elmolab.core.params import compose_params
from elmolab.core.schema import ModelConfig, PretrainConfig, TrainerConfig
from elmolab.models.bilm_tf import load_bilm, load_bilm_from_checkpoint
from elmolab.native import native_kernels
from elmolab.stages import pretrain as pretrain_stage
from elmolab.text.vocab import Vocabulary
from elmolab.training.pretrain import eval_logits_choice, make_module, pretrain, random_control

CONF = Path(__file__).resolve().parents[2] / "conf"

STORY = [
    "the cat sat on the mat .",
    "a dog ran in the park .",
    "the dog saw the cat and the cat ran .",
    "we like the park in the summer .",
    "my friend has a red car .",
    "the red car is in the park .",
]


def make_corpus(root: Path, repeats: int = 20) -> Path:
    """A tiny prepared corpus: the same few sentences, so a tiny biLM can learn them."""
    corpus = root / "corpus"
    for split, n in (("train", repeats), ("valid", 2), ("test", 2)):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "shard-story-00000.txt").write_text("\n".join(STORY * n) + "\n")
    words = sorted({w for s in STORY for w in s.split()})
    (corpus / "vocab.txt").write_text("\n".join(["<S>", "</S>", "<UNK>", *words]) + "\n")
    tokens = sum(len(s.split()) for s in STORY)
    splits = {
        split: {"sentences": len(STORY) * n, "tokens": tokens * n, "unigram_perplexity": 20.0}
        for split, n in (("train", repeats), ("valid", 2), ("test", 2))
    }
    (corpus / "stats.json").write_text(json.dumps({"splits": splits}))
    return corpus


def configs(**pretrain_overrides):
    cfg = OmegaConf.create(yaml.safe_load(compose_params(CONF, ["experiment=smoke"])))
    settings = section(cfg, "pretrain", PretrainConfig)
    settings.batch_size = 4
    settings.unroll_steps = 10
    settings.limit_val_batches = None
    for key, value in pretrain_overrides.items():
        setattr(settings, key, value)
    trainer = section(cfg, "trainer", TrainerConfig)
    trainer.enable_progress_bar = False
    trainer.log_every_n_steps = 1
    # fp32 whatever the CPU: `auto` would pick bf16 on one with native bf16, and the exact
    # comparisons here must not depend on which machine runs them (bf16 has tests of its own).
    trainer.precision = "32-true"
    return section(cfg, "model", ModelConfig), settings, trainer


def losses(ckpt_dir: Path, attempt: int = 0) -> dict[int, float]:
    with (ckpt_dir / "logs" / f"attempt-{attempt}" / "metrics.csv").open() as fh:
        return {
            int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(fh) if r["train/loss"]
        }


def test_tiny_model_overfits_a_small_slice_below_perplexity_20(tmp_path):
    """bilm-tf's own smoke test: the training perplexity of a tiny model on a small corpus."""
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs(max_steps=150, val_every_n_steps=150)
    settings.softmax.kind = "full"
    settings.optimizer = {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.01}
    model.dropout = 0.0
    out = tmp_path / "bilm"
    metrics = pretrain(model, settings, trainer, corpus, out, tmp_path / "ckpt", seed=1)
    last = [loss for _, loss in sorted(losses(tmp_path / "ckpt").items())][-10:]
    train_ppl = torch.tensor(last).mean().exp().item()
    assert train_ppl < 20, f"training perplexity {train_ppl:.1f}"
    assert metrics["val"]["ppl"] < 20  # valid is the same text here
    clipped = "native" if native_kernels().available else "paired"  # the tiny model clips
    assert metrics["lstm_path"]["chosen"] == clipped
    bf16 = metrics["precision"]["chosen"] == "bf16-mixed"
    assert metrics["eval_logits"]["chosen"] == ("bfloat16" if bf16 else "float32")
    for name in (
        "model.pt",
        "options.json",
        "weights.hdf5",
        "softmax.hdf5",
        "vocab.txt",
        "metrics.json",
        "curve.csv",
    ):
        assert (out / name).is_file(), name
    # The exported weights are the trained ones, in both formats.
    reloaded = load_bilm(out / "options.json", out / "weights.hdf5")
    from_ckpt = load_bilm_from_checkpoint(out / "model.pt")
    for (name, a), (_, b) in zip(
        reloaded.state_dict().items(), from_ckpt.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    with (out / "curve.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert rows[-1]["step"] and rows[-1]["val_ppl"]


def test_resumed_run_reproduces_the_uninterrupted_losses(tmp_path):
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs(
        max_steps=24, val_every_n_steps=12, checkpoint_every_n_steps=12
    )
    # The interruption is staged as a 12-step run, so the schedule must not depend on max_steps
    # (a linear decay does; the pipeline test kills a real run under the default schedule).
    settings.lr_schedule.kind = "constant"
    pretrain(model, settings, trainer, corpus, tmp_path / "a", tmp_path / "ckpt_a", seed=3)
    full = losses(tmp_path / "ckpt_a")

    # Interrupted after step 12: train to 12, then mark the run unfinished and ask for 24.
    settings.max_steps = 12
    pretrain(model, settings, trainer, corpus, tmp_path / "b", tmp_path / "ckpt_b", seed=3)
    run = tmp_path / "ckpt_b" / "run.json"
    info = json.loads(run.read_text())
    settings.max_steps = 24
    from elmolab.training.pretrain import fingerprint  # the run id of the 24-step run

    info["run_id"] = json.loads((tmp_path / "ckpt_a" / "run.json").read_text())["run_id"]
    info["complete"] = False
    run.write_text(json.dumps(info))
    metrics = pretrain(
        model, settings, trainer, corpus, tmp_path / "b", tmp_path / "ckpt_b", seed=3
    )
    assert metrics["resumed"]
    resumed = losses(tmp_path / "ckpt_b", attempt=1)
    assert sorted(resumed) == list(range(12, 24))
    for step in range(12, 24):
        assert resumed[step] == pytest.approx(full[step], abs=1e-6), step
    assert fingerprint  # imported for the reader: run ids are fingerprints of the settings


def test_random_control_has_the_same_shape_and_no_training(tmp_path):
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs()
    metrics = random_control(model, settings, trainer, corpus, tmp_path / "rand", seed=1)
    assert metrics["steps"] == 0 and metrics["random_control"]
    assert metrics["val"]["ppl"] > 5  # an untrained softmax knows nothing
    assert load_bilm(tmp_path / "rand" / "options.json", tmp_path / "rand" / "weights.hdf5")


def test_each_random_instance_is_its_own_seeds_draw_and_only_the_first_is_evaluated(tmp_path):
    """pretrain_random@<instance>: the weights ``controls.random.<instance>``'s seed draws, the
    global seed aside (instance 1's seed 1 is the global default, which drew the single control of
    before: its weights are those); only the first instance measures perplexities."""
    artifacts = tmp_path / "artifacts"
    corpus = make_corpus(artifacts)
    overrides = ["experiment=smoke", f"paths.artifacts={artifacts}", "seed=7"]
    overrides += ["pretrain.batch_size=4", "pretrain.unroll_steps=10"]
    params = tmp_path / "params.yaml"
    params.write_text(compose_params(CONF, overrides), encoding="utf-8")
    for instance in ("random", "random_2"):
        pretrain_stage.main(CONF, ["--params", str(params), "--random-control", instance])
    first = json.loads((artifacts / "bilm_random" / "metrics.json").read_text())
    second = json.loads((artifacts / "bilm_random_2" / "metrics.json").read_text())
    assert (first["seed"], first["evaluated"], second["seed"], second["evaluated"]) == (
        1,
        True,
        2,
        False,
    )
    assert first["val"]["ppl"] > 5 and "val" not in second and "test" not in second
    model, settings, trainer = configs()
    weights = {}
    for name, folder in (
        ("random", artifacts / "bilm_random"),
        ("random_2", artifacts / "bilm_random_2"),
        ("seed 1", tmp_path / "seed1"),
        ("seed 2", tmp_path / "seed2"),
    ):
        if name.startswith("seed"):  # drawn directly, evaluated
            seed = int(name.split()[1])
            random_control(model, settings, trainer, corpus, folder, seed=seed)
        weights[name] = load_bilm(folder / "options.json", folder / "weights.hdf5").state_dict()
    for name, tensor in weights["random"].items():
        torch.testing.assert_close(tensor, weights["seed 1"][name], rtol=0, atol=0)
        torch.testing.assert_close(
            weights["random_2"][name], weights["seed 2"][name], rtol=0, atol=0
        )
    key = "forward_lstm.layers.0.W_0"
    assert not torch.allclose(weights["random"][key], weights["random_2"][key])


def test_an_unknown_random_instance_fails_in_one_line(tmp_path, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(compose_params(CONF, [f"paths.artifacts={tmp_path}"]), encoding="utf-8")
    with pytest.raises(SystemExit) as caught:
        pretrain_stage.main(CONF, ["--params", str(params), "--random-control", "random_9"])
    assert caught.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.endswith(
        "--random-control 'random_9': not an instance of controls.random (random, random_2,"
        " random_3)"
    )
    assert "\n" not in error and not (tmp_path / "bilm_random_9").exists()


def test_a_nan_loss_stops_with_a_clear_error_and_keeps_the_last_checkpoint(tmp_path):
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs(max_steps=40, checkpoint_every_n_steps=1)
    settings.optimizer = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 1e30}
    settings.gradient_clip_val = None
    with pytest.raises(ElmolabError, match=r"training loss became (nan|inf) at step \d+") as err:
        pretrain(model, settings, trainer, corpus, tmp_path / "out", tmp_path / "ckpt", seed=1)
    assert "last good checkpoint is kept" in str(err.value)
    assert not (tmp_path / "out").exists()
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert all(torch.isfinite(p).all() for p in last["state_dict"].values())


def test_bad_vocabulary_and_corpus_fail_clearly(tmp_path):
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs(max_steps=2)
    (corpus / "vocab.txt").write_text("the\n<S>\n</S>\n<UNK>\n")
    with pytest.raises(ElmolabError, match=r"vocab.txt:1: expected '<S>'"):
        pretrain(model, settings, trainer, corpus, tmp_path / "o", tmp_path / "c", seed=1)
    corpus = make_corpus(tmp_path / "second")
    (corpus / "train" / "shard-story-00000.txt").write_text("a b\n\nc d\n")
    with pytest.raises(ElmolabError, match=r"shard-story-00000.txt:2: empty line"):
        pretrain(model, settings, trainer, corpus, tmp_path / "o", tmp_path / "c", seed=1)


@pytest.mark.slow
def test_two_cpu_processes_with_ddp_train_and_checkpoint(tmp_path):
    """Lightning DDP over gloo, launched the way users launch it: the stage script, ad hoc."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    make_corpus(tmp_path / "artifacts")
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "pipelines" / "pretrain.py"),
            "experiment=smoke",
            "trainer=ddp_cpu",
            "pretrain.batch_size=4",
            "pretrain.unroll_steps=10",
            "pretrain.max_steps=10",
            "pretrain.val_every_n_steps=5",
            "pretrain.checkpoint_every_n_steps=5",
            f"paths.artifacts={tmp_path / 'artifacts'}",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((run_dir / "bilm" / "metrics.json").read_text())
    assert metrics["steps"] == 10
    assert metrics["tokens"] == 10 * 4 * 10 * 2  # two processes, each its own streams
    assert (run_dir / "bilm_checkpoints" / "last.ckpt").is_file()


def test_the_trainer_section_is_lightning_s_arguments_under_their_own_names():
    """Every key of ``trainer`` but torch's threads reaches Lightning's Trainer under its own
    name, so a key added to conf/trainer/ is a Trainer argument or fails here."""
    import inspect

    from lightning import pytorch as pl

    from elmolab.training.pretrain import lightning_args

    trainer = section(OmegaConf.create(compose_params(CONF)), "trainer", TrainerConfig)
    args = lightning_args(trainer, PrecisionChoice("32-true", "test", "auto"))
    accepted = inspect.signature(pl.Trainer.__init__).parameters
    assert set(args) <= set(accepted)
    expected = {f.name for f in dataclasses.fields(TrainerConfig)} - {"num_threads"}
    assert set(args) == expected - {"enable_progress_bar"}
    assert args["precision"] == "32-true" and args["devices"] == trainer.devices


def test_the_evaluation_logits_follow_the_training_precision() -> None:
    """``eval_logits: auto`` takes the bf16 product where training runs bf16-mixed, float32
    elsewhere; a named dtype is kept; anything else is refused with the setting's name."""
    bf16 = PrecisionChoice("bf16-mixed", "native bf16", "auto")
    fp32 = PrecisionChoice("32-true", "no native bf16", "auto")
    assert eval_logits_choice("auto", bf16)["chosen"] == "bfloat16"
    assert eval_logits_choice("auto", fp32)["chosen"] == "float32"
    assert eval_logits_choice("float32", bf16) == {
        "chosen": "float32",
        "requested": "float32",
        "reason": "set in the config",
    }
    assert eval_logits_choice("bfloat16", fp32)["chosen"] == "bfloat16"
    with pytest.raises(ElmolabError, match=r"pretrain\.eval_logits must be auto, float32 or"):
        eval_logits_choice("fp16", bf16)


def test_fused_adam_is_clipped_under_bf16_mixed(tmp_path):
    """Lightning refuses to clip gradients for an optimizer that unscales them itself (fused
    Adam) under mixed precision; the module clips them as Lightning would, and a bf16 run with
    the clip trains."""
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs(max_steps=2, val_every_n_steps=2)
    settings.optimizer = {
        "_target_": "torch.optim.Adam",
        "_partial_": True,
        "lr": 0.01,
        "fused": True,
    }
    module = make_module(model, settings, len(Vocabulary.from_file(corpus / "vocab.txt")))
    module.trainer = pl.Trainer(precision="bf16-mixed", logger=False, enable_progress_bar=False)
    configured = module.configure_optimizers()
    optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
    for p in module.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        pl.LightningModule.configure_gradient_clipping(module, optimizer, 0.5, "norm")
    module.configure_gradient_clipping(optimizer, 0.5, "norm")
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters()]))
    assert norm.item() == pytest.approx(0.5, rel=1e-4)

    trainer.precision = "bf16-mixed"
    pretrain(model, settings, trainer, corpus, tmp_path / "out", tmp_path / "ckpt", seed=1)
    assert (tmp_path / "out" / "metrics.json").is_file()
