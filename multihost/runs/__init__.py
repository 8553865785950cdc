"""A run's own parts, on the hosts and in its record: the launch, each host's log brought back
(``stream``), identical output gathered across hosts (``gather``), ``run.json`` (``record``,
written by ``files``, the one writer of the records kept here); and after the fact: past runs
found, asked, synced and cleaned (``past``), their files pulled (``pull``)."""
