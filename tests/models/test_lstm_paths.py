"""The fast LSTM paths against bilm-tf's cell: the fused kernel (no clips), the compiled cell, the
paired cell (both directions in one loop, hand-written gradients) and the native one (the paired
loop in C++).

bilm-tf's cell (``LstmStack(path="cell")``) is the reference: each path must compute the same
outputs, final states and gradients from the same parameters, with states carried between
windows and rows restarted from the zero state, and weights trained on a fast path must export to
bilm-tf's files and come back bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import h5py
import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from elmolab import native as native_module
from elmolab.cli import main
from elmolab.core.errors import ElmolabError
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import export_bilm, load_bilm
from elmolab.models.lstm import LstmStack, LstmState, LstmWithProjection, choose_lstm_path
from elmolab.models.lstm_paired import paired_forward
from elmolab.native import native_kernels
from elmolab.text.chars import char_ids_for_sentences
from elmolab.text.vocab import Vocabulary
from elmolab.training.data import LMDataModule
from elmolab.training.pretrain import make_module
from tests.training.test_pretrain import STORY, configs, make_corpus

B, T, INPUT, CELL, PROJ, LAYERS = 6, 9, 5, 12, 4, 3
# Where no C++ compiler builds the kernels, `auto` takes the Python loop and native cases skip.
CLIPPED_AUTO = "native" if native_kernels().available else "paired"
needs_kernels = pytest.mark.skipif(
    not native_kernels().available, reason="elmolab's C++ kernels are not built here"
)
NATIVE_LOOP = pytest.param(True, marks=needs_kernels, id="native-loop")
NATIVE = pytest.param("native", marks=needs_kernels)


def _stacks(clip: float | None) -> tuple[LstmStack, LstmStack]:
    """The reference cell stack with non-zero biases, and a copy of it."""
    torch.manual_seed(0)
    reference = LstmStack(LAYERS, INPUT, CELL, PROJ, clip, clip, use_skip_connections=True)
    for layer in reference.layers:
        torch.nn.init.normal_(layer.B, std=0.5)
    return reference, copy.deepcopy(reference)


def _run(stack: LstmStack, x: torch.Tensor, batch_sizes, state, resets):
    """Outputs, final state and the gradients of a loss that weighs every output and state."""
    x = x.clone().requires_grad_()
    outputs, final = stack(x, batch_sizes, state, resets)
    weights = [torch.linspace(-1, 1, o.numel()).view_as(o) for o in outputs]
    loss = sum((o * w).sum() for o, w in zip(outputs, weights, strict=True))
    loss = loss + final.h.sum() + final.c.sin().sum()
    grads = torch.autograd.grad(loss, [x, *stack.parameters()])
    return outputs, final, grads


def _assert_same_run(reference: LstmStack, fast: LstmStack, atol: float) -> None:
    """Two windows with carried states, zero-state rows in each, full and ended rows."""
    torch.manual_seed(1)
    resets = torch.rand(2, B, T) < 0.3  # two windows' zero starts
    for batch_sizes in (None, [6, 6, 5, 5, 3, 3, 2, 1, 1]):
        states = [None, None]
        for window in range(2):
            x = torch.randn(B, T, INPUT)
            runs = [
                _run(stack, x, batch_sizes, state, resets[window])
                for stack, state in zip((reference, fast), states, strict=True)
            ]
            (out_r, final_r, grads_r), (out_f, final_f, grads_f) = runs
            for a, b in zip(out_r, out_f, strict=True):
                torch.testing.assert_close(b, a, rtol=0, atol=atol)
            torch.testing.assert_close(final_f.h, final_r.h, rtol=0, atol=atol)
            torch.testing.assert_close(final_f.c, final_r.c, rtol=0, atol=atol)
            for a, b in zip(grads_r, grads_f, strict=True):
                torch.testing.assert_close(b, a, rtol=0, atol=10 * atol)
            states = [LstmState(final_r.h.detach(), final_r.c.detach())] * 2


def test_fused_equals_bilm_tf_cell_without_clips() -> None:
    reference, fused = _stacks(None)
    fused.set_path("fused")
    _assert_same_run(reference, fused, atol=2e-6)


@pytest.mark.slow
def test_compiled_cell_equals_bilm_tf_cell_with_clips() -> None:
    reference, compiled = _stacks(0.5)  # a clip that bites
    compiled.set_path("compiled")
    _assert_same_run(reference, compiled, atol=2e-6)


def _paired_stacks(clip: float | None) -> tuple[LstmStack, LstmStack]:
    """A forward and a backward reference stack, different weights and non-zero biases."""
    torch.manual_seed(0)
    stacks = tuple(
        LstmStack(LAYERS, INPUT, CELL, PROJ, clip, clip, use_skip_connections=True)
        for _ in range(2)
    )
    for stack in stacks:
        for layer in stack.layers:
            torch.nn.init.normal_(layer.B, std=0.5)
    return stacks


def _paired_loss(outputs, finals) -> torch.Tensor:
    """Weighs every layer's output of both directions differently, and every final state."""
    weights = [torch.linspace(-1, 1, B * T * PROJ).view(B, T, PROJ) * (k + 1) for k in range(3)]
    total = sum((o * w).sum() for d in outputs for o, w in zip(d, weights, strict=True))
    return total + sum(f.h.sum() + f.c.sin().sum() for f in finals)


