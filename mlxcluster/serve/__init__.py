"""`mlxcluster serve`: mlx-lm's own server across the Macs (docs/serve.md)."""
