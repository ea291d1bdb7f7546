#!/usr/bin/env bash
# Starts a wide_tf study (or single run) on a Cloud TPU VM: creates the VM if it does not exist,
# copies this checkout to every worker, installs the package there, and starts
# `python -m wide_tf.main` under nohup with the log in the worker's home folder.
#
#   ./launch_tpu.sh --name=wide-v4 --config=configs/wrn.py --workdir=gs://BUCKET/wrn
#   ./launch_tpu.sh --name=wide-v4 --config=configs/wrn.py --workdir=gs://BUCKET/wrn --dry_run
#   ./launch_tpu.sh ... -- --config.data.data_dir=gs://BUCKET/tfds --shard=0/2   # extra main flags
#
# Only --dry_run is tested (tests/test_launch.py): the project has no TPU and no gcloud to run it on.
#
# TensorFlow on a TPU VM. TensorFlow reaches a TPU only through the `tensorflow-tpu` wheel and the
# libtpu build released with it (the `libtpu` wheel on PyPI alone is the JAX runtime); the package
# pins tensorflow==2.21.*, for which no tensorflow-tpu wheel may exist yet (2.20.0 was the newest
# when this was written). So the package is installed with --no-deps, and TensorFlow comes from:
#   --tf_tpu=VERSION  (default 2.20.0) `pip install tensorflow-tpu==VERSION` on a base image;
#   --tf_tpu=image    the TensorFlow that a tpu-vm-tf-* runtime image (--version=...) ships.
# Either way the run uses a TensorFlow other than the pinned one: the custom loop and LARS use
# Keras 3 internals (DESIGN.md), so check the first log lines (the Runtime line, the first steps).
#
# Multi-host slices (more than 8 TensorCores, e.g. v4-16): TensorFlow drives a pod slice from one
# process on worker 0 that names the TPU (TPUClusterResolver(tpu=NAME), TPU_LOAD_LIBRARY=0); the
# other workers serve their chips. The script does that, but it is untested on pods.

set -euo pipefail

readonly PROG="${0##*/}"
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly REPO_DIR
# The non-TensorFlow requirements of setup.cfg (install_requires less tensorflow), installed
# beside the TPU build of TensorFlow; TensorBoard unpinned, so pip keeps one that build accepts.
readonly NON_TF_DEPS=(
  "keras==3.15.*" "tensorboard" "tensorflow-datasets==4.9.10" "importlib_resources>=6"
  "absl-py>=2.1" "ml-collections>=1.0" "numpy>=1.26" "matplotlib>=3.8" "mlxtend>=0.23"
  "scikit-learn>=1.4"
)
readonly LIBTPU_INDEX="https://storage.googleapis.com/libtpu-tf-releases/index.html"

usage() {
  cat <<EOF
usage: $PROG --name=TPU_NAME --config=CONFIG[:VARIANT] --workdir=gs://BUCKET/PATH
         [--zone=us-central2-b] [--accelerator=v4-8] [--version=tpu-ubuntu2204-base]
         [--tf_tpu=2.20.0|image] [--project=PROJECT] [--dry_run] [-- EXTRA_MAIN_FLAGS...]
EOF
}

die() {  # one line on stderr, then the usage; exit 2 like the package's own command line
  echo "$PROG: error: $*" >&2
  usage >&2
  exit 2
}

NAME="" CONFIG="" WORKDIR="" ZONE="us-central2-b" ACCELERATOR="v4-8"
VERSION="tpu-ubuntu2204-base" TF_TPU="2.20.0" PROJECT="" DRY_RUN=0
EXTRA=()
while (($#)); do
  case "$1" in
    --name=*) NAME="${1#*=}" ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --accelerator=*) ACCELERATOR="${1#*=}" ;;
    --version=*) VERSION="${1#*=}" ;;
    --tf_tpu=*) TF_TPU="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --dry_run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown argument '$1' (flags take the form --name=value)" ;;
  esac
  shift
done

