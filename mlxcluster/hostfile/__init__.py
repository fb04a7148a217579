"""What launchers read: ``hostfile`` (the MLX and MPI hostfile formats),
``hostfile_generate`` (hostfiles from inventory and topology), ``generation``
(one `hostfile generate`: its request in, the files written, notes,
warnings and IP plan out), ``ipplan``
(point-to-point Thunderbolt addresses) and ``jaccl_plan`` (JACCL's hostfile,
env and per-host verdict from captures)."""
