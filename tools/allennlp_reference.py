"""allennlp 2.10.1's own ``Elmo`` on the reference fixture: the outputs that ``elmolab.Elmo`` must
reproduce (``tests/test_elmo.py``), saved to ``tests/fixtures/allennlp_elmo_reference.npz``.

allennlp pins torch < 1.13 and imports heavy packages, so it runs in a throwaway venv of its own,
never the project's (nothing of allennlp's computation is replaced; its pins are overridden)::

    python3.11 -m venv /tmp/allennlp-venv
    /tmp/allennlp-venv/bin/pip install torch==2.13.0 --find-links /opt/wheels  # any CPU torch
    /tmp/allennlp-venv/bin/pip install --no-deps allennlp==2.10.1
    /tmp/allennlp-venv/bin/pip install --only-binary :all: numpy h5py spacy cached-path nltk \\
        lmdb torchvision fairscale more-itertools termcolor dill base58 scipy tqdm requests \\
        "transformers>=4.30,<4.36" "huggingface_hub>=0.16,<0.20" "tokenizers<0.16"
    /tmp/allennlp-venv/bin/python tools/allennlp_reference.py [data/reference/elmo_fixture]

(made with torch 2.14.1 (PyPI's build, run on the CPU), torchvision 0.29.1, transformers 4.35.2,
numpy 2.4.6, h5py 3.16.0 on Python 3.11.) It imports nothing of elmolab's.

Settings, all with two output representations and dropout 0, on the first ``N_BATCHES`` batches of
the fixture (batch i = sentence i of each of the three lists in ``sentences.json``, as its
outputs were made), each batch from zero LSTM states (the ``ElmoLstm`` states are reset before
every batch) except in ``stateful``:

- ``learned``, ``learned_ln``: trainable mixes set to ``MIX_W`` and ``MIX_GAMMA`` (one row per
  representation), without and with layer norm;
- ``fixed``, ``fixed_ln``: ``scalar_mix_parameters=FIXED``, without and with layer norm;
- ``boundaries_ln``: ``learned_ln`` with ``keep_sentence_boundaries=True``;
- ``stateful``: ``learned``, the batches in order without resetting the states.

Keys: ``{setting}/{batch}/rep{k}`` (batch, time, 2 * proj) and ``{setting}/{batch}/mask``
(batch, time); ``ids/{batch}`` the character ids of ``batch_to_ids``; ``ids/extra`` those of
``EXTRA_SENTENCES`` (non-ASCII tokens, the sentence-mark strings); ``settings`` their names.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from allennlp.modules.elmo import Elmo, batch_to_ids

N_BATCHES = 3
MIX_W = [[0.5, -0.25, 1.0], [-1.0, 0.0, 2.0]]  # the learned mixes' logits, per representation
MIX_GAMMA = [1.3, 0.7]
FIXED = [0.3, -1.2, 0.9]  # scalar_mix_parameters of the fixed settings
EXTRA_SENTENCES = [["Zürich", "naïve", "日本語", "<S>", "</S>", "x"], ["\u00e9", "🙂"]]
OUTPUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "allennlp_elmo_reference.npz"


def build(fixture: Path, **kwargs) -> Elmo:
    elmo = Elmo(
        str(fixture / "options.json"),
        str(fixture / "lm_weights.hdf5"),
        num_output_representations=2,
        dropout=0.0,
        **kwargs,
    )
    if "scalar_mix_parameters" not in kwargs:
        with torch.no_grad():
            for k in range(2):
                mix = getattr(elmo, f"scalar_mix_{k}")
                for j, parameter in enumerate(mix.scalar_parameters):
                    parameter.fill_(MIX_W[k][j])
                mix.gamma.fill_(MIX_GAMMA[k])
    return elmo.eval()


def main() -> None:
    fixture = Path(sys.argv[1] if len(sys.argv) > 1 else "data/reference/elmo_fixture")
    lists = json.loads((fixture / "sentences.json").read_text(encoding="utf-8"))
    batches = [[lists[k][i].split() for k in range(3)] for i in range(N_BATCHES)]
    settings = {
        "learned": ({}, True),
        "learned_ln": ({"do_layer_norm": True}, True),
        "fixed": ({"scalar_mix_parameters": FIXED}, True),
        "fixed_ln": ({"scalar_mix_parameters": FIXED, "do_layer_norm": True}, True),
        "boundaries_ln": ({"do_layer_norm": True, "keep_sentence_boundaries": True}, True),
        "stateful": ({}, False),
    }
    arrays: dict[str, np.ndarray] = {"settings": np.array(list(settings))}
    for i, batch in enumerate(batches):
        arrays[f"ids/{i}"] = batch_to_ids(batch).numpy().astype(np.int16)
    arrays["ids/extra"] = batch_to_ids(EXTRA_SENTENCES).numpy().astype(np.int16)
    for name, (kwargs, reset) in settings.items():
        elmo = build(fixture, **kwargs)
        for i, batch in enumerate(batches):
            if reset:
                elmo._elmo_lstm._elmo_lstm.reset_states()
            with torch.no_grad():
                output = elmo(batch_to_ids(batch))
            for k, representation in enumerate(output["elmo_representations"]):
                arrays[f"{name}/{i}/rep{k}"] = representation.numpy().astype(np.float32)
            arrays[f"{name}/{i}/mask"] = output["mask"].numpy()
    np.savez_compressed(OUTPUT, **arrays)
    size = OUTPUT.stat().st_size
    print(f"{OUTPUT}: {len(arrays)} arrays, {size} bytes, torch {torch.__version__}")


if __name__ == "__main__":
    main()
