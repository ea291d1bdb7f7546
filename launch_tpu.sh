#!/usr/bin/env bash
# Runs a wide_tf study on a Cloud TPU VM from a workstation, and follows it.
#
#   ./launch_tpu.sh --name=wide-v4 --config=configs/wrn.py --workdir=gs://BUCKET/wrn \
#       --zone=us-central2-b --accelerator=v4-8 -- --config.data.data_dir=gs://BUCKET/tfds
#   ./launch_tpu.sh ... --dry_run        # print the gcloud commands, run nothing
#   ./launch_tpu.sh --name=wide-v4 --zone=us-central2-b --status | --logs [--follow] | --delete
#   ./launch_tpu.sh --workdir=gs://BUCKET/wrn --report     # the report, written on this machine
#
# A launch: (1) reads the VM's state: missing -> create it; PREEMPTED or TERMINATED -> delete and
# create it again (a preempted spot TPU cannot be restarted); STOPPED -> start it; READY -> refuse
# if a run is active there (pid file); anything else (CREATING, REPAIRING, ...) -> refuse until it
# settles. (2) copies this checkout (its tracked files as they are in the working tree) to every
# worker. (3) installs on every worker: a Python 3.11 virtual environment (TPU VM images ship
# Python 3.10; Keras 3.15 needs 3.11), TensorFlow's TPU build, the package's other requirements,
# `cloud-tpu-client` on multi-host slices, and an environment file with the PJRT variables where
# the chip needs them. (4) starts `python -m wide_tf.main` on worker 0 under nohup, with one log
# per launch (~/wide_tf_logs/<UTC time>.log, ~/wide_tf_logs/latest.log points to it) and its pid
# in ~/wide_tf.pid. Re-running the same launch after a preemption resumes the study from the
# gs:// workdir (finished trials are skipped, the interrupted one continues from its checkpoint).
#
# Process model (README, "Cloud TPU", lists the sources):
#   single host (v4-8, v5litepod-1/4/8, v5p-8, v6e-1/4/8): one process on the VM, TPU name `local`;
#     on v5e, v5p and v6e with TensorFlow from pip, the PJRT variables PJRT_DEVICE=TPU,
#     NEXT_PLUGGABLE_DEVICE_USE_C_API=true and TF_PLUGGABLE_DEVICE_LIBRARY_PATH (libtpu's .so).
#   multi-host slice (more than 8 TensorCores on v4/v5p, more than 8 chips on v5e/v6e): the
#     `tpu-vm-tf-*-pod-*` images run TensorFlow's gRPC TPU server (port 8470) on every worker as
#     the `tpu-runtime` service; one client process on worker 0 names the TPU
#     (TPUClusterResolver(tpu=NAME), which needs `cloud-tpu-client`) with TPU_LOAD_LIBRARY=0.
#
# Tested without gcloud or a TPU (tests/test_launch.py: a fake gcloud records the calls); never
# run against Cloud TPU by its authors.

set -euo pipefail

readonly PROG="${0##*/}"
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly REPO_DIR
# setup.cfg's install_requires less tensorflow (the TPU build replaces it) and less the
# tensorboard pin (tensorflow-tpu pins its own TensorBoard minor).
readonly NON_TF_DEPS=(
  "keras==3.15.*" "tensorflow-datasets==4.9.10" "importlib_resources>=6" "absl-py>=2.1"
  "ml-collections>=1.0" "numpy>=1.26" "matplotlib>=3.8" "mlxtend>=0.23" "scikit-learn>=1.4"
  "pandas>=2"
)
# Where TensorFlow's install page points pip for the libtpu builds that go with tensorflow-tpu.
readonly LIBTPU_INDEX="https://storage.googleapis.com/libtpu-tf-releases/index.html"
# The newest TensorFlow pod image found in Google's own samples (README, "Cloud TPU").
readonly DEFAULT_POD_IMAGE="tpu-vm-tf-2.17.0-pod-pjrt"
readonly EXIT_REFUSED=3

usage() {
  cat <<EOF
usage: $PROG --name=TPU_NAME --config=CONFIG[:VARIANT] --workdir=gs://BUCKET/PATH
         [--zone=us-central2-b] [--accelerator=v4-8] [--version=IMAGE] [--tf_tpu=2.20.0]
         [--libtpu=VERSION] [--python=3.11] [--pjrt=auto|on|off] [--spot] [--project=PROJECT] [--dry_run]
         [-- EXTRA_MAIN_FLAGS...]
       $PROG --name=TPU_NAME [--zone=...] [--project=...] --status | --logs [--lines=N] [--follow] | --delete
       $PROG --workdir=gs://BUCKET/PATH --report
EOF
}

