"""The biLM pretraining LightningModule: bilm-tf's recipe.

One step reads a window of ``unroll_steps`` tokens from ``batch_size`` streams in each direction::

    x      = CharCNN(chars)                                   (batch, time, proj)
    f, b   = forward / backward LSTM stacks, states carried   (batch, time, proj)
    loss   = 0.5 * (NLL(softmax(dropout(f)), next words) + NLL(softmax(dropout(b)), previous words))
    step   = optimizer(clip_global_norm(grad(loss_scale * loss)))

with one softmax shared by both directions (``full``, ``sampled`` or ``adaptive`` in training;
evaluation always normalises over the whole vocabulary). ``loss_scale`` is bilm-tf's
``unroll_steps``: it differentiates the mean per-token loss times the window length, which sets
how large Adagrad's steps are against its initial accumulator and where the clip bites.

States. The LSTM states carry from one window to the next, detached (truncated backpropagation
through time), and are saved in checkpoints with the random number generators, so a resumed run
continues exactly where it stopped. With ``zero_state_share`` p > 0, each sentence of a training
stream starts from the zero state with probability p instead of the state its stream carried
over: the regime in which stateless extraction computes every probe feature, which a model that
only ever carried its states never learns (its backward state can run away from a zero start).

Evaluation runs in float32 whatever the training precision (the full softmax's logits product in
``eval_logits_dtype``: bf16 where the stage chose so), in two regimes per direction: states
carried along the stream (bilm-tf's evaluation; ``val/ppl*``) and every sentence from the zero
state (what extraction computes; ``val/stateless_ppl*``).
"""

from __future__ import annotations

import functools
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from omegaconf import OmegaConf
from torch import Tensor

from elmolab.core.errors import ElmolabError
from elmolab.core.failpoints import failpoint
from elmolab.models.bilm import BiLM, BiLMOptions, BiLMState
from elmolab.models.lstm import LstmState
from elmolab.native import dropout
from elmolab.training.data import LMBatch
from elmolab.training.softmax import LMSoftmax


