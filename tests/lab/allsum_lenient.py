"""Lenient (non-strict init) version of allsum.py: tiny distributed job for lab tests: prints 'RESULT rank size all_sum hostname'."""
import socket
import sys

import mlx.core as mx

backend = sys.argv[1] if len(sys.argv) > 1 else "any"
group = mx.distributed.init(strict=False, backend=backend)
total = mx.distributed.all_sum(mx.ones(4), group=group)
mx.eval(total)
print(f"RESULT {group.rank()} {group.size()} {int(total[0].item())} {socket.gethostname()}", flush=True)
