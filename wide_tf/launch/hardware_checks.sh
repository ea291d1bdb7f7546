#!/usr/bin/env bash
# The checks the launcher runs here before any VM, for every documented slice and GPU at once,
# printed to stdout: configs/wrn.py and its :check variant through the dry run at 4, 8 and 16
# replicas, then with the memory model of each slice, one GPU, and the memory model's table (the
# largest per-replica batch of every member on every accelerator). CPU only, no TensorFlow.
#   bash wide_tf/launch/hardware_checks.sh [PYTHON]
cd "$(dirname "$0")/../.." && export PYTHONPATH="$PWD"
py="${1:-python3}"
run() {
  echo "\$ python $*"
  "$py" "$@" 2>&1
  echo "[exit $?]"
}
for cfg in configs/wrn.py configs/wrn.py:check; do
  for n in 4 8 16; do run -m wide_tf.main --config=$cfg --dry_run --replicas=$n; done
  for acc in v4-8:4 v4-16:8 v4-32:16 v5litepod-4:4 v5litepod-8:8 v5litepod-16:16 v6e-4:4 v6e-8:8; do
    run -m wide_tf.main --config=$cfg --dry_run --replicas=${acc#*:} --accelerator=${acc%-*}
  done
done
# One GPU holds the whole batch: exit 3 is the config as written (train.max_device_batch=0); a
# GPU run with 0 gets the suggested cap by itself (engine/tf/strategy.max_device_batch).
for acc in a100-40gb a100-80gb h100-80gb h200 v100-16gb t4 l4; do
  run -m wide_tf.main --config=configs/wrn.py --dry_run --replicas=1 --accelerator=$acc
done
run -m wide_tf.checks.hardware_fit --config=configs/wrn.py --table
run -m wide_tf.checks.hardware_fit --config=configs/wrn.py:check --table