class BiLMPretrainer(pl.LightningModule):
    """Trains a :class:`BiLM` and its word softmax.

    Args:
        options: bilm-tf ``options.json`` content (the ``model`` config without ``name``).
        vocab_size: softmax classes (``vocab.txt`` lines).
        softmax: ``{"kind": ..., "n_negative_samples": ..., "adaptive_cutoffs": ...,
            "share_negatives": ...}``; ``share_negatives`` draws one set of sampled-softmax
            candidates per step for both directions (bilm-tf draws one per direction).
        optimizer: a Hydra node with ``_target_`` and ``_partial_: true``; the module calls it
            with its parameters. Keys whose value is None are left out.
        loss_scale: the training loss is multiplied by this before differentiation (bilm-tf:
            ``unroll_steps``); the logged losses are not.
        zero_state_share: the probability that a training sentence starts from the zero state.
        lr_schedule: ``{"kind": "constant" | "linear", "warmup_steps": n, "final_fraction": f}``;
            ``linear`` warms up over ``warmup_steps`` and then decays linearly to ``f`` times the
            learning rate at the trainer's last step.
        lstm_path: how the LSTMs compute (``BiLM``'s ``lstm_path``: ``auto``, ``cell``,
            ``compiled``, ``fused`` or ``paired``); ``self.bilm.lstm_path`` holds the choice and
            its reason.
    """

    def __init__(
        self,
        options: dict[str, Any],
        vocab_size: int,
        softmax: dict[str, Any],
        optimizer: dict[str, Any],
        loss_scale: float = 1.0,
        zero_state_share: float = 0.0,
        lr_schedule: dict[str, Any] | None = None,
        lstm_path: str = "auto",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.bilm = BiLM(BiLMOptions.from_dict(options), lstm_path=lstm_path)
        self.softmax = LMSoftmax(
            vocab_size,
            self.bilm.options.lstm.projection_dim,
            kind=softmax["kind"],
            n_negative_samples=softmax.get("n_negative_samples", 8192),
            adaptive_cutoffs=softmax.get("adaptive_cutoffs"),
        )
        if not 0.0 <= zero_state_share <= 1.0:
            raise ElmolabError(f"zero_state_share must be in [0, 1], got {zero_state_share}")
        self.share_negatives = bool(softmax.get("share_negatives", False))
        self.loss_scale = float(loss_scale)
        self.zero_state_share = float(zero_state_share)
        self.lr_schedule = dict(lr_schedule or {"kind": "constant"})
        self.dropout = self.bilm.options.dropout
        self.states: BiLMState | None = None  # carried between training windows
        self._eval_sums: dict[str, Tensor] = {}
        self._eval_states: dict[str, BiLMState | None] = {}
        self._train_states: BiLMState | None = None
        self._resume_rng_state: Tensor | None = None
        # The full softmax's logits product in evaluation: float32, or bf16 (LMSoftmax.full_nll)
        self.eval_logits_dtype = torch.float32

    # -- training ---------------------------------------------------------------------------

    def training_step(self, batch: LMBatch, batch_idx: int) -> Tensor:
        failpoint("train_step")
        states = self._states_for(batch["forward_char_ids"].shape[0])
        forward, backward, self.states = self.bilm.encode_lm(
            batch["forward_char_ids"],
            batch["backward_char_ids"],
            states,
            self._zero_starts(batch["sentence_start"]),
        )  # n_layers x (batch, time, proj) each
        loss_forward, loss_backward = self._train_losses(forward[-1], backward[-1], batch)
        loss = 0.5 * (loss_forward + loss_backward)
        if not torch.isfinite(loss):
            raise ElmolabError(
                f"the training loss became {loss.item()} at step {self.global_step}; stopped. "
                "The last good checkpoint is kept: lower the learning rate or clip harder."
            )
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/loss_fwd", loss_forward)
        self.log("train/loss_bwd", loss_backward)
        self.log("train/ppl", torch.exp(loss.detach()), prog_bar=True)
        return loss * self.loss_scale

    def _zero_starts(self, sentence_start: Tensor) -> Tensor | None:
        """Where this step's training streams restart from zero: (batch, time) bool or None."""
        if self.zero_state_share <= 0.0:
            return None  # no draw: the random stream stays bilm-tf's
        if self.zero_state_share >= 1.0:
            return sentence_start
        draws = torch.rand(sentence_start.shape, device=sentence_start.device)  # (batch, time)
        return sentence_start & (draws < self.zero_state_share)

    def _train_losses(self, forward: Tensor, backward: Tensor, batch: LMBatch) -> list[Tensor]:
        """The mean training NLL of each direction; (batch, time, proj) hidden states."""
        hidden = [forward, backward]
        if self.training and self.dropout > 0:
            hidden = [dropout(h, self.dropout) for h in hidden]
        hidden = [h.reshape(-1, h.shape[-1]) for h in hidden]  # (batch * time, proj) each
        targets = [batch["forward_targets"].reshape(-1), batch["backward_targets"].reshape(-1)]
        if self.share_negatives:  # one call: one set of candidates for both directions
            nll = self.softmax.nll(torch.cat(hidden), torch.cat(targets))  # (2 * batch * time,)
            return list(nll.view(2, -1).mean(dim=1))
        return [self.softmax.loss(h, y) for h, y in zip(hidden, targets, strict=True)]

    def _states_for(self, batch: int) -> BiLMState | None:
        if self.states is None or self.states.forward.h.shape[1] != batch:
            return None
        return self.states

    # -- evaluation: full softmax, per-direction perplexity, two state regimes ----------------
    # Evaluation reads valid/test as streams too, with the state carried from batch to batch
    # (as bilm-tf evaluates), and again with every sentence started from zero (the regime of
    # stateless extraction; a sentence that spans two windows still carries its own state over).
    # The training state is set aside meanwhile and restored after.

    def on_validation_epoch_start(self) -> None:
        self._start_evaluation()

    def on_test_epoch_start(self) -> None:
        self._start_evaluation()

    def on_validation_epoch_end(self) -> None:
        self._log_perplexity("val")
        self.states, self._eval_states = self._train_states, {}

    def on_test_epoch_end(self) -> None:
        self._log_perplexity("test")
        self.states, self._eval_states = self._train_states, {}

    def _start_evaluation(self) -> None:
        self._eval_sums = {}
        self._train_states, self._eval_states = self.states, {}

    def validation_step(self, batch: LMBatch, batch_idx: int) -> None:
        failpoint("validation_step")
        self._accumulate(batch)

    def test_step(self, batch: LMBatch, batch_idx: int) -> None:
        self._accumulate(batch)

    def _accumulate(self, batch: LMBatch) -> None:
        """Sum the full-softmax NLL of every real target, per direction and state regime."""
        keep = batch["mask"].reshape(-1)  # (batch * time,)
        with torch.autocast(self.device.type, enabled=False):  # perplexities in float32
            both = torch.cat([batch["forward_char_ids"], batch["backward_char_ids"]])
            tokens = self.bilm.token_encoder(both)  # (2 * batch, time, proj)
            for regime, resets in (("", None), ("stateless_", batch["sentence_start"])):
                forward, backward, self._eval_states[regime] = self.bilm.encode_lm_tokens(
                    tokens, self._eval_states.get(regime), resets
                )
                for direction, hidden, targets in (
                    ("fwd", forward[-1], batch["forward_targets"]),
                    ("bwd", backward[-1], batch["backward_targets"]),
                ):
                    flat = hidden.reshape(-1, hidden.shape[-1])[keep]  # (real tokens, proj)
                    nll = self.softmax.full_nll(  # (real tokens,)
                        flat, targets.reshape(-1)[keep], self.eval_logits_dtype
                    )
                    self._add(f"{regime}nll_{direction}", nll.double().sum())
        self._add("tokens", keep.sum().double())

    def _add(self, key: str, value: Tensor) -> None:
        self._eval_sums[key] = self._eval_sums.get(key, 0) + value

    def _log_perplexity(self, split: str) -> None:
        sums = {k: v.to(self.device) for k, v in self._eval_sums.items()}
        if self.trainer.world_size > 1:
            sums = {k: self.all_gather(v).sum() for k, v in sums.items()}
        if not sums:
            return
        logged = {f"{split}/tokens": sums["tokens"]}
        for regime in ("", "stateless_"):
            nll_f = sums[f"{regime}nll_fwd"] / sums["tokens"]
            nll_b = sums[f"{regime}nll_bwd"] / sums["tokens"]
            logged[f"{split}/{regime}ppl_fwd"] = torch.exp(nll_f)
            logged[f"{split}/{regime}ppl_bwd"] = torch.exp(nll_b)
            # The number ELMo reports: exp of the mean of the two directions' losses.
            logged[f"{split}/{regime}ppl"] = torch.exp(0.5 * (nll_f + nll_b))
        # The sums are already global (all-gathered above), so every rank logs the same values;
        # sync_dist only averages identical numbers and keeps Lightning from warning.
        for key, value in logged.items():
            self.log(key, value.float(), sync_dist=True, prog_bar=key == f"{split}/ppl")

    # -- optimisation and checkpoints --------------------------------------------------------

    def configure_optimizers(self) -> Any:
        # A key set to null is left out: a preset that switches the optimizer class unsets the
        # keys of the recipe it extends (config merges cannot delete a key).
        node = {k: v for k, v in self.hparams["optimizer"].items() if v is not None}
        factory = hydra.utils.instantiate(OmegaConf.create(node))
        optimizer = factory(self.parameters())
        kind = self.lr_schedule.get("kind", "constant")
        if kind == "constant":
            return optimizer
        if kind != "linear":
            raise ElmolabError(f"lr_schedule.kind must be 'constant' or 'linear', got {kind!r}")
        total = self.trainer.max_steps
        if total is None or total < 0:
            total = int(self.trainer.estimated_stepping_batches)
        factor = functools.partial(
            linear_schedule,
            warmup=int(self.lr_schedule.get("warmup_steps", 0)),
            total=total,
            final=float(self.lr_schedule.get("final_fraction", 0.0)),
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping, also for an optimizer that unscales gradients itself (fused
        Adam): Lightning refuses to clip for those under mixed precision, yet without a gradient
        scaler (bf16, float32) there is nothing to unscale and the gradients are the true ones."""
        unscales_itself = getattr(optimizer, "_step_supports_amp_scaling", False)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if not (unscales_itself and gradient_clip_val) or scaler is not None:
            super().configure_gradient_clipping(
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lstm_states"] = None if self.states is None else _state_to_dict(self.states)
        checkpoint["torch_rng_state"] = torch.get_rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("lstm_states")
        self.states = None if states is None else _state_from_dict(states)
        # Applied just before the next training step: making the data iterator draws a seed
        # from the same generator in between.
        self._resume_rng_state = checkpoint.get("torch_rng_state")

    def on_train_batch_start(self, batch: LMBatch, batch_idx: int) -> None:
        if self._resume_rng_state is not None:
            torch.set_rng_state(self._resume_rng_state)
            self._resume_rng_state = None


def linear_schedule(step: int, warmup: int, total: int, final: float) -> float:
    """The learning-rate factor at ``step``: up from 1/warmup to 1 over ``warmup`` steps, then
    down linearly to ``final`` at step ``total`` (and ``final`` after it)."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    return final + (1.0 - final) * max(0.0, 1.0 - (step - warmup) / span)


def _state_to_dict(state: BiLMState) -> dict[str, Tensor]:
    return {
        f"{direction}_{part}": getattr(getattr(state, direction), part).detach().cpu()
        for direction in ("forward", "backward")
        for part in ("h", "c")
    }


def _state_from_dict(d: dict[str, Tensor]) -> BiLMState:
    return BiLMState(
        LstmState(d["forward_h"], d["forward_c"]), LstmState(d["backward_h"], d["backward_c"])
    )


def count_parameters(module: BiLMPretrainer) -> dict[str, int]:
    """Parameter counts of the parts, as ELMo reports them (sizes exclude the softmax)."""

    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    bilm = module.bilm
    lstm = count(bilm.forward_lstm) + count(bilm.backward_lstm)
    return {
        "char_cnn": count(bilm.token_encoder),
        "lstm": lstm,
        "bilm": count(bilm),
        "softmax": count(module.softmax),
        "total": count(module),
    }
