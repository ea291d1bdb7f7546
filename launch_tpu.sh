#!/usr/bin/env bash
# Runs a wide_tf study on Cloud TPU VMs from a workstation: the launcher is
# `python -m wide_tf.launch` (wide_tf/launch/); docs/tpu.md is the guide.
#   ./launch_tpu.sh --name=wide --config=configs/wrn.py --workdir=gs://BUCKET/wrn --watch
#   ./launch_tpu.sh ... --dry_run     # the checks here and every gcloud command; calls nothing
# PYTHON names the interpreter (one with absl-py and ml-collections: `pip install -e .`).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m wide_tf.launch "$@"
