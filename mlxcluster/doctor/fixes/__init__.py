"""``doctor --fix``: what a failing check's fix changes, applied and undone.

``plan`` (the types a check's fix declares and the plan built from a
report), ``inventory_edit`` (one env variable set in the inventory's text),
``journal`` (every change written down, where it is kept), ``apply`` (the
plan applied host by host; a journal undone), ``outcome`` (what one run
did, for the HTML report), and one module per fix:
``env`` (the inventory's env), ``host_keys`` (unknown host keys),
``host_to_host`` (every host's key trusted by the others, their host
keys by it), ``macos`` (``sudo -n`` commands: the Thunderbolt Bridge, the
Thunderbolt IP plan, the firewall), ``mlx_version`` (one mlx on every host),
``mlx_lm_version`` (one mlx-lm, for a job that runs it; both on
``same_version``: one version of a distribution everywhere) and
``trainer_deps`` (what the trainer imports), all from wheels fetched here
(``wheels``: fetched, sent over SSH, installed with no index), each
version chosen by one rule (``version_choice``: a tie goes to this
machine's version, else the newest).
"""
