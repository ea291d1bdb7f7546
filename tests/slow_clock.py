"""`python tests/slow_clock.py MAIN_FLAGS...`: runs `python -m wide_tf.main MAIN_FLAGS...` as if on
another machine whose clock runs WIDE_TF_CLOCK_OFFSET_S seconds off (negative: behind): time.time
is shifted (time.monotonic is not, as on a real host), and the claims carry another boot's
identity (another kernel). Used by tests/study/test_claims.py (a slow-clock host)."""

import os
import sys
import time

if __name__ == "__main__":
    offset = float(os.environ.get("WIDE_TF_CLOCK_OFFSET_S", "-180"))
    real_time = time.time
    time.time = lambda: real_time() + offset

    from wide_tf.store import claims

    other = {"boot": "boot-of-the-slow-host", "pidns": claims.machine_identity()["pidns"]}
    claims.machine_identity = lambda: other
    from wide_tf import main

    sys.argv = ["wide_tf.main", *sys.argv[1:]]
    main.run()
