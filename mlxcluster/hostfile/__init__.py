"""What launchers read: ``hostfile`` (the MLX and MPI hostfile formats),
``hostfile_generate`` (hostfiles from inventory and topology), ``ipplan``
(point-to-point Thunderbolt addresses) and ``jaccl_plan`` (JACCL's hostfile,
env and per-host verdict from captures)."""
