"""How a run ended, as values (``records``: ``HostResult``, ``RunResult`` and the rest), their
faces (``faces``: the one host row, the verdict, plain text and HTML) and where a JAX
process's start went (``phases``). Pure: no I/O beyond reading a log, no rich."""
