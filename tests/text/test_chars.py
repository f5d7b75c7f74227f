"""Character ids exactly as bilm-tf computes them (docs/architecture.md §2)."""

import torch

from elmolab.text.chars import (
    BOW_CHAR,
    EOW_CHAR,
    MAX_CHARACTERS_PER_TOKEN,
    PAD_CHAR,
    char_ids_for_sentences,
    char_ids_for_token,
)


def test_ascii_token_is_framed_and_padded_without_shift():
    ids = char_ids_for_token("cat", shift=0)
    assert len(ids) == MAX_CHARACTERS_PER_TOKEN
    assert ids[:5] == [BOW_CHAR, ord("c"), ord("a"), ord("t"), EOW_CHAR]
    assert ids[5:] == [PAD_CHAR] * 45


def test_inference_shift_adds_one_to_every_id():
    assert char_ids_for_token("cat") == [i + 1 for i in char_ids_for_token("cat", shift=0)]
    assert char_ids_for_token("cat")[:5] == [259, 100, 98, 117, 260]
    assert min(char_ids_for_token("x")) >= 1  # 0 stays free for padding


def test_multibyte_utf8_uses_bytes_not_code_points():
    ids = char_ids_for_token("né", shift=0)  # é is 0xC3 0xA9 in UTF-8
    assert ids[:5] == [BOW_CHAR, ord("n"), 0xC3, 0xA9, EOW_CHAR]
    ids = char_ids_for_token("日", shift=0)  # three bytes
    assert ids[1:4] == list("日".encode()) and ids[4] == EOW_CHAR


def test_long_tokens_are_truncated_to_48_bytes():
    ids = char_ids_for_token("a" * 60, shift=0)
    assert ids[1:49] == [ord("a")] * 48
    assert ids[49] == EOW_CHAR
    # a multi-byte character cut in half keeps its first bytes, as bilm-tf does
    ids = char_ids_for_token("a" * 47 + "é", shift=0)
    assert ids[48] == 0xC3 and ids[49] == EOW_CHAR


def test_sentence_marks():
    assert char_ids_for_token("<S>", shift=0)[:3] == [BOW_CHAR, 256, EOW_CHAR]
    assert char_ids_for_token("</S>", shift=0)[:3] == [BOW_CHAR, 257, EOW_CHAR]
    assert char_ids_for_token("<S>", shift=0)[3:] == [PAD_CHAR] * 47


def test_sentence_batch_adds_marks_and_zero_pads_time():
    ids = char_ids_for_sentences([["a", "b"], ["c"]])
    assert ids.shape == (2, 4, 50) and ids.dtype == torch.long
    assert ids[0, 0, :3].tolist() == [259, 257, 260]  # <S>, shifted
    assert ids[0, 3, :3].tolist() == [259, 258, 260]  # </S>, shifted
    assert ids[1, 2, :3].tolist() == [259, 258, 260]  # </S> of the shorter sentence
    assert torch.all(ids[1, 3] == 0)  # padding of the time axis
    no_marks = char_ids_for_sentences([["a", "b"]], add_sentence_marks=False)
    assert no_marks.shape == (1, 2, 50)
