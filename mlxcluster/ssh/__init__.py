"""Reaching hosts: every remote call, with a timeout and never a password prompt.

``remote`` runs commands over paramiko (one result per host), ``openssh``
runs the OpenSSH client in BatchMode, ``hops`` runs host-to-host ssh from
the first host, and ``launcher_ssh`` is the ``ssh`` that mlx.launch and
mpirun find first on their PATH.
"""
