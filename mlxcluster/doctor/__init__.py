"""Judging a cluster: ``doctor`` drives the checks (``checks/``) over the
captures and the live measurements (``live``, ``datapath``); ``known_errors``
explains the known failure messages of MLX distributed ranks."""
