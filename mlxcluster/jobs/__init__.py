"""Jobs: run one program on every rank of a cluster, and nothing else.

A job (hosts, backend, program, run id) goes through one path, whoever
starts it (``mlxcluster smoke``, ``train``, ``run``): plan the launcher
command (``plan``), start it and read its lines (``process``), watch every
rank (``watch``, ``stall``), stop every rank on every host and sweep them for
the run id (``cleanup``). ``rank_wrapper`` runs on the hosts, under each
rank's python; this package's ``__init__`` therefore imports nothing.
"""
