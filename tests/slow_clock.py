"""`python tests/slow_clock.py MAIN_FLAGS...`: runs `python -m wide_tf.main MAIN_FLAGS...` with its
wall clock stepped WIDE_TF_CLOCK_OFFSET_S seconds (positive: forward, as after an NTP step or a
VM's clock set after a migration; negative: behind): time.time is shifted, the boot clock
(CLOCK_BOOTTIME, every process of a boot shares it) is not. WIDE_TF_LEASE_S, when set, shortens
the claims' lease to that many seconds (a heartbeat every quarter of it), so that a stopped
worker loses its group within a test. Used by tests/study/test_claims.py."""

import os
import sys
import time

if __name__ == "__main__":
    offset = float(os.environ.get("WIDE_TF_CLOCK_OFFSET_S", "0"))
    real_time = time.time
    time.time = lambda: real_time() + offset

    from wide_tf.store import claims

    if os.environ.get("WIDE_TF_LEASE_S"):
        claims.STALE_S = float(os.environ["WIDE_TF_LEASE_S"])
        claims.HEARTBEAT_S = claims.STALE_S / 4
    from wide_tf import main

    sys.argv = ["wide_tf.main", *sys.argv[1:]]
    main.run()
