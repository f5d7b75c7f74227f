"""The pipeline's stages, one module each, in the order ``dvc.yaml`` runs them.

Each module has ``run(cfg, out_dir)``, the stage itself on a composed config, and ``main(conf_dir,
argv)``, its command line (``pipelines/<stage>.py`` calls it; :func:`elmolab.core.config.run_stage`
explains the two ways a stage runs). The libraries the stages use lie below this package.

- :mod:`~elmolab.stages.prepare`: raw corpora -> sentence shards, vocabulary, statistics
- :mod:`~elmolab.stages.pretrain`: the biLM (and its random-initialisation control)
- :mod:`~elmolab.stages.token_control`: the trained token layer with random LSTMs
- :mod:`~elmolab.stages.extract`: every layer's features of every probing dataset, per encoder
- :mod:`~elmolab.stages.probe`: one task's probes on every feature mode, encoder and seed
- :mod:`~elmolab.stages.taskmodel`: a tagger with and without ELMo's mix
- :mod:`~elmolab.stages.polysemy`: nearest neighbours of polysemous words (the ELMo paper's Table 4)
- :mod:`~elmolab.stages.report`: the tables, figures and HTML report
"""
