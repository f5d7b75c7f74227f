"""The prepare stage's library: reading corpora into sentences, the frequency-sorted vocabulary
and character ids."""
