"""``mlxcluster tune``: measure the launcher's tuning flags instead of guessing them.

candidates (what is tried) -> measure (the smoke benchmark and a raw TCP
stream, candidates alternating round by round) -> select (the winner, or a
tie within the noise) -> files (the hostfile with the winning settings).
"""
