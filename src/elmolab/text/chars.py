"""Character ids for tokens and sentences, exactly as bilm-tf computes them.

A token becomes the UTF-8 bytes of its text, truncated to ``max_characters_per_token - 2`` (48),
wrapped as ``[BOW, b1 .. bn, EOW]`` and padded with ``PAD`` to ``max_characters_per_token`` (50).
The sentence marks ``<S>`` and ``</S>`` are the single pseudo-characters 256 and 257 in that frame.

bilm-tf's training graph uses these ids as they are (``n_characters`` 261). At inference every id
is shifted by +1 so that 0 means "no token" (padding of the time axis); the stored ``char_embed``
then gets a zero row prepended (``n_characters`` 262). ``char_ids_for_*`` take ``shift`` to choose.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MAX_CHARACTERS_PER_TOKEN = 50  # bilm-tf's max_characters_per_token
BOS_CHAR = 256  # the pseudo-character of <S>
EOS_CHAR = 257  # the pseudo-character of </S>
BOW_CHAR = 258  # begin of word
EOW_CHAR = 259  # end of word
PAD_CHAR = 260  # padding inside a token's 50 slots
N_CHARACTERS_TRAIN = 261  # ids 0..260, as the training graph sees them
N_CHARACTERS_INFERENCE = 262  # ids shifted by +1; 0 is padding of the time axis

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
UNK_TOKEN = "<UNK>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)


def _frame(chars: Sequence[int], max_chars: int) -> list[int]:
    ids = [PAD_CHAR] * max_chars
    ids[0] = BOW_CHAR
    ids[1 : 1 + len(chars)] = chars
    ids[1 + len(chars)] = EOW_CHAR
    return ids


def char_ids_for_token(
    token: str, max_chars: int = MAX_CHARACTERS_PER_TOKEN, shift: int = 1
) -> list[int]:
    """The ``max_chars`` character ids of one token (``<S>``/``</S>`` get their marks).

    ``shift`` is added to every id: 1 at inference (0 is then free for padding), 0 for the ids
    as bilm-tf's training graph sees them.
    """
    if token == BOS_TOKEN:
        ids = _frame([BOS_CHAR], max_chars)
    elif token == EOS_TOKEN:
        ids = _frame([EOS_CHAR], max_chars)
    else:
        utf8 = list(token.encode("utf-8", "ignore")[: max_chars - 2])
        ids = _frame(utf8, max_chars)
    return [i + shift for i in ids]


def char_ids_for_sentences(
    sentences: Sequence[Sequence[str]],
    add_sentence_marks: bool = True,
    max_chars: int = MAX_CHARACTERS_PER_TOKEN,
) -> torch.Tensor:
    """Inference ids (shift +1) for a batch of sentences, zero-padded on the time axis.

    Returns a long tensor ``(batch, time, max_chars)`` where ``time`` is the longest sentence
    plus 2 when ``add_sentence_marks`` (``<S>`` first, ``</S>`` last in every row).
    """
    rows = [[BOS_TOKEN, *s, EOS_TOKEN] if add_sentence_marks else list(s) for s in sentences]
    time = max((len(r) for r in rows), default=0)
    ids = torch.zeros(len(rows), time, max_chars, dtype=torch.long)  # (batch, time, chars)
    cache: dict[str, list[int]] = {}
    for b, row in enumerate(rows):
        for t, token in enumerate(row):
            if token not in cache:
                cache[token] = char_ids_for_token(token, max_chars)
            ids[b, t] = torch.tensor(cache[token])
    return ids
