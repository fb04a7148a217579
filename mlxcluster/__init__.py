"""mlxcluster: set up, check and benchmark MLX distributed clusters of Macs.

Data flows through typed values, one module per stage:
inventory -> facts (probe) -> checks (doctor) -> hostfile -> smoke -> trainer.
Library code never prints or exits; the CLI layer (``mlxcluster.cli``) renders.
"""

__version__ = "0.1.0"
