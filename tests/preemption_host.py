"""One host of tests/engine/test_preemption_hosts.py: a JAX process of a two-process
jax.distributed run on localhost that runs a stand-in training loop (host loops of 10 steps) and
stops where engine/preemption.py's agreement says. Prints `ready` once its loop runs, then
`stopped at <step>` (or `finished at <step>`)."""

import os
import sys
import time

import jax

from wide_tf.engine import preemption

jax.distributed.initialize(
    num_processes=int(os.environ["JAX_NUM_PROCESSES"]), process_id=int(os.environ["JAX_PROCESS_ID"])
)
preemption.install()
agree = sys.argv[1] == "agree"
if agree:
    preemption.set_collective(*preemption.jax_collective())
step = 0
for loop in range(400):
    step += 10
    if loop == 2:
        print("ready", flush=True)
    time.sleep(0.05)
    stop = preemption.stop_agreed(step) if agree else preemption.requested()
    if stop:
        print(f"stopped at {step}", flush=True)
        break
else:
    print(f"finished at {step}", flush=True)
jax.distributed.shutdown() if agree else None