@pytest.mark.parametrize("native", [pytest.param(False, id="python-loop"), NATIVE_LOOP])
@pytest.mark.parametrize("clip", [0.5, None], ids=["clips-bite", "no-clips"])
def test_paired_equals_bilm_tf_cell(clip: float | None, native: bool) -> None:
    """Both directions in one loop with hand-written gradients against each stack on the cell:
    outputs, final states and the gradients of the inputs, the initial states and every
    parameter (float32), over two windows with carried states and zero starts in each; with the
    time loop in Python and in C++."""
    stacks = _paired_stacks(clip)
    torch.manual_seed(1)
    resets = torch.rand(2, B, T) < 0.3
    states = [None, None]
    for window in range(2):
        x = torch.randn(2, B, T, INPUT, requires_grad=True)
        initial = [
            None if s is None else LstmState(*(t.clone().requires_grad_() for t in s))
            for s in states
        ]
        leaves = [x, *(t for s in initial if s is not None for t in s)]
        params = [p for stack in stacks for p in stack.parameters()]
        reference = [
            stack(x[g], None, initial[g], resets[window]) for g, stack in enumerate(stacks)
        ]
        ref_outputs = [r[0] for r in reference]
        ref_finals = [r[1] for r in reference]
        ref_grads = torch.autograd.grad(_paired_loss(ref_outputs, ref_finals), leaves + params)
        forward, backward, f_state, b_state = paired_forward(
            stacks, x, tuple(initial), resets[window], native=native
        )
        grads = torch.autograd.grad(
            _paired_loss([forward, backward], [f_state, b_state]), leaves + params
        )
        for a, b in zip(ref_outputs[0] + ref_outputs[1], forward + backward, strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=2e-6)
        for a, b in zip(ref_finals, (f_state, b_state), strict=True):
            torch.testing.assert_close(b.h, a.h, rtol=0, atol=2e-6)
            torch.testing.assert_close(b.c, a.c, rtol=0, atol=2e-6)
        for a, b in zip(ref_grads, grads, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=2e-5)
        states = [LstmState(f.h.detach(), f.c.detach()) for f in ref_finals]
    if clip is not None:  # the clips bit, so their gradients were tested
        outputs, finals = ref_outputs, ref_finals
        assert any((o.abs() == clip).any() for d in outputs for o in d)
        assert any((f.c.abs() == clip).any() for f in finals)


@pytest.mark.parametrize("native", [pytest.param(False, id="python-loop"), NATIVE_LOOP])
def test_paired_under_bf16_autocast_stays_near_the_cell(native: bool) -> None:
    """bf16 products with float32 gates and cell state, on both paths: the outputs agree to
    bf16's rounding, and the carried states are float32."""
    stacks = _paired_stacks(3.0)
    torch.manual_seed(2)
    x = torch.randn(2, B, T, INPUT).bfloat16()
    resets = torch.rand(B, T) < 0.3
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        reference = [stack(x[g], None, None, resets) for g, stack in enumerate(stacks)]
        forward, backward, f_state, b_state = paired_forward(
            stacks, x, (None, None), resets, native=native
        )
    for a, b in zip(reference[0][0] + reference[1][0], forward + backward, strict=True):
        assert b.dtype == a.dtype == torch.bfloat16
        torch.testing.assert_close(b.float(), a.float(), rtol=0, atol=0.05)
    for a, b in zip((reference[0][1], reference[1][1]), (f_state, b_state), strict=True):
        assert b.h.dtype == b.c.dtype == torch.float32
        torch.testing.assert_close(b.c, a.c, rtol=0, atol=0.05)


