"""ELMo's second stage: a downstream task model (a BiLSTM-CRF tagger) with and without the biLM's
layers, as the ELMo paper's Table 1 compares (``docs/architecture.md``, "The task model").

- :mod:`elmolab.taskmodel.data`: a tagging split in memory (the cached layers of the extract
  stage, word ids, tag ids) and its padded batches;
- :mod:`elmolab.taskmodel.model`: the tagger (``BiLstmCrfTagger``) and its Lightning module;
- :mod:`elmolab.taskmodel.runs`: the ``taskmodel`` stage, every input and seed, and the summary
  (F1 mean and spread, error reductions over the baseline, significance).
"""
