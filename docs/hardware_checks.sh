#!/usr/bin/env bash
# Produces docs/hardware_checks.txt (issue 24): the dry runs and the memory model, on this machine.
cd "$(dirname "$0")/.." && export PYTHONPATH="$PWD"
out=docs/hardware_checks.txt
run() {
  echo "\$ $*"
  "$@" 2>&1 | grep -v -E '^(WARNING: All log|I0000|E0000|W0000)'
  echo "[exit ${PIPESTATUS[0]}]"
  echo
}
{
echo "# Hardware checks for issue 24, produced on CPU (no TPU, no GPU here), branch h-hw2 at $(git rev-parse --short HEAD)"
echo "# $(date -u +%Y-%m-%dT%H:%MZ); python $(python -c 'import sys;print(sys.version.split()[0])')"
echo
echo "## 1. Dry runs at 4, 8 and 16 replicas: configs/wrn.py and its :check variant"
echo
for cfg in configs/wrn.py configs/wrn.py:check; do
  for n in 4 8 16; do
    run python -m wide_tf.main --config=$cfg --dry_run --replicas=$n
  done
done
echo "## 2. The same with the memory model of a slice (v4-8/16/32 = 4/8/16 replicas; v5litepod and v6e: one chip a replica)"
echo
for cfg in configs/wrn.py configs/wrn.py:check; do
  for acc in v4-8:4 v4-16:8 v4-32:16 v5litepod-4:4 v5litepod-8:8 v5litepod-16:16 v6e-4:4 v6e-8:8 v6e-16:16; do
    run python -m wide_tf.main --config=$cfg --dry_run --replicas=${acc#*:} --accelerator=${acc%:*}
  done
done
echo "## 3. One GPU (one worker per GPU holds the whole batch)"
echo "# exit 3 is the config as written (train.max_device_batch=0); a GPU run with 0 gets the"
echo "# suggested cap by itself (engine/tf/strategy.max_device_batch) and records it in result.json's"
echo "# batch_plan."
echo
for acc in a100-40gb a100-80gb h100-80gb h200 v100-16gb t4 l4; do
  run python -m wide_tf.main --config=configs/wrn.py --dry_run --replicas=1 --accelerator=$acc
done
echo "## 4. The memory model's table: the largest per-replica batch of every member on every accelerator"
echo
run python -m wide_tf.checks.hardware_fit --config=configs/wrn.py --table
run python -m wide_tf.checks.hardware_fit --config=configs/wrn.py:check --table
} > $out
