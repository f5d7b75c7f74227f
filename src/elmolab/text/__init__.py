"""Reading text: corpora, CoNLL-style treebanks, WSD and sentiment files, character ids and
vocabularies."""