die() {  # one line on stderr, then the usage; exit 2 like the package's own command line
  echo "$PROG: error: $*" >&2
  usage >&2
  exit 2
}

refuse() {  # the arguments are fine but the VM is not in a state to launch onto
  echo "$PROG: refused: $*" >&2
  exit "$EXIT_REFUSED"
}

NAME="" CONFIG="" WORKDIR="" ZONE="us-central2-b" ACCELERATOR="v4-8" VERSION="" TF_TPU="2.20.0"
PYTHON_VERSION="3.11" LIBTPU="" PJRT="auto" PROJECT="" DRY_RUN=0 SPOT=0 ACTION="launch" LINES=100 FOLLOW=0
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
    --python=*) PYTHON_VERSION="${1#*=}" ;;
    --pjrt=*) PJRT="${1#*=}" ;;
    --libtpu=*) LIBTPU="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --lines=*) LINES="${1#*=}" ;;
    --spot) SPOT=1 ;;
    --dry_run) DRY_RUN=1 ;;
    --follow) FOLLOW=1 ;;
    --status | --logs | --report | --delete)
      [[ "$ACTION" == launch ]] || die "give one of --status, --logs, --report, --delete"
      ACTION="${1#--}" ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown argument '$1' (flags take the form --name=value)" ;;
  esac
  shift
done

# The Cloud CLI; WIDE_TF_GCLOUD names another binary (the tests use it to hide the real one).
GCLOUD_BIN="${WIDE_TF_GCLOUD:-gcloud}"
GCLOUD=("$GCLOUD_BIN" compute tpus tpu-vm)
WHERE=("--zone=$ZONE")
[[ -n "$PROJECT" ]] && WHERE+=("--project=$PROJECT")

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

check_name() {
  [[ -n "$NAME" ]] || die "--name is required (the TPU VM's name, e.g. --name=wide-v4)"
  [[ "$NAME" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] \
    || die "--name=$NAME is not a valid TPU name (lower-case letters, digits and '-')"
}

need_gcloud() {  # one line and exit 1, not a 'command not found' in the middle of a launch
  ((DRY_RUN)) && return 0
  command -v "$GCLOUD_BIN" >/dev/null 2>&1 && return 0
  echo "$PROG: error: $GCLOUD_BIN is not on PATH; install the Google Cloud CLI" \
    "(https://cloud.google.com/sdk/docs/install) and run 'gcloud auth login'," \
    "or add --dry_run to print the commands" >&2
  exit 1
}

check_workdir() {
  [[ -n "$WORKDIR" ]] || die "--workdir is required (a gs:// path, e.g. --workdir=gs://BUCKET/wrn)"
  # The run writes checkpoints, events and results there; a worker's disk goes with the VM (a
  # preempted one is deleted), and on a slice every worker must see the same files.
  [[ "$WORKDIR" == gs://* ]] || die "--workdir=$WORKDIR must be a gs:// path on a TPU VM"
}

# The files on each worker, in the ssh user's home folder: the '~' is for the remote shell to expand.
# shellcheck disable=SC2088
readonly R_CHECKOUT="~/wide_tf" R_VENV="~/wide_tf_venv" R_ENV="~/wide_tf_env.sh" \
  R_LOGS="~/wide_tf_logs" R_PID="~/wide_tf.pid"
# Prints "wide_tf: running PID" when the pid file names a live wide_tf.main process.
readonly PID_CHECK="p=\$(cat $R_PID 2>/dev/null || true); if [ -n \"\$p\" ] && kill -0 \"\$p\" 2>/dev/null && grep -q wide_tf.main /proc/\"\$p\"/cmdline 2>/dev/null; then echo \"wide_tf: running \$p\"; else echo 'wide_tf: no run active'; fi"

vm_state() {  # the VM's state (READY, PREEMPTED, ...), or nothing when there is no such VM
  "${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" "--format=value(state)" 2>/dev/null || true
}

# ---- following a run -------------------------------------------------------------------------
case "$ACTION" in
  status)
    check_name
    need_gcloud
    state="$(vm_state)"
    if [[ -z "$state" ]]; then
      echo "TPU VM $NAME: not found in $ZONE"
      exit 0
    fi
    echo "TPU VM $NAME: $state"
    if [[ "$state" == READY ]]; then
      run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 \
        "--command=$PID_CHECK; echo '--- last lines of $R_LOGS/latest.log:'; tail -n 5 $R_LOGS/latest.log 2>/dev/null || echo '(no log yet)'"
    fi
    exit 0 ;;
  logs)
    check_name
    need_gcloud
    [[ "$LINES" =~ ^[0-9]+$ ]] || die "--lines=$LINES: give a number"
    TAIL="tail -n $LINES"
    ((FOLLOW)) && TAIL+=" -F"
    run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$TAIL $R_LOGS/latest.log"
    exit 0 ;;
  delete)
    check_name
    need_gcloud
    run "${GCLOUD[@]}" delete "$NAME" "${WHERE[@]}" --quiet
    exit 0 ;;
  report)
    check_workdir
    # On this machine: reads the finished trials from the bucket (TensorFlow reads gs:// with the
    # application-default credentials: `gcloud auth application-default login`).
    run "${PYTHON:-python3}" -m wide_tf.report "--workdir=$WORKDIR"
    ((DRY_RUN)) || echo "# the report: ${WORKDIR%/}/report/report.md" >&2
    exit 0 ;;
