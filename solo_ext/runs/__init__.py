"""A run's files: loading a pretrained run for evaluation (``load``), its checkpoints
(``checkpoint``), resuming after a kill (``resume``), the environment it records in ``args.json``
(``environment``) and its backbone carried into an evaluation config (``backbone``)."""