[[ -n "$NAME" ]] || die "--name is required (the TPU VM's name, e.g. --name=wide-v4)"
[[ -n "$CONFIG" ]] || die "--config is required (e.g. --config=configs/wrn.py)"
[[ -n "$WORKDIR" ]] || die "--workdir is required (a gs:// path, e.g. --workdir=gs://BUCKET/wrn)"
[[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] \
  || die "--name=$NAME is not a valid TPU name (lower-case letters, digits and '-')"
# The workers write checkpoints, events and results there, and a worker's disk goes with the VM
# (on a pod slice each worker would have its own): the workdir must be in a bucket.
[[ "$WORKDIR" == gs://* ]] || die "--workdir=$WORKDIR must be a gs:// path on a TPU VM"
[[ -f "$REPO_DIR/${CONFIG%%:*}" ]] \
  || die "--config=$CONFIG: no file ${CONFIG%%:*} in $REPO_DIR (give it relative to the repository)"
[[ "$TF_TPU" == image || "$TF_TPU" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] \
  || die "--tf_tpu=$TF_TPU: give a tensorflow-tpu version (e.g. 2.20.0) or 'image'"
if [[ "$TF_TPU" == image && "$VERSION" != tpu-vm-tf-* ]]; then
  die "--tf_tpu=image needs a TensorFlow runtime image, e.g. --version=tpu-vm-tf-2.16.1-pjrt"
fi

# TensorCores from the accelerator's suffix (v4-8 -> 8); more than 8 is a multi-host slice.
CORES="${ACCELERATOR##*-}"
[[ "$CORES" =~ ^[0-9]+$ ]] || die "--accelerator=$ACCELERATOR: expected TYPE-CORES, e.g. v4-8"
if ((CORES > 8)); then
  RUN_WORKER=0 TPU_ARG="$NAME" RUN_ENV="TPU_NAME=$NAME TPU_LOAD_LIBRARY=0 "
else
  RUN_WORKER=all TPU_ARG=local RUN_ENV=""
fi

GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=("--zone=$ZONE")
[[ -n "$PROJECT" ]] && WHERE+=("--project=$PROJECT")
REMOTE_DIR="wide_tf"
LOG="wide_tf_${NAME}.log"
ARCHIVE="/tmp/wide_tf_${NAME}.tar.gz"

show() {  # a command as one shell line (words quoted only where needed)
  local out="" w
  for w in "$@"; do
    if [[ "$w" =~ ^[-A-Za-z0-9_./:=@,+%]+$ ]]; then
      out+="$w "
    else
      out+="'${w//\'/\'\\\'\'}' "
    fi
  done
  echo "${out% }"
}

run() {  # runs a command, or prints it under --dry_run
  if ((DRY_RUN)); then
    show "$@"
  else
    echo "+ $(show "$@")" >&2
    "$@"
  fi
}

# 1. The VM, unless it exists (a second launch reuses it: e.g. the next shard of a study).
if ((DRY_RUN)); then
  echo "# if '${GCLOUD[*]} describe $NAME' finds no TPU VM:"
  run "${GCLOUD[@]}" create "$NAME" "${WHERE[@]}" "--accelerator-type=$ACCELERATOR" "--version=$VERSION"
elif "${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" >/dev/null 2>&1; then
  echo "TPU VM $NAME exists in $ZONE; reusing it." >&2
else
  run "${GCLOUD[@]}" create "$NAME" "${WHERE[@]}" "--accelerator-type=$ACCELERATOR" "--version=$VERSION"
fi

# 2. This checkout's files (tracked ones, as they are in the working tree; no .venv, no runs/).
if ((DRY_RUN)); then
  echo "# (cd $REPO_DIR && git ls-files -z | tar --null -T - -czf $ARCHIVE)"
else
  (cd "$REPO_DIR" && git ls-files -z | tar --null -T - -czf "$ARCHIVE")
fi
run "${GCLOUD[@]}" scp "$ARCHIVE" "$NAME:/tmp/wide_tf.tar.gz" "${WHERE[@]}" --worker=all

# 3. Install on every worker (see the header for why TensorFlow is installed apart).
if [[ "$TF_TPU" == image ]]; then
  TF_STEP="python3 -c \"import tensorflow as tf; print(tf.__version__)\""
else
  TF_STEP="python3 -m pip install -q \"tensorflow-tpu==$TF_TPU\" -f $LIBTPU_INDEX"
fi
DEPS=""  # double quotes: the remote shell must not glob or redirect on '*' and '>'
for d in "${NON_TF_DEPS[@]}"; do DEPS+="\"$d\" "; done
INSTALL="set -e; rm -rf ~/$REMOTE_DIR && mkdir -p ~/$REMOTE_DIR && tar -xzf /tmp/wide_tf.tar.gz -C ~/$REMOTE_DIR"
INSTALL+=" && cd ~/$REMOTE_DIR && $TF_STEP && python3 -m pip install -q ${DEPS% }"
INSTALL+=" && python3 -m pip install -q --no-deps -e ."
run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all "--command=$INSTALL"

# 4. Start the run; it outlives the ssh session and writes its log beside the checkout.
MAIN="python3 -m wide_tf.main --config=$CONFIG --workdir=$WORKDIR"
MAIN+=" --config.runtime.strategy=tpu --config.runtime.tpu=$TPU_ARG"
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do MAIN+=" $(printf '%q' "$a")"; done
START="cd ~/$REMOTE_DIR && ${RUN_ENV}nohup $MAIN > ~/$LOG 2>&1 < /dev/null &"
run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" "--worker=$RUN_WORKER" "--command=$START"

((DRY_RUN)) && STARTED="Would start" || STARTED="Started"
cat <<EOF
# $STARTED on $NAME (worker $RUN_WORKER). Follow the log:
#   ${GCLOUD[*]} ssh $NAME ${WHERE[*]} --worker=0 --command='tail -f ~/$LOG'
# TensorBoard (from any machine with access to the bucket):
#   tensorboard --logdir=$WORKDIR
# The report, when the study has finished:
#   python -m wide_tf.report --workdir=$WORKDIR
# Delete the VM when done (it is billed while it exists):
#   ${GCLOUD[*]} delete $NAME ${WHERE[*]}
EOF
