"""The configuration of a training run.

- :mod:`distmb.config.options`: declaring options as dataclass fields, and the parser,
  parsing and validation derived from the declarations (generic);
- :mod:`distmb.config.train_options`: the options of ``python -m distmb.train``, in groups;
- :mod:`distmb.config.train`: :class:`~distmb.config.train.TrainConfig`, its validation, the
  parser and the resume lists;
- :mod:`distmb.config.settings`: typed frozen views of a configuration, one per concern;
- :mod:`distmb.config.constants`: defaults, allowed values and group titles;
- :mod:`distmb.config.flags_doc`: ``docs/flags.md`` (``python -m distmb.config --markdown``);
- :mod:`distmb.config.recipes`: documented hyper-parameters.
"""
