"""Reaching hosts: every remote call, with a timeout and never a password prompt.

``runner`` is the one interface every layer runs a command on a host by
(``HostRunner``) and the process runner behind a job's hosts;
``remote`` runs commands over paramiko (one result per host), ``openssh``
runs the OpenSSH client in BatchMode, ``hops`` runs host-to-host ssh from
the first host, and ``launcher_ssh`` is the ``ssh`` that mlx.launch and
mpirun find first on their PATH.
"""