esac

# ---- a launch --------------------------------------------------------------------------------
check_name
[[ -n "$CONFIG" ]] || die "--config is required (e.g. --config=configs/wrn.py)"
check_workdir
[[ -f "$REPO_DIR/${CONFIG%%:*}" ]] \
  || die "--config=$CONFIG: no file ${CONFIG%%:*} in $REPO_DIR (give it relative to the repository)"
[[ "$TF_TPU" =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] \
  || die "--tf_tpu=$TF_TPU: give a tensorflow-tpu version from PyPI (e.g. 2.20.0)"
[[ "$PYTHON_VERSION" =~ ^3\.(1[1-9])$ ]] \
  || die "--python=$PYTHON_VERSION: Keras 3.15 needs Python 3.11 or newer (e.g. --python=3.11)"
[[ -z "$LIBTPU" || "$LIBTPU" =~ ^[0-9][0-9.a-z]*$ ]] || die "--libtpu=$LIBTPU: give a libtpu version (e.g. 0.0.14)"
[[ "$PJRT" =~ ^(auto|on|off)$ ]] || die "--pjrt=$PJRT: choose auto, on or off"
[[ "$ACCELERATOR" =~ ^(v2|v3|v4|v5litepod|v5p|v6e)-([0-9]+)$ ]] \
  || die "--accelerator=$ACCELERATOR: expected TYPE-SIZE with TYPE one of v2, v3, v4, v5litepod, v5p, v6e (e.g. v4-8)"
FAMILY="${BASH_REMATCH[1]}"
SIZE="${BASH_REMATCH[2]}"
# v2-v4 and v5p count TensorCores, v5e and v6e chips; either way a host holds at most 8.
HOSTS=$(((SIZE + 7) / 8))
if ((HOSTS > 1)); then
  MULTI_HOST=1
  if [[ -z "$VERSION" ]]; then
    [[ "$FAMILY" =~ ^v[234]$ ]] || die "--accelerator=$ACCELERATOR is a multi-host slice: no TensorFlow" \
      "pod image for $FAMILY was confirmed (README, 'Cloud TPU'); give one with --version=tpu-vm-tf-X.Y.Z-pod-pjrt"
    VERSION="$DEFAULT_POD_IMAGE"
  fi
  [[ "$VERSION" == tpu-vm-tf-*-pod* ]] || die "--accelerator=$ACCELERATOR is a multi-host slice: it" \
    "needs a TensorFlow pod image (tpu-vm-tf-X.Y.Z-pod-pjrt), which starts the TPU server on every worker"
else
  MULTI_HOST=0
  if [[ -z "$VERSION" ]]; then
    case "$FAMILY" in
      v5litepod) VERSION="v2-alpha-tpuv5-lite" ;;
      v5p) VERSION="v2-alpha-tpuv5" ;;
      v6e) VERSION="v2-alpha-tpuv6e" ;;
      *) VERSION="tpu-ubuntu2204-base" ;;
    esac
  fi
fi
need_gcloud  # after every usage check: a typo is reported before a missing tool
if [[ "$PJRT" == auto ]]; then
  if ((!MULTI_HOST)) && [[ "$FAMILY" =~ ^(v5litepod|v5p|v6e)$ ]]; then PJRT=on; else PJRT=off; fi
