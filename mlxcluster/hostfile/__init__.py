"""What launchers read: ``hostfile`` (the MLX and MPI hostfile formats),
``hostfile_generate`` (hostfiles from inventory and topology) and ``ipplan``
(point-to-point Thunderbolt addresses)."""
