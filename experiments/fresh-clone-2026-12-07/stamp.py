"""Prefix every line of stdin with the UTC wall clock and the seconds since the first line."""

import sys
import time

t0 = time.time()
for line in sys.stdin:
    now = time.time()
    sys.stdout.write(f"{time.strftime('%H:%M:%S', time.gmtime(now))} +{now - t0:7.1f}s | {line}")
    sys.stdout.flush()