def test_torch_weights_load_into_nn_lstm_with_projection() -> None:
    """``torch_weights`` is nn.LSTM(proj_size)'s layout: a real nn.LSTM given them computes the
    reference cell's outputs, and the bilm-tf parameters stay exactly as they were."""
    reference, _ = _stacks(None)
    layer = reference.layers[0]
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    lstm = torch.nn.LSTM(INPUT, CELL, proj_size=PROJ, batch_first=True)
    names = ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_hr_l0"]
    lstm.load_state_dict(dict(zip(names, layer.torch_weights(), strict=True)))
    x = torch.randn(B, T, INPUT)
    h0, c0 = torch.randn(B, PROJ), torch.randn(B, CELL)
    with torch.no_grad():
        expected, (h, c) = layer(x, None, (h0, c0))
        got, (h_n, c_n) = lstm(x, (h0[None], c0[None]))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(h_n[0], h, rtol=0, atol=1e-6)
    torch.testing.assert_close(c_n[0], c, rtol=0, atol=1e-6)
    for name, value in layer.state_dict().items():
        assert torch.equal(value, before[name]), name
    bias_hh = lstm.bias_hh_l0.view(4, CELL)  # torch's gates i, f, g, o
    assert torch.equal(bias_hh, torch.tensor([0.0, 1.0, 0.0, 0.0])[:, None].expand(4, CELL))


@needs_kernels
def test_native_loop_equals_python_loop_under_bf16_autocast() -> None:
    """The C++ loop against the Python loop in the training precision (bf16 products, float32
    states), on the default model's cell and projection sizes (the vectorised code, not only
    its scalar tails): outputs, final states and every gradient."""
    torch.manual_seed(4)
    stacks = tuple(LstmStack(2, 128, 512, 128, 0.5, 0.25, use_skip_connections=True) for _ in "fb")
    x = torch.randn(2, 16, 10, 128) * 2
    resets = torch.rand(16, 10) < 0.2
    found = []
    for native in (False, True):
        leaf = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            forward, backward, f_state, b_state = paired_forward(
                stacks, leaf, (None, None), resets, native=native
            )
        params = [p for stack in stacks for p in stack.parameters()]
        loss = _weighted(forward + backward) + f_state.c.sin().sum() + b_state.h.sum()
        grads = torch.autograd.grad(loss, [leaf, *params])
        found.append((forward + backward + [f_state.h, f_state.c, b_state.h, b_state.c], grads))
    (out_py, grads_py), (out_native, grads_native) = found
    assert any((o.abs() == 0.25).any() for o in out_py[:4])  # the clips bit (exact in bf16)
    assert (out_py[5].abs() == 0.5).any()
    for a, b in zip(out_py, out_native, strict=True):
        torch.testing.assert_close(b.float(), a.float(), rtol=1e-3, atol=1e-3)
    for a, b in zip(grads_py, grads_native, strict=True):
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2 * a.abs().max().item())