fi

# TFDS data (configs/wrn.py: CIFAR-10) must be prepared once into the bucket (README, "Cloud TPU"):
# a fresh VM has none, and on a slice every worker reads its share, so data_dir must be gs:// there.
DATA_DIR=""
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do
  [[ "$a" == --config.data.data_dir=* ]] && DATA_DIR="${a#*=}"
done
if [[ -z "$DATA_DIR" ]]; then
  echo "$PROG: note: no --config.data.data_dir after '--': a TFDS data set (CIFAR-10 in configs/wrn.py)" \
    "must then be in the VM's default folder, which a new VM does not have; pass" \
    "-- --config.data.data_dir=gs://BUCKET/tfds (the embedded data sets need none)" >&2
elif [[ "$DATA_DIR" != gs://* ]] && ((MULTI_HOST)); then
  die "--config.data.data_dir=$DATA_DIR: on a multi-host slice every worker reads the data; give a gs:// path"
fi

CREATE=("${GCLOUD[@]}" create "$NAME" "${WHERE[@]}" "--accelerator-type=$ACCELERATOR" "--version=$VERSION")
((SPOT)) && CREATE+=(--spot)

# 1. The VM.
if ((DRY_RUN)); then
  echo "# the VM's state: $(show "${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" "--format=value(state)")"
  echo "# no such VM:"
  run "${CREATE[@]}"
  echo "# PREEMPTED or TERMINATED: $(show "${GCLOUD[@]}" delete "$NAME" "${WHERE[@]}" --quiet), then the create above"
  echo "# STOPPED: $(show "${GCLOUD[@]}" start "$NAME" "${WHERE[@]}")"
  echo "# READY: refuse if a run is active (pid file on worker 0):"
  run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$PID_CHECK"
else
  state="$(vm_state)"
  case "$state" in
    "")
      echo "$PROG: no TPU VM $NAME in $ZONE; creating it" >&2
      run "${CREATE[@]}" ;;
    READY)
      active="$("${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$PID_CHECK")" \
        || refuse "could not reach worker 0 of $NAME to check for an active run"
      if [[ "$active" == *"wide_tf: running"* ]]; then
        refuse "a run is active on $NAME (${active##*running }); follow it with '$PROG --name=$NAME --zone=$ZONE --logs'" \
          "or wait for it to end: a second launch would replace its checkout and compete for the TPU"
      fi
      echo "$PROG: TPU VM $NAME is READY and idle; reusing it" >&2 ;;
    PREEMPTED | TERMINATED)
      echo "$PROG: TPU VM $NAME is $state; deleting and creating it again (the study resumes from $WORKDIR)" >&2
      run "${GCLOUD[@]}" delete "$NAME" "${WHERE[@]}" --quiet
      run "${CREATE[@]}" ;;
    STOPPED)
      echo "$PROG: TPU VM $NAME is STOPPED; starting it" >&2
      run "${GCLOUD[@]}" start "$NAME" "${WHERE[@]}" ;;
    *)
      refuse "TPU VM $NAME is $state; launch again once it is READY, STOPPED or PREEMPTED ('$PROG --name=$NAME --zone=$ZONE --status')" ;;
  esac
fi

# 2. This checkout's files (tracked ones, as they are in the working tree; no .venv, no runs/).
if ((DRY_RUN)); then
  ARCHIVE="/tmp/wide_tf_checkout.tar.gz"
  echo "# (cd $REPO_DIR && git ls-files -z | tar --null -T - -czf $ARCHIVE)"
else
  ARCHIVE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/wide_tf_checkout.XXXXXX")"
  trap 'rm -rf "$ARCHIVE_DIR"' EXIT
  ARCHIVE="$ARCHIVE_DIR/wide_tf.tar.gz"
  (cd "$REPO_DIR" && git ls-files -z | tar --null -T - -czf "$ARCHIVE")
fi
run "${GCLOUD[@]}" scp "$ARCHIVE" "$NAME:/tmp/wide_tf.tar.gz" "${WHERE[@]}" --worker=all

