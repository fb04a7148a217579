"""`mlxcluster serve`: mlx-lm's own server across the Macs (docs/serve.md).

session.py (the front opened, then what serving a prepared job keeps here)
is what cli/serve.py calls; serving.py supervises the ranks.
"""