def _weighted(outputs: list[torch.Tensor]) -> torch.Tensor:
    """A loss that weighs every output element differently."""
    return sum((o.float() * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outputs)


def test_the_kernels_build_where_there_is_a_compiler() -> None:
    """The test machines have a C++ compiler: the kernels must build and load there."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine")
    kernels = native_kernels()
    assert kernels.available, kernels.detail


def test_without_the_native_kernels_auto_falls_back_to_paired(monkeypatch) -> None:
    with native_module.turned_off():
        choice = choose_lstm_path("auto", 3.0, 3.0)
        assert (choice.path, choice.reason.endswith("(elmolab.native.turned_off)")) == (
            "paired",
            True,
        )
        with pytest.raises(ElmolabError, match="'native' needs its C\\+\\+ loop built"):
            choose_lstm_path("native", 3.0, 3.0)
    monkeypatch.setenv("ELMOLAB_NATIVE", "0")  # the switch for a whole run
    native_module._load.cache_clear()
    try:
        assert "ELMOLAB_NATIVE=0" in choose_lstm_path("auto", 3.0, 3.0).reason
    finally:
        native_module._load.cache_clear()


def test_path_choice_and_bad_settings() -> None:
    assert choose_lstm_path("auto", None, None).path == "fused"
    assert choose_lstm_path("auto", 3.0, None).path == CLIPPED_AUTO
    assert choose_lstm_path("paired", 3.0, 3.0).path == "paired"
    assert choose_lstm_path("cell", 3.0, 3.0).path == "cell"
    assert choose_lstm_path("compiled", 3.0, 3.0).path == "compiled"
    with pytest.raises(ElmolabError, match="'fused' needs cell_clip and proj_clip null"):
        choose_lstm_path("fused", 3.0, 3.0)
    with pytest.raises(ElmolabError, match="lstm_path must be one of"):
        choose_lstm_path("cudnn", None, None)
    clipped = BiLM(BiLMOptions.published("small"))
    assert clipped.lstm_path.path == CLIPPED_AUTO
    assert clipped.forward_lstm.path == clipped.backward_lstm.path == CLIPPED_AUTO


def _no_clip_options(model_cfg) -> dict:
    options = model_cfg.options()
    options["lstm"] = {**options["lstm"], "cell_clip": None, "proj_clip": None}
    return options


@pytest.mark.parametrize("path", ["fused", "paired", NATIVE])
def test_bilm_encode_lm_fast_path_equals_cell_in_training(tmp_path: Path, path: str) -> None:
    """The training entry point on real batches: forward and backward stream, zero starts in
    both directions, states carried into a second window, gradients of every parameter
    (``fused`` on the model without clips, ``paired`` with the tiny preset's clips)."""
    corpus = make_corpus(tmp_path)
    model_cfg, settings, _ = configs()
    options = model_cfg.options() if path != "fused" else _no_clip_options(model_cfg)
    options = dataclasses.replace(BiLMOptions.from_dict(options), dropout=0.0)
    torch.manual_seed(0)
    reference = BiLM(options, lstm_path="cell")
    fused = copy.deepcopy(reference)
    fused.set_lstm_path(path)
    assert fused.lstm_path.as_dict()["chosen"] == path
    data = LMDataModule(corpus, settings.batch_size, settings.unroll_steps, seed=3)
    data.setup("fit")
    batches = list(zip(range(2), iter(data.train_dataloader()), strict=False))
    states = {"cell": None, path: None}
    for _, batch in batches:
        resets = batch["sentence_start"] & (torch.arange(settings.batch_size)[:, None] % 2 == 0)
        assert resets[:, 1:].any()  # zero starts inside the window, not only at its start
        results = {}
        for name, bilm in (("cell", reference), (path, fused)):
            bilm.zero_grad()
            forward, backward, states[name] = bilm.encode_lm(
                batch["forward_char_ids"], batch["backward_char_ids"], states[name], resets
            )
            (forward[-1].sin().sum() + backward[-1].cos().sum()).backward()
            grads = [p.grad.clone() for p in bilm.parameters()]
            results[name] = (forward + backward, grads)
        for a, b in zip(*(results[n][0] for n in results), strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=2e-6)
        for a, b in zip(*(results[n][1] for n in results), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        for a, b in zip(states["cell"], states[path], strict=True):
            torch.testing.assert_close(b.h, a.h, rtol=0, atol=2e-6)


@pytest.mark.parametrize("path", ["fused", "paired", NATIVE])
def test_trained_on_a_fast_path_exports_bit_for_bit_and_embeds_the_same(
    tmp_path: Path, path: str
) -> None:
    """A few Adam steps on a fast path (dropout on), export to bilm-tf's files, re-import:
    every parameter bit for bit; ``elmolab embed`` on the files gives the trained module's
    features (``fused``: the model without clips; ``paired`` and ``native``: with the tiny
    preset's clips)."""
    corpus = make_corpus(tmp_path)
    model_cfg, settings, _ = configs()
    if path == "fused":
        model_cfg.lstm = {**model_cfg.lstm, "cell_clip": None, "proj_clip": None}
    settings.lstm_path = path
    settings.zero_state_share = 0.5
    settings.optimizer = {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.01}
    pl.seed_everything(2, verbose=False)
    module = make_module(model_cfg, settings, len(Vocabulary.from_file(corpus / "vocab.txt")))
    assert module.bilm.lstm_path.path == path
    before = [p.detach().clone() for p in module.bilm.parameters()]
    trainer = pl.Trainer(
        max_steps=4,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        precision="32-true",
    )
    data = LMDataModule(corpus, settings.batch_size, settings.unroll_steps, seed=2)
    trainer.fit(module, datamodule=data)
    trained = module.bilm.eval()
    assert all(not torch.equal(a, b) for a, b in zip(before, trained.parameters(), strict=True))

    export_bilm(trained, tmp_path / "options.json", tmp_path / "weights.hdf5")
    reloaded = load_bilm(tmp_path / "options.json", tmp_path / "weights.hdf5")
    assert reloaded.lstm_path.path == ("fused" if path == "fused" else CLIPPED_AUTO)
    for (name, a), (_, b) in zip(
        trained.state_dict().items(), reloaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name

    text = tmp_path / "in.txt"
    text.write_text("".join(s + "\n" for s in STORY), encoding="utf-8")
    out = tmp_path / "out.hdf5"
    argv = ["embed", str(text), str(out), "--options", str(tmp_path / "options.json")]
    assert main([*argv, "--weights", str(tmp_path / "weights.hdf5")]) == 0
    with h5py.File(out, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        embedded = {s: f[index[s]][...] for s in STORY}  # (layers, tokens, 2 * proj)
    trained.set_lstm_path("cell")  # the reference computation of the trained weights
    for sentence in STORY:
        with torch.no_grad():
            ids = char_ids_for_sentences([sentence.split()], add_sentence_marks=False)
            layers = trained(ids).layers[0]  # (layers, tokens, 2 * proj)
        np.testing.assert_allclose(embedded[sentence], layers.numpy(), rtol=0, atol=2e-6)


def _reference_cell_forward(layer, inputs, batch_sizes, resets):
    """The cell path written plainly, one indexed step at a time (``xw[t]`` read and
    ``outputs[t]`` written in place): what ``LstmWithProjection`` computed before its time loop
    took one view per step and stacked its outputs."""
    batch, time, _ = inputs.shape
    mixed = torch.is_autocast_enabled("cpu")
    state_dtype = torch.float32 if mixed else inputs.dtype
    h = inputs.new_zeros(batch, layer.projection_size, dtype=state_dtype)
    c = inputs.new_zeros(batch, layer.cell_size, dtype=state_dtype)
    keep = (~resets).t().to(state_dtype)[..., None]  # (time, batch, 1)
    C = layer.cell_size
    W_x, W_h = layer.W_0.split([layer.input_size, layer.projection_size])
    xw = torch.addmm(layer.B, inputs.transpose(0, 1).reshape(time * batch, -1), W_x)
    xw = xw.to(state_dtype)
    xw[:, 2 * C : 3 * C] += 1.0  # the forget bias
    xw = xw.view(time, batch, 4 * C)
    outputs = inputs.new_zeros(time, batch, layer.projection_size)
    for t, running in enumerate(batch_sizes):
        h, c = h[:running], c[:running]
        h, c = h * keep[t, :running], c * keep[t, :running]
        if mixed:
            gates = xw[t, :running] + torch.mm(h, W_h)
        else:
            gates = torch.addmm(xw[t, :running], h, W_h)
        j = torch.tanh(gates[:, C : 2 * C])
        i, _, f, o = gates.sigmoid_().chunk(4, dim=1)
        c = (f * c).addcmul_(i, j).clamp_(-layer.cell_clip, layer.cell_clip)
        h = ((o * torch.tanh(c)) @ layer.W_P).to(state_dtype)
        h.clamp_(-layer.proj_clip, layer.proj_clip)
        outputs[t, :running] = h
    return outputs.transpose(0, 1)


@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "bf16-autocast"])
def test_the_cell_time_loop_is_bit_identical_to_indexed_steps(mixed: bool) -> None:
    """Outputs and every gradient (inputs and parameters) of the cell path equal the plain
    indexed-step computation bit for bit: rows of different lengths, state resets included."""
    torch.manual_seed(3)
    layer = LstmWithProjection(16, 32, 8, cell_clip=3.0, proj_clip=3.0)
    inputs = torch.randn(6, 9, 16)
    batch_sizes = [6, 6, 6, 5, 5, 3, 3, 2, 1]  # rows sorted by decreasing length
    resets = torch.rand(6, 9) < 0.2
    found = []
    for forward in (
        lambda x: layer(x, batch_sizes, None, resets)[0],
        lambda x: _reference_cell_forward(layer, x, batch_sizes, resets),
    ):
        layer.zero_grad()
        x = inputs.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            out = forward(x)
        lengths = torch.tensor([sum(n > r for n in batch_sizes) for r in range(6)])
        valid = torch.arange(9)[None, :] < lengths[:, None]  # (rows, time) inside each row
        (out.float() * valid[..., None] * torch.linspace(-1, 1, 8)).sum().backward()
        found.append(
            [out.detach() * valid[..., None], x.grad, *(p.grad for p in layer.parameters())]
        )
    for new, reference in zip(*found, strict=True):
        assert torch.equal(new, reference)