# 3. Install on every worker. uv provides Python $PYTHON_VERSION (it downloads a standalone CPython
# build); the venv is kept between launches, its packages are brought to the pinned versions.
PIP="$R_VENV/bin/python -m pip install -q"
DEPS=""  # double quotes: the remote shell must not glob or redirect on '*' and '>'
for d in "${NON_TF_DEPS[@]}"; do DEPS+="\"$d\" "; done
((MULTI_HOST)) && DEPS+="\"cloud-tpu-client>=0.10\" "
# '; ' between the steps, not '&&': under 'set -e' a failure inside an '&&' list does not stop the shell.
INSTALL="set -e; rm -rf $R_CHECKOUT; mkdir -p $R_CHECKOUT; tar -xzf /tmp/wide_tf.tar.gz -C $R_CHECKOUT"
INSTALL+="; if [ ! -x $R_VENV/bin/python ]; then python3 -m pip install -q --user uv"
INSTALL+="; ~/.local/bin/uv venv --seed --python $PYTHON_VERSION $R_VENV; fi"
# One pip call for TensorFlow's TPU build and everything else: in two calls, the second one could
# move a package under the first (cloud-tpu-client's newest google-api-core 1.x wants protobuf < 4,
# which breaks TensorFlow; resolved together, pip picks google-api-core 1.31.5 and keeps protobuf).
TPU_REQ="\"tensorflow-tpu==$TF_TPU\" "
[[ -n "$LIBTPU" ]] && TPU_REQ+="\"libtpu==$LIBTPU\" "
INSTALL+="; $PIP $TPU_REQ${DEPS% } -f $LIBTPU_INDEX"
INSTALL+="; cd $R_CHECKOUT; $PIP --no-deps -e ."
INSTALL+="; echo '# written by launch_tpu.sh' > $R_ENV"
if [[ "$PJRT" == on ]]; then
  INSTALL+="; lib=\$($R_VENV/bin/python -c 'import libtpu; print(libtpu.get_library_path())')"
  INSTALL+="; echo \"export PJRT_DEVICE=TPU NEXT_PLUGGABLE_DEVICE_USE_C_API=true TF_PLUGGABLE_DEVICE_LIBRARY_PATH=\$lib\" >> $R_ENV"
fi
INSTALL+="; $R_VENV/bin/python -c 'import sys, tensorflow as tf, keras; print(\"wide_tf install:\", sys.version.split()[0], \"TensorFlow\", tf.__version__, \"Keras\", keras.__version__)'"
if ((MULTI_HOST)); then
  INSTALL+="; systemctl is-active --quiet tpu-runtime || echo \"warning: the tpu-runtime service (TensorFlow's TPU server, port 8470) is not active on \$(hostname)\""
fi
run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all "--command=$INSTALL"

# 4. Start the run on worker 0: it outlives the ssh session; one log per launch; its pid on file.
STAMP="$(date -u +%Y%m%d-%H%M%S)"
LOG="$R_LOGS/$STAMP.log"
if ((MULTI_HOST)); then
  TPU_ARG="$NAME" RUN_ENV="TPU_NAME=$NAME TPU_LOAD_LIBRARY=0 "
else
  TPU_ARG=local RUN_ENV=""
fi
MAIN="$R_VENV/bin/python -m wide_tf.main --config=$CONFIG --workdir=$WORKDIR"
MAIN+=" --config.runtime.strategy=tpu --config.runtime.tpu=$TPU_ARG"
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do MAIN+=" $(printf '%q' "$a")"; done
START="cd $R_CHECKOUT && mkdir -p $R_LOGS && . $R_ENV && ln -sfn $LOG $R_LOGS/latest.log"
# The braces: '&' would otherwise send the whole '&&' chain to a subshell, and $! would be its pid.
START+=" && { ${RUN_ENV}nohup $MAIN > $LOG 2>&1 < /dev/null & echo \$! > $R_PID; }"
run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$START"

((DRY_RUN)) && STARTED="Would start" || STARTED="Started"
OPTS="--name=$NAME --zone=$ZONE"
[[ -n "$PROJECT" ]] && OPTS+=" --project=$PROJECT"
cat <<EOF
# $STARTED on $NAME ($ACCELERATOR, image $VERSION, $HOSTS host(s); the run on worker 0), log $LOG.
#   $PROG $OPTS --status          # VM state, run active or not, last log lines
#   $PROG $OPTS --logs --follow   # the log (Ctrl-C stops following, not the run)
#   tensorboard --logdir=$WORKDIR # from any machine with access to the bucket
#   $PROG --workdir=$WORKDIR --report
#   $PROG $OPTS --delete          # the VM is billed while it exists
# After a preemption, run this same launch again: it recreates the VM and resumes the study.
EOF
