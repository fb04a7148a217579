"""``mlxcluster serve``: a model served across the hosts by mlx-lm's own server."""
