"""The pretraining recipe: bilm-tf's update exactly, zero starts, both evaluation regimes,
mixed precision, the precision chosen by the hardware, and the progress line."""

import csv
import itertools
import json
import math
from dataclasses import asdict

import lightning.pytorch as pl
import pytest
import torch

from elmolab.core import hardware
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import load_bilm_from_checkpoint
from elmolab.models.lstm import LstmWithProjection
from elmolab.text.vocab import Vocabulary
from elmolab.training import softmax as softmax_module
from elmolab.training.data import LMDataModule
from elmolab.training.module import linear_schedule
from elmolab.training.pretrain import _corpus_stats, fingerprint, make_module, pretrain
from tests.training.test_pretrain import configs, losses, make_corpus

TF_CLIP_NORM = 10.0


def _first_batch(corpus, settings, seed):
    data = LMDataModule(corpus, settings.batch_size, settings.unroll_steps, seed=seed)
    data.setup("fit")
    return next(iter(data.train_dataloader()))


def test_one_step_is_bilm_tf_update_scaled_clipped_adagrad(tmp_path):
    """grad(unroll_steps * loss), clipped to global norm 10 as tf.clip_by_global_norm does,
    then TF's Adagrad: accum = 1.0 + g^2, w -= 0.2 * g / sqrt(accum); computed by hand here and
    compared with what one step of the real pretrain stage wrote."""
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs(max_steps=1, val_every_n_steps=1, limit_val_batches=1)
    settings.unroll_steps = 20
    settings.softmax.kind = "full"  # no sampling: the reference needs the same loss
    settings.optimizer = {
        "_target_": "torch.optim.Adagrad",
        "_partial_": True,
        "lr": 0.2,
        "initial_accumulator_value": 1.0,
    }
    settings.scale_loss_by_unroll_steps = True
    settings.gradient_clip_val = TF_CLIP_NORM
    settings.zero_state_share = 0.0
    settings.lr_schedule.kind = "constant"
    model.dropout = 0.0
    seed = 5

    # The reference: the same initial weights and first batch, the update by hand.
    pl.seed_everything(seed, workers=True, verbose=False)
    vocab = Vocabulary.from_file(corpus / "vocab.txt")
    reference = make_module(model, settings, len(vocab))
    batch = _first_batch(corpus, settings, seed)
    forward, backward, _ = reference.bilm.encode_lm(
        batch["forward_char_ids"], batch["backward_char_ids"]
    )
    loss_f = reference.softmax.loss(forward[-1].reshape(-1, 16), batch["forward_targets"].view(-1))
    loss_b = reference.softmax.loss(
        backward[-1].reshape(-1, 16), batch["backward_targets"].view(-1)
    )
    loss = 0.5 * (loss_f + loss_b)
    names = [n for n, _ in reference.named_parameters()]
    params = [p for _, p in reference.named_parameters()]
    grads = torch.autograd.grad(settings.unroll_steps * loss, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    assert norm > TF_CLIP_NORM, "the clip must bite for this test to check it"
    clipped = [g * (TF_CLIP_NORM / max(float(norm), TF_CLIP_NORM)) for g in grads]
    accumulators = [1.0 + g * g for g in clipped]
    expected = {
        n: (p - 0.2 * g / a.sqrt()).detach()
        for n, p, g, a in zip(names, params, clipped, accumulators, strict=True)
    }

    out = tmp_path / "bilm"
    pretrain(model, settings, trainer, corpus, out, tmp_path / "ckpt", seed=seed)
    stepped = load_bilm_from_checkpoint(out / "model.pt").state_dict()
    for name, value in stepped.items():
        torch.testing.assert_close(value, expected[f"bilm.{name}"], rtol=1e-5, atol=1e-6)
    # The optimizer's accumulators are TF's, parameter by parameter.
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    sums = state["optimizer_states"][0]["state"]
    for index, accumulator in enumerate(accumulators):
        torch.testing.assert_close(sums[index]["sum"], accumulator, rtol=1e-5, atol=1e-6)
    # Without the factor the gradient would not reach the clip: it is what makes the clip bite.
    assert norm / settings.unroll_steps < TF_CLIP_NORM


def test_a_reset_starts_the_lstm_from_zero_exactly_there():
    torch.manual_seed(0)
    layer = LstmWithProjection(6, 8, 4, cell_clip=3.0, proj_clip=3.0)
    x = torch.randn(3, 9, 6)
    state = (torch.randn(3, 4), torch.randn(3, 8))
    resets = torch.zeros(3, 9, dtype=torch.bool)
    resets[1, 4] = True  # row 1 starts a sentence at step 4
    out, _ = layer(x, state=state, resets=resets)
    whole, _ = layer(x, state=state)
    torch.testing.assert_close(out[[0, 2]], whole[[0, 2]])  # other rows carry on
    torch.testing.assert_close(out[1, :4], whole[1, :4])
    fresh, _ = layer(x[1:2, 4:])  # from zeros
    torch.testing.assert_close(out[1, 4:], fresh[0], rtol=1e-6, atol=1e-6)


def test_sentence_starts_mark_the_first_pair_of_every_sentence(tmp_path):
    corpus = make_corpus(tmp_path)
    data = LMDataModule(corpus, batch_size=3, unroll_steps=7, seed=2)
    data.setup("fit")
    vocab = data.vocab
    for _, batch in zip(range(6), iter(data.train_dataloader()), strict=False):
        starts = batch["sentence_start"]
        assert torch.equal(starts, batch["forward_token_ids"] == vocab.bos_id)
        assert torch.equal(starts, batch["backward_token_ids"] == vocab.eos_id)


def test_stateless_evaluation_is_every_sentence_on_its_own(tmp_path):
    """The stateless perplexity equals the NLL of each sentence run alone from zero states."""
    corpus = make_corpus(tmp_path)
    model, settings, _ = configs()
    settings.softmax.kind = "full"
    torch.manual_seed(0)
    vocab = Vocabulary.from_file(corpus / "vocab.txt")
    module = make_module(model, settings, len(vocab)).eval()
    data = LMDataModule(corpus, batch_size=3, unroll_steps=7, seed=1)
    data.setup("validate")
    module._start_evaluation()
    with torch.no_grad():
        for batch in data.val_dataloader():
            module._accumulate(batch)
        sums = dict(module._eval_sums)
        # Each sentence alone: its n + 1 inputs from zero, predicting the next words.
        total_f = total_b = 0.0
        encoder = data.encoder
        for sentence in range(len(data.corpora["valid"])):
            ids, chars = encoder.encode(data.corpora["valid"].tokens(sentence))
            f_chars = torch.from_numpy(chars[:-1]).long()[None]
            b_chars = torch.from_numpy(chars[::-1][:-1].copy()).long()[None]
            forward, backward, _ = module.bilm.encode_lm(f_chars, b_chars)
            ids = torch.from_numpy(ids)
            total_f += module.softmax.full_nll(forward[-1][0], ids[1:]).double().sum().item()
            total_b += module.softmax.full_nll(backward[-1][0], ids.flip(0)[1:]).double().sum()
    assert sums["stateless_nll_fwd"].item() == pytest.approx(total_f, rel=1e-6)
    assert sums["stateless_nll_bwd"].item() == pytest.approx(float(total_b), rel=1e-6)
    # The carried regime is a different computation (the streams pack several sentences).
    assert sums["nll_fwd"].item() != pytest.approx(total_f, rel=1e-6)


def test_the_recipe_makes_a_model_good_from_a_zero_start(tmp_path):
    """Trained with zero starts, the stateless perplexity of each direction stays near the
    carried one and near the training perplexity of the same direction (one tiny model); a
    model whose evaluation ran away from a zero state fails here."""
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs(max_steps=120, val_every_n_steps=120)
    settings.softmax.kind = "full"
    model.dropout = 0.0
    metrics = pretrain(model, settings, trainer, corpus, tmp_path / "o", tmp_path / "c", seed=1)
    assert settings.zero_state_share > 0  # the default recipe
    val = metrics["val"]
    with (tmp_path / "c" / "logs" / "attempt-0" / "metrics.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("train/loss_fwd")]
    train_ppl = {
        d: math.exp(sum(float(r[f"train/loss_{d}"]) for r in rows[-10:]) / 10)
        for d in ("fwd", "bwd")
    }
    for d in ("fwd", "bwd"):
        assert val[f"stateless_ppl_{d}"] <= 1.25 * val[f"ppl_{d}"], (d, val)
        assert val[f"stateless_ppl_{d}"] <= 2.0 * train_ppl[d], (d, val, train_ppl)
        assert val[f"ppl_{d}"] <= 2.0 * train_ppl[d], (d, val, train_ppl)
    assert metrics["state_check"]["ok"]


def test_shared_negatives_draw_one_set_per_step(tmp_path, monkeypatch):
    corpus = make_corpus(tmp_path)
    model, settings, trainer = configs(max_steps=3, val_every_n_steps=3, limit_val_batches=1)
    settings.softmax.kind = "sampled"
    settings.softmax.n_negative_samples = 8
    calls = []
    real = softmax_module.sample_log_uniform_unique

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(softmax_module, "sample_log_uniform_unique", counting)
    for share, per_step in ((True, 1), (False, 2)):
        calls.clear()
        settings.softmax.share_negatives = share
        out = tmp_path / f"share{share}"
        pretrain(model, settings, trainer, corpus, out, tmp_path / f"c{share}", seed=1)
        assert len(calls) == 3 * per_step, (share, calls)
        logged = losses(tmp_path / f"c{share}")
        assert all(math.isfinite(v) for v in logged.values())


def test_linear_schedule_warms_up_and_decays_to_the_final_fraction():
    factors = [linear_schedule(s, warmup=2, total=10, final=0.1) for s in range(12)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert factors[10] == pytest.approx(0.1) and factors[11] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(factors[1:]))


def test_precision_auto_follows_the_cpu(monkeypatch):
    monkeypatch.setattr(hardware, "_cpuinfo_fields", lambda: {"model name": "X", "flags": "avx2"})
    choice = hardware.choose_precision("auto", "cpu")
    assert choice.precision == "32-true" and "no native bf16" in choice.reason
    monkeypatch.setattr(
        hardware, "_cpuinfo_fields", lambda: {"model name": "X", "flags": "avx2 amx_bf16 amx_tile"}
    )
    choice = hardware.choose_precision("auto", "cpu")
    assert choice.precision == "bf16-mixed" and "amx_bf16" in choice.reason
    assert hardware.choose_precision("32-true", "cpu").precision == "32-true"


def test_the_cpu_model_names_its_family_and_model(monkeypatch):
    fields = {"model name": "AMD EPYC", "cpu family": "25", "model": "17", "flags": "avx2"}
    monkeypatch.setattr(hardware, "_cpuinfo_fields", lambda: fields)
    assert hardware.cpu_model() == "AMD EPYC (family 25, model 17)"
    monkeypatch.setattr(hardware, "_cpuinfo_fields", lambda: {"model name": "Apple M2"})
    assert hardware.cpu_model() == "Apple M2"


def test_bf16_mixed_trains_validates_tests_and_resumes(tmp_path, capsys):
    """CPU autocast runs the code path the GPU presets use (emulated bf16 where the CPU has no
    native bf16: slow, so the run is tiny). Also: the progress line when stdout is no terminal."""
    corpus = make_corpus(tmp_path, repeats=4)
    model, settings, trainer = configs(max_steps=4, val_every_n_steps=2, checkpoint_every_n_steps=2)
    trainer.precision = "bf16-mixed"
    pretrain(model, settings, trainer, corpus, tmp_path / "a", tmp_path / "ckpt", seed=3)
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["precision"]["chosen"] == "bf16-mixed"
    for split in ("val", "test"):
        assert all(math.isfinite(v) for v in metrics[split].values())
    assert "step 4/4 |" in capsys.readouterr().out
    # Resume: mark the run unfinished and ask for two more steps.
    run = tmp_path / "ckpt" / "run.json"
    info = json.loads(run.read_text())
    settings.max_steps = 6
    stats = _corpus_stats(corpus)
    n_vocab = len(Vocabulary.from_file(corpus / "vocab.txt"))
    # The run id of the 6-step run, as pretrain() computes it.
    info["run_id"] = fingerprint(
        asdict(model), asdict(settings), asdict(trainer), 3, stats["splits"], n_vocab
    )
    info["complete"] = False
    run.write_text(json.dumps(info))
    resumed = pretrain(model, settings, trainer, corpus, tmp_path / "b", tmp_path / "ckpt", seed=3)
    assert resumed["resumed"] and resumed["steps"] == 6


@pytest.mark.skipif(
    not hardware.native_bf16_flags(), reason="this CPU has no native bf16 (AMX or AVX512-BF16)"
)
def test_fp32_and_bf16_give_the_same_training_losses_within_one_percent(tmp_path):
    corpus = make_corpus(tmp_path)
    runs = {}
    for precision in ("32-true", "bf16-mixed"):
        model, settings, trainer = configs(max_steps=30, val_every_n_steps=30)
        trainer.precision = precision
        pretrain(
            model,
            settings,
            trainer,
            corpus,
            tmp_path / precision,
            tmp_path / f"c{precision}",
            seed=1,
        )
        runs[precision] = losses(tmp_path / f"c{precision}")
    for step, loss in runs["32-true"].items():
        assert runs["bf16-mixed"][step] == pytest.approx(loss, rel=0.01), step


def test_stateless_gap_of_a_trained_bilm_is_what_metrics_report():
    from elmolab.training.pretrain import state_check

    ok = state_check(
        {"ppl_fwd": 100.0, "ppl_bwd": 110.0, "stateless_ppl_fwd": 120.0, "stateless_ppl_bwd": 121.0}
    )
    assert ok["ok"] and ok["stateless_over_carried"] == {"fwd": 1.2, "bwd": 1.1}
    bad = state_check(
        {"ppl_fwd": 100.0, "ppl_bwd": 100.0, "stateless_ppl_fwd": 100.0, "stateless_ppl_bwd": 900.0}
    )
    assert not bad["ok"] and "zero_state_share" in bad["message"]


def test_bilm_encode_lm_tokens_equals_encode_lm():
    options = BiLMOptions.published("small")
    options.lstm.dim, options.lstm.projection_dim = 16, 8
    options.char_cnn.filters = [[1, 4], [2, 4]]
    bilm = BiLM(options).eval()
    chars = torch.randint(1, 200, (2, 3, 50))
    a = bilm.encode_lm(chars[:1], chars[1:])
    tokens = bilm.token_encoder(chars)
    b = bilm.encode_lm_tokens(tokens)
    torch.testing.assert_close(a[0][-1], b[0][-1])
    torch.testing.assert_close(a[1][-1], b[1][-1])
