"""Lab job for the stall tests: rank 1 sleeps before its all_sum, the others
wait in the all_sum for it (prints 'WAITING rank' just before)."""
import sys
import time

import mlx.core as mx


def before_all_sum():
    time.sleep(600)


group = mx.distributed.init(strict=True, backend=sys.argv[1] if len(sys.argv) > 1 else "ring")
if group.rank() == 1:
    before_all_sum()
print(f"WAITING {group.rank()}", flush=True)
total = mx.distributed.all_sum(mx.ones(4), group=group)
mx.eval(total)  # ALL_SUM_LINE
print(f"RESULT {group.rank()} {int(total[0].item())}", flush=True)
