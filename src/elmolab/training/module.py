"""The biLM pretraining LightningModule: bilm-tf's recipe.

One step reads a window of ``unroll_steps`` tokens from ``batch_size`` streams in each direction::

    x      = CharCNN(chars)                                   (batch, time, proj)
    f, b   = forward / backward LSTM stacks, states carried   (batch, time, proj)
    loss   = 0.5 * (NLL(softmax(dropout(f)), next words) + NLL(softmax(dropout(b)), previous words))

with one softmax shared by both directions (``full``, ``sampled`` or ``adaptive`` in training;
evaluation always normalises over the whole vocabulary). The LSTM states carry from one window to
the next, detached (truncated backpropagation through time), and are saved in checkpoints with
the random number generators, so a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

from typing import Any

import hydra
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import Tensor

from elmolab.errors import ElmolabError
from elmolab.failpoints import failpoint
from elmolab.models.bilm import BiLM, BiLMOptions, BiLMState
from elmolab.models.lstm import LstmState
from elmolab.training.data import LMBatch
from elmolab.training.softmax import LMSoftmax


class BiLMPretrainer(pl.LightningModule):
    """Trains a :class:`BiLM` and its word softmax.

    Args:
        options: bilm-tf ``options.json`` content (the ``model`` config without ``name``).
        vocab_size: softmax classes (``vocab.txt`` lines).
        softmax: ``{"kind": ..., "n_negative_samples": ..., "adaptive_cutoffs": ...}``.
        optimizer: a Hydra node with ``_target_`` and ``_partial_: true``; the module calls it
            with its parameters.
    """

    def __init__(
        self,
        options: dict[str, Any],
        vocab_size: int,
        softmax: dict[str, Any],
        optimizer: dict[str, Any],
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.bilm = BiLM(BiLMOptions.from_dict(options))
        self.softmax = LMSoftmax(
            vocab_size,
            self.bilm.options.lstm.projection_dim,
            kind=softmax["kind"],
            n_negative_samples=softmax.get("n_negative_samples", 8192),
            adaptive_cutoffs=softmax.get("adaptive_cutoffs"),
        )
        self.dropout = self.bilm.options.dropout
        self.states: BiLMState | None = None  # carried between training windows
        self._eval_sums: dict[str, Tensor] = {}
        self._eval_states: BiLMState | None = None
        self._train_states: BiLMState | None = None
        self._resume_rng_state: Tensor | None = None

    # -- training ---------------------------------------------------------------------------

    def training_step(self, batch: LMBatch, batch_idx: int) -> Tensor:
        failpoint("train_step")
        states = self._states_for(batch["forward_char_ids"].shape[0])
        forward, backward, self.states = self.bilm.encode_lm(
            batch["forward_char_ids"], batch["backward_char_ids"], states
        )  # n_layers x (batch, time, proj) each
        loss_forward = self._train_nll(forward[-1], batch["forward_targets"])
        loss_backward = self._train_nll(backward[-1], batch["backward_targets"])
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
        return loss

    def _train_nll(self, hidden: Tensor, targets: Tensor) -> Tensor:
        if self.training and self.dropout > 0:
            hidden = F.dropout(hidden, self.dropout, training=True)
        return self.softmax.loss(hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1))

    def _states_for(self, batch: int) -> BiLMState | None:
        if self.states is None or self.states.forward.h.shape[1] != batch:
            return None
        return self.states

    # -- evaluation: full softmax, per-direction perplexity -----------------------------------
    # Evaluation reads valid/test as streams too, with the state carried from batch to batch
    # (as bilm-tf evaluates); the training state is set aside meanwhile and restored after.

    def on_validation_epoch_start(self) -> None:
        self._start_evaluation()

    def on_test_epoch_start(self) -> None:
        self._start_evaluation()

    def on_validation_epoch_end(self) -> None:
        self._log_perplexity("val")
        self.states, self._eval_states = self._train_states, None

    def on_test_epoch_end(self) -> None:
        self._log_perplexity("test")
        self.states, self._eval_states = self._train_states, None

    def _start_evaluation(self) -> None:
        self._eval_sums = {}
        self._train_states, self._eval_states = self.states, None

    def validation_step(self, batch: LMBatch, batch_idx: int) -> None:
        failpoint("validation_step")
        self._accumulate(batch)

    def test_step(self, batch: LMBatch, batch_idx: int) -> None:
        self._accumulate(batch)

    def _accumulate(self, batch: LMBatch) -> None:
        """Sum the full-softmax NLL of every real target, per direction."""
        forward, backward, self._eval_states = self.bilm.encode_lm(
            batch["forward_char_ids"], batch["backward_char_ids"], self._eval_states
        )
        keep = batch["mask"].reshape(-1)  # (batch * time,)
        for direction, hidden, targets in (
            ("fwd", forward[-1], batch["forward_targets"]),
            ("bwd", backward[-1], batch["backward_targets"]),
        ):
            flat = hidden.reshape(-1, hidden.shape[-1])[keep]  # (real tokens, proj)
            nll = self.softmax.full_nll(flat, targets.reshape(-1)[keep])  # (real tokens,)
            self._add(f"nll_{direction}", nll.double().sum())
        self._add("tokens", keep.sum().double())

    def _add(self, key: str, value: Tensor) -> None:
        self._eval_sums[key] = self._eval_sums.get(key, 0) + value

    def _log_perplexity(self, split: str) -> None:
        sums = {k: v.to(self.device) for k, v in self._eval_sums.items()}
        if self.trainer.world_size > 1:
            sums = {k: self.all_gather(v).sum() for k, v in sums.items()}
        if not sums:
            return
        nll_f = sums["nll_fwd"] / sums["tokens"]
        nll_b = sums["nll_bwd"] / sums["tokens"]
        # The sums are already global (all-gathered above), so every rank logs the same values;
        # sync_dist only averages identical numbers and keeps Lightning from warning.
        logged = {
            f"{split}/ppl_fwd": torch.exp(nll_f),
            f"{split}/ppl_bwd": torch.exp(nll_b),
            # The number ELMo reports: exp of the mean of the two directions' losses.
            f"{split}/ppl": torch.exp(0.5 * (nll_f + nll_b)),
            f"{split}/tokens": sums["tokens"],
        }
        for key, value in logged.items():
            self.log(key, value.float(), sync_dist=True, prog_bar=key == f"{split}/ppl")

    # -- optimisation and checkpoints --------------------------------------------------------

    def configure_optimizers(self) -> torch.optim.Optimizer:
        factory = hydra.utils.instantiate(OmegaConf.create(self.hparams["optimizer"]))
        return factory(self.parameters())

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
