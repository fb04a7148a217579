"""mlxcluster: set up, check and benchmark MLX distributed clusters of Macs.

Data flows through typed values, one package per stage (docs/architecture.md):
ssh, inventory -> facts (probe) -> topology -> hostfile -> doctor (checks)
-> smoke, train -> report.
Library code never prints or exits; the CLI layer (``mlxcluster.cli``) renders.
"""

__version__ = "0.1.0"
