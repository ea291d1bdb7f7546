#!/usr/bin/env bash
# Runs a wide_tf study on Cloud TPU VMs from a workstation, follows it, brings it back after a
# preemption and deletes the VM when it is done. docs/tpu.md is the guide and lists the sources.
#
#   ./launch_tpu.sh --name=wide --config=configs/wrn.py --workdir=gs://BUCKET/wrn --shards=4 \
#       --spot --queued --watch --delete_when_done -- --config.data.data_dir=gs://BUCKET/tfds
#   ./launch_tpu.sh ... --dry_run        # validate here, print the gcloud commands, call nothing
#   ./launch_tpu.sh --name=wide-0 [--zone=...] --status | --logs [--follow] | --delete
#   ./launch_tpu.sh --workdir=gs://BUCKET/wrn --report     # the report, written on this machine
#
# A launch: (0) checks the arguments (a safe alphabet for --workdir and --config, Google's slice
# sizes, the image) and the config on this machine, with the VM's own flags, for the replica count
# of --accelerator and against one replica's memory (`python -m wide_tf.main ... --dry_run
# --replicas=N --accelerator=FAMILY`: no TensorFlow, no VM; with --check its :check variant too),
# and refuses it there.
# (1) reads the VM's state: missing -> create it (or queue it, --queued); PREEMPTED or TERMINATED
# -> delete and create it again with the same spot/on-demand choice (a preempted spot TPU cannot be
# restarted); STOPPED -> start it; READY -> refuse if a run is active there (pid file) unless
# --watch, which then follows it; anything else (CREATING, REPAIRING, ...) -> refuse until it
# settles. (2) copies this checkout (its tracked files as they are in the working tree, and the
# config file even if git does not track it) to every worker. (3) installs on every worker: a
# Python 3.11 virtual environment (TPU VM images ship 3.10; Keras 3.15 needs 3.11), TensorFlow's
# TPU build with the libtpu its wheel pairs with it, the package's other requirements,
# `cloud-tpu-client` on multi-host slices, and an environment file with the PJRT variables where
# the single host runs PJRT (every generation). (--check) initialises the TPU system, prints its replica count, runtime path,
# libtpu version and device memory, and runs the config's :check variant before the study. (4) starts `python -m wide_tf.main` on worker 0 under
# nohup, with one log per launch (~/wide_tf_logs/<UTC time>.log, latest.log points to it; copied
# to WORKDIR/logs/NAME/ when the run ends), its pid in ~/wide_tf.pid and its exit status in
# ~/wide_tf.exit, and checks that the process is alive. Steps (2) to (4) run under limits
# (WIDE_TF_*_TIMEOUT_S). (--watch) polls until the study is done, launching again after a
# preemption and failing a run whose log stops changing (--stall_minutes); --delete_when_done
# deletes the VM however the launch ends, from the first launch on (--keep_on_failure: not after a
# failure); a failure that leaves a VM prints the billing line. --shards=N: N VMs of the whole
# study, its groups dealt from the workdir's one claim pool.
#
# Process model (docs/tpu.md lists the sources):
#   single host (v2-8, v3-8, v4-8, v5litepod-1/4/8, v5p-8, v6e-1/4/8): one process on the VM, TPU
#     name `local`; TensorFlow from pip (tensorflow-tpu 2.19.1 + libtpu 0.0.10 by default) through
#     PJRT on every generation: PJRT_DEVICE=TPU, NEXT_PLUGGABLE_DEVICE_USE_C_API=true,
#     TF_PLUGGABLE_DEVICE_LIBRARY_PATH and the recipe's MLIR-bridge TF_XLA_FLAGS. v6e: experimental.
#   multi-host slice (more than 8 TensorCores on v2-v4/v5p, more than 8 chips on v5e/v6e;
#     experimental for TensorFlow, N x v4-8 with --shards=N is the recommended path): the
#     `tpu-vm-tf-X.Y.Z-pod-pjrt` images run TensorFlow's gRPC TPU server (port 8470) on every
#     worker as the `tpu-runtime` service; one client process on worker 0 names the TPU
#     (TPUClusterResolver(tpu=NAME), which needs `cloud-tpu-client`) with TPU_LOAD_LIBRARY=0; that
#     client reads the data and ships it to the servers. Its tensorflow-tpu must be the image's
#     TensorFlow X.Y (Google: "use the TPU software version that matches the version of
#     TensorFlow"), so one is derived from the other and a mismatch is refused.
#
# --backend=jax (docs/tpu.md, "JAX on Cloud TPU"): the run on Keras 3's JAX backend, the path
#   Keras's own TPU CI tests. Google's JAX images on every host (tpu-ubuntu2204-base for v4 and
#   older, v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e for v6e:
#   cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX"); jax[tpu] pinned, whose tpu extra pins
#   the libtpu it was built against; no tensorflow-tpu, no PJRT variables. A multi-host slice runs
#   the same command on every worker with WIDE_TF_JAX_DISTRIBUTED=1 (jax.distributed.initialize()
#   in engine/jax/run.py): one run over the slice; a study (a sweep) is refused there (each host
#   would claim its own group), N x single host with --shards=N runs it.
#
# Tested without gcloud or a TPU (tests/test_launch.py: a fake gcloud records the calls); never
# run against Cloud TPU by its authors.

set -euo pipefail

readonly PROG="${0##*/}"
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/${BASH_SOURCE[0]##*/}"
REPO_DIR="${SELF%/*}"
readonly SELF REPO_DIR
# The package's requirements on the VM: setup.cfg's install_requires (read from it, one home),
# less tensorflow (the TPU build replaces it) and less the tensorboard pin (tensorflow-tpu pins its
# own TensorBoard minor). A hand-kept copy here once lacked scipy.
requirements() {
  awk '/^install_requires[ \t]*=/ { on = 1; next }
       on && /^[^ \t#]/ { on = 0 }
       on && /^[ \t]+[^ \t#]/ { sub(/^[ \t]+/, ""); sub(/[ \t]+$/, ""); print }' "$REPO_DIR/setup.cfg"
}
non_tf_deps() {
  requirements | grep -Ev '^(tensorflow|tensorboard)([=<>~!; ]|$)'
}
# --backend=jax: the same requirements with TensorFlow's CPU-only wheel at the same pin
# (tensorflow==2.21.* -> tensorflow-cpu==2.21.*, no CUDA libraries, never the TPU build). It is
# not the JAX run's engine: a gs:// workdir is read and written through tf.io.gfile
# (wide_tf/store/workdir.py), TensorBoard's event files on gs:// need it (engine/jax/run.py), the
# report (wide_tf/report) and TFDS data sets (tensorflow-datasets, configs/wrn.py's CIFAR-10) use
# it. It gets no PJRT variables, so it never opens the TPU, which JAX's libtpu holds.
jax_deps() {
  requirements | sed -E 's/^tensorflow([=<>~!; ]|$)/tensorflow-cpu\1/'
}
# google-cloud-storage on every VM (issue 38): with it, claims on gs:// are created atomically
# (if_generation_match=0, wide_tf/store/claims.py); without it, two VMs sharing a bucket can both win
# a group. setup.cfg's [gcs] extra is its one home once it exists; until then this requirement
# (2.10 has the generation preconditions; pip resolves it beside cloud-tpu-client's
# google-api-core 1.x on pods: google-cloud-storage 2.11 there, 3.x on a single host).
gcs_deps() {
  local lines
  lines="$(awk '/^[ \t]*gcs[ \t]*=/ { on = 1; v = $0; sub(/^[^=]*=[ \t]*/, "", v); if (v != "") print v; next }
       on && /^[^ \t#]/ { on = 0 }
       on && /^[ \t]+[^ \t#]/ { sub(/^[ \t]+/, ""); sub(/[ \t]+$/, ""); print }' "$REPO_DIR/setup.cfg")"
  echo "${lines:-google-cloud-storage>=2.10}"
}
# Where TensorFlow's install page points pip for the libtpu builds that go with tensorflow-tpu
# (libtpu 2.17.x/2.18.0 are only there; the 0.0.x builds are on PyPI too).
readonly LIBTPU_INDEX="https://storage.googleapis.com/libtpu-tf-releases/index.html"
readonly EXIT_REFUSED=3
readonly EXIT_PREEMPTED=143  # wide_tf.main after SIGTERM (wide_tf/engine/preemption.py)

# The one table of TPU software. Per TensorFlow minor: the tensorflow-tpu release on PyPI and the
# libtpu its wheel declares (Requires-Dist of each wheel, read with `pip install --dry-run
# --no-deps --report - tensorflow-tpu==X`: 2.20.0 'libtpu~=0.0.14', 2.19.1 'libtpu==0.0.10',
# 2.18.0 'libtpu==2.18.0', 2.17.1 'libtpu==2.17.1'; there is no tensorflow-tpu 2.19.0 or 2.21).
# The default is 2.19.1 with libtpu 0.0.10 through PJRT: the pair upstream still tests and shows.
# keras-team/keras requirements-tensorflow-tpu.txt and keras-team/keras-rs's pin
# tensorflow-tpu==2.19.1; the one Keras-team recipe for Keras 3 + TensorFlow on TPU (keras-io
# examples/keras_rs/distributed_embedding_tf.py) installs tensorflow-tpu==2.19.1 and sets
# PJRT_DEVICE=TPU, NEXT_PLUGGABLE_DEVICE_USE_C_API=true, TF_PLUGGABLE_DEVICE_LIBRARY_PATH=libtpu's
# .so and TF_XLA_FLAGS (MLIR bridge) before importing TensorFlow. Keras's own TPU CI runs the JAX
# backend only (keras-team/keras .github/workflows/tpu_tests.yml). 2.20.0 is opt-in
# (--tf_version=2.20): no Keras-team file pins it for TPU and no public record shows a
# tpu-vm-tf-2.20* image. Its '~=0.0.14' lets pip take any 0.0.x (0.0.52 in Dec 2026), so the
# launcher pins the one it names. docs/tpu.md, "Matched TPU software", has the sources.
readonly DEFAULT_TF_TPU=2.19.1
# --backend=jax: jax[tpu] at the JAX this package's JAX path is tested with (0.10.2, its CPU suite;
# the GPU image has 0.11). Its wheel's tpu extra pins the libtpu it goes with (Requires-Dist of
# jax 0.10.2, read with `pip install --dry-run --no-deps --report - "jax[tpu]==0.10.2"`:
# 'jaxlib<=0.10.2,>=0.10.2; extra == "tpu"', 'libtpu==0.0.42.*; extra == "tpu"'); libtpu 0.0.x
# is on PyPI, no -f index (JAX's install guide: `pip install "jax[tpu]"`). Resolved here together
# with keras 3.15.1, tensorflow-cpu 2.21.0 and numpy 2.4 (`pip install --dry-run`, Dec 2026).
readonly JAX_TPU=0.10.2 JAX_LIBTPU="0.0.42.*"
readonly RECIPE_XLA_FLAGS="--tf_mlir_enable_mlir_bridge=true --tf_mlir_enable_convert_control_to_data_outputs_pass=true --tf_mlir_enable_merge_control_flow_pass=true"
tf_tpu_for_minor() {
  case "$1" in
    2.17) echo 2.17.1 ;; 2.18) echo 2.18.0 ;; 2.19) echo 2.19.1 ;; 2.20) echo 2.20.0 ;; *) return 1 ;;
  esac
}
libtpu_for() {
  case "$1" in
    2.17.0) echo 2.17.0 ;; 2.17.1) echo 2.17.1 ;; 2.18.0) echo 2.18.0 ;; 2.19.1) echo 0.0.10 ;;
    2.20.0) echo 0.0.14 ;; *) return 1 ;;
  esac
}
# Replicas of a slice under TPUStrategy, which makes one replica per TPU device: v2/v3 show each
# of a chip's 2 TensorCores as a device and their type names TensorCores (v3-8: 8); v4 and v5p
# chips are megacores, one device per chip, and their type names TensorCores (v4-8: 4 chips, 4
# replicas; v4-32: 16); v5e and v6e have one TensorCore per chip and their type names chips
# (v5litepod-8: 8). Sources: cloud.google.com/tpu/docs/system-architecture-tpu-vm and
# cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e (docs/tpu.md).
replicas_of() {  # FAMILY SIZE
  case "$1" in
    v2 | v3 | v5litepod | v6e) echo "$2" ;;
    v4 | v5p) echo $(($2 / 2)) ;;
  esac
}
# The accelerator types Google offers per family (cloud.google.com/tpu/docs/v2, /v3, /v4, /v5e,
# /v5p, /v6e: their configuration tables; v5p lists more shapes than these, the larger ones pods
# that are experimental here): a size outside them never reaches `gcloud create`.
sizes_of() {
  case "$1" in
    v2) echo "8 32 128 256 512" ;;
    v3) echo "8 32 64 128 256 512 1024 2048" ;;
    v4) echo "8 16 32 64 128 256 512 1024 1536 2048 4096" ;;
    v5litepod | v6e) echo "1 4 8 16 32 64 128 256" ;;
    v5p) echo "8 16 32 64 128 256 512 1024 2048 4096 8192 12288" ;;
  esac
}
# Google's framework-neutral image per family, the one for JAX (and PyTorch) and for TensorFlow
# from pip on a single host (cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX": Trillium (v6e)
# v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v4 and older tpu-ubuntu2204-base).
base_image() {
  case "$1" in
    v5litepod) echo v2-alpha-tpuv5-lite ;;
    v5p) echo v2-alpha-tpuv5 ;;
    v6e) echo v2-alpha-tpuv6e ;;
    *) echo tpu-ubuntu2204-base ;;
  esac
}
hosts_of() {  # SIZE: v2-v4 and v5p count TensorCores, v5e and v6e chips; either way 8 a host
  echo $((($1 + 7) / 8))
}
# The slices docs/tpu.md's table covers ("Which config runs where"): each config's :check variant
# must fit every one (tests/test_launch.py runs it at each replica count `--list_slices` prints).
readonly SLICES="v2-8 v3-8 v4-8 v4-16 v4-32 v5litepod-1 v5litepod-4 v5litepod-8 v5litepod-16 v5p-8 v6e-1 v6e-4 v6e-8"
# The zone when --zone is not given: only v4 has one (us-central2-b, its only zone); it offers no
# v5e, v5p or v6e. The zones per family, for the message (Google, cloud.google.com/tpu/docs/
# regions-zones, North America and Europe; docs/tpu.md, "Which config runs where", has the table).
default_zone() {
  case "$1" in v4) echo us-central2-b ;; esac
}
zones_of() {
  case "$1" in
    v2) echo "us-central1-b, us-central1-c (v2-8)" ;;
    v3) echo "us-central1-a, us-central1-b (v3-8)" ;;
    v5litepod) echo "us-central1-a, us-south1-a, us-west1-c, us-west4-a" ;;
    v5p) echo "us-central1-a, us-east5-a" ;;
    v6e) echo "us-central1-b, us-east1-d, us-east5-a, us-east5-b, europe-west4-a" ;;
  esac
}

usage() {
  cat <<USAGE
usage: $PROG --name=TPU_NAME --config=CONFIG[:VARIANT] --workdir=gs://BUCKET/PATH
         [--accelerator=v4-8] [--zone=ZONE (default us-central2-b for v4; required otherwise)]
         [--backend=tensorflow|jax]
         [--shards=N] [--spot | --no_spot] [--queued] [--watch] [--delete_when_done] [--check]
         [--keep_on_failure] [--stall_minutes=30]
         [--version=IMAGE] [--tf_version=2.19|2.20] [--tf_tpu=2.19.1] [--libtpu=VERSION] [--python=3.11|3.12]
         [--pjrt=auto|on|off] [--project=PROJECT] [--no_validate] [--dry_run]
         [-- EXTRA_MAIN_FLAGS...]
       $PROG --name=TPU_NAME [--zone=...] [--project=...] [--queued] --status | --logs [--lines=N] [--follow] | --delete
       $PROG --workdir=gs://BUCKET/PATH --report
       $PROG --list_slices     # the slices of docs/tpu.md's table: SLICE REPLICAS HOSTS
USAGE
}

die() {  # one line on stderr, then the usage; exit 2 like the package's own command line
  echo "$PROG: error: $*" >&2
  usage >&2
  exit 2
}

fail() {  # one line on stderr, exit 1: gcloud, the VM or the run failed (not the arguments)
  echo "$PROG: error: $*" >&2
  exit 1
}

refuse() {  # the arguments are fine but the VM is not in a state to launch onto
  echo "$PROG: refused: $*" >&2
  exit "$EXIT_REFUSED"
}

note() { echo "$PROG: $*" >&2; }

ORIG_ARGS=("$@")
BACKEND=tensorflow NAME="" CONFIG="" WORKDIR="" ZONE="" ACCELERATOR="v4-8" VERSION="" TF_TPU="" TF_VERSION="" PYTHON_VERSION="3.11"
LIBTPU="" PJRT="auto" PROJECT="" DRY_RUN=0 SPOT="" QUEUED=0 WATCH=0 DELETE_WHEN_DONE=0 CHECK=0
SHARDS="" VALIDATE=1 ACTION="launch" LINES=100 FOLLOW=0 KEEP_ON_FAILURE=0 STALL_MINUTES=30
EXTRA=()
while (($#)); do
  case "$1" in
    --name=*) NAME="${1#*=}" ;;
    --backend=*) BACKEND="${1#*=}" ;;
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --accelerator=*) ACCELERATOR="${1#*=}" ;;
    --version=*) VERSION="${1#*=}" ;;
    --tf_tpu=*) TF_TPU="${1#*=}" ;;
    --tf_version=*) TF_VERSION="${1#*=}" ;;
    --python=*) PYTHON_VERSION="${1#*=}" ;;
    --pjrt=*) PJRT="${1#*=}" ;;
    --libtpu=*) LIBTPU="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --lines=*) LINES="${1#*=}" ;;
    --shards=*) SHARDS="${1#*=}" ;;
    --spot) SPOT=1 ;;
    --no_spot) SPOT=0 ;;
    --queued) QUEUED=1 ;;
    --watch) WATCH=1 ;;
    --delete_when_done) DELETE_WHEN_DONE=1 ;;
    --keep_on_failure) KEEP_ON_FAILURE=1 ;;
    --stall_minutes=*) STALL_MINUTES="${1#*=}" ;;
    --check) CHECK=1 ;;
    --no_validate) VALIDATE=0 ;;
    --dry_run) DRY_RUN=1 ;;
    --follow) FOLLOW=1 ;;
    --status | --logs | --report | --delete | --list_slices)
      [[ "$ACTION" == launch ]] || die "give one of --status, --logs, --report, --delete, --list_slices"
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
QR=("$GCLOUD_BIN" compute tpus queued-resources)
# Seconds between polls (--watch, a queued request) and before the after-start check; the tests
# set them to 0.
POLL_S="${WIDE_TF_POLL_S:-300}"
ALIVE_WAIT_S="${WIDE_TF_ALIVE_WAIT_S:-30}"
MAX_RELAUNCHES="${WIDE_TF_MAX_RELAUNCHES:-50}"
# How long each remote step may take before it is stopped and the launch fails (seconds): the
# install (uv, Python, about 1 GB of wheels on every worker), --check (the TPU system, the :check
# study with its compiles) and every other ssh or scp (the start, the run checks, the copy).
INSTALL_TIMEOUT_S="${WIDE_TF_INSTALL_TIMEOUT_S:-2400}"
CHECK_TIMEOUT_S="${WIDE_TF_CHECK_TIMEOUT_S:-1800}"
SSH_TIMEOUT_S="${WIDE_TF_SSH_TIMEOUT_S:-300}"

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

COMMENT=0  # 1: the dry run prints the commands of a branch it would not take, commented out
run() {  # runs a command, or prints it under --dry_run (commented out under COMMENT=1)
  if ((DRY_RUN)); then
    if ((COMMENT)); then echo "#   $(show "$@")"; else show "$@"; fi
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
  # preempted one is deleted), and shards on several VMs share one workdir.
  [[ "$WORKDIR" == gs://* ]] || die "--workdir=$WORKDIR must be a gs:// path on a TPU VM"
  # It goes into the VM's shell line and into gs:// names: a space, ';', '$(...)' or a quote would
  # split it or run as shell there. Refused outside a safe alphabet (and quoted with %q anyway).
  [[ "$WORKDIR" =~ ^gs://[a-z0-9][-a-z0-9_.]*(/[-A-Za-z0-9_.=+@,]*)*$ ]] || die "--workdir=$WORKDIR:" \
    "use a bucket name (a-z, 0-9, '-', '_', '.') and a path of letters, digits and '-_.=+@,/'" \
    "only (no spaces, quotes or shell characters), e.g. --workdir=gs://BUCKET/wrn"
}

# The files on each worker, in the ssh user's home folder: the '~' is for the remote shell to expand.
# One venv per backend: the install keeps a venv between launches, and tensorflow-cpu over a
# tensorflow-tpu (both install the `tensorflow` package) would leave two TensorFlows in one folder.
# shellcheck disable=SC2088
if [[ "$BACKEND" == jax ]]; then R_VENV="~/wide_tf_venv_jax"; else R_VENV="~/wide_tf_venv"; fi
# shellcheck disable=SC2088
readonly R_CHECKOUT="~/wide_tf" R_VENV R_ENV="~/wide_tf_env.sh" \
  R_LOGS="~/wide_tf_logs" R_PID="~/wide_tf.pid" R_EXIT="~/wide_tf.exit"
# Prints "wide_tf: running PID" when the pid file names a live wide_tf.main process, else
# "wide_tf: exited CODE" when the last run left its exit status, else "wide_tf: no run active".
# A running one adds "idle S" (seconds since its log last changed: the watchdog's measure of
# progress) and "waiting" when its last line says it waits for groups other VMs hold.
readonly PID_CHECK="p=\$(cat $R_PID 2>/dev/null || true); if [ -n \"\$p\" ] && kill -0 \"\$p\" 2>/dev/null && grep -q wide_tf.main /proc/\"\$p\"/cmdline 2>/dev/null; then m=\$(stat -L -c %Y $R_LOGS/latest.log 2>/dev/null || date +%s); w=''; tail -n 1 $R_LOGS/latest.log 2>/dev/null | grep -q 'No group free: waiting' && w=' waiting'; echo \"wide_tf: running \$p idle \$((\$(date +%s) - m))\$w\"; elif [ -s $R_EXIT ]; then echo \"wide_tf: exited \$(cat $R_EXIT)\"; else echo 'wide_tf: no run active'; fi"

pid_of() {  # "wide_tf: running PID idle S" -> PID
  local rest="${1##*running }"
  echo "${rest%% *}"
}

# A command started with '&' ignores SIGINT (bash without job control), so Ctrl-C would leave
# every background job of this shell running: a step under with_timeout, its watcher, or the
# launchers of --shards (bash ignores a trap on a signal ignored at its start, so theirs would
# not fire either). The INT and TERM traps call this first: TERM, which they do not ignore, stops
# them (each shard's own traps and on_exit then follow).
stop_background() {
  local -a jobs_left
  mapfile -t jobs_left < <(jobs -p)
  ((${#jobs_left[@]})) && kill -TERM "${jobs_left[@]}" 2>/dev/null
  return 0
}

# Runs CMD; past SECONDS it is stopped (TERM, then KILL 10 s later) and the status is 124. Plain
# bash (macOS has no `timeout`); the command runs in this process group, so an ssh passphrase
# prompt still reaches the terminal. The watcher checks every second whether CMD is still there.
with_timeout() {  # SECONDS CMD...
  local limit=$1 pid watcher code=0
  shift
  # Ctrl-C or TERM stops CMD and its watcher (stop_background), then exits 130 or 143 (on_exit
  # follows in the main shell). Armed before CMD starts: traps set after it, as before, left a
  # window in which the signal exited the launcher with CMD running on (the likely cause of the
  # Ctrl-C test's failures under load). Set here, not only at the top of the script: a $(...)
  # subshell, where several steps run, does not keep the script's traps.
  trap 'stop_background; exit 130' INT
  trap 'stop_background; exit 143' TERM
  "$@" &
  pid=$!
  (
    trap - EXIT INT TERM
    n=0
    while ((n < limit)); do
      sleep 1 &
      wait "$!"  # a TERM from the caller ends this wait at once (a plain sleep would finish first)
      kill -0 "$pid" 2>/dev/null || exit 0
      n=$((n + 1))
    done
    echo "$limit" >"$TIMEOUT_MARK.$pid"
    kill -TERM "$pid" 2>/dev/null
    sleep 10
    kill -KILL "$pid" 2>/dev/null
  ) >/dev/null 2>&1 &
  watcher=$!
  wait "$pid" || code=$?
  kill "$watcher" 2>/dev/null || true
  wait "$watcher" 2>/dev/null || true
  if [[ -e "$TIMEOUT_MARK.$pid" ]]; then
    rm -f "$TIMEOUT_MARK.$pid"
    return 124
  fi
  return "$code"
}

# A remote step with its limit: printed like run(); stopped past SECONDS, then one line (WHAT, the
# limit and the knob) and exit 1, which deletes the VM under --delete_when_done.
limited() {  # SECONDS KNOB WHAT CMD...
  local limit=$1 knob=$2 what=$3 code=0
  shift 3
  if ((DRY_RUN)); then
    run "$@"
    return 0
  fi
  echo "+ $(show "$@")" >&2
  with_timeout "$limit" "$@" || code=$?
  ((code == 124)) && fail "$what on $NAME did not finish in ${limit}s and was stopped ($knob=SECONDS sets the limit)"
  return "$code"
}

WHERE=()
set_where() {
  WHERE=("--zone=$ZONE")
  [[ -n "$PROJECT" ]] && WHERE+=("--project=$PROJECT")
  return 0
}

# Reads the VM: STATE (READY, PREEMPTED, ...; empty when there is no such VM), WAS_SPOT (1 when
# it was created as a spot or preemptible VM) and FROM_QUEUE (1 when a queued resource made it).
# Any error other than NOT_FOUND is reported as it is, exit 1: with no project set, a missing
# permission or no network, "not found" would be a lie and a create would follow.
STATE="" WAS_SPOT=0 FROM_QUEUE=0
read_vm() {
  local out err code=0
  err="$(mktemp "${TMPDIR:-/tmp}/wide_tf_describe.XXXXXX")"
  out="$("${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" \
    "--format=value(state,schedulingConfig.spot,schedulingConfig.preemptible,queuedResource)" \
    2>"$err")" || code=$?
  if ((code)); then
    if grep -q "NOT_FOUND" "$err"; then
      rm -f "$err"
      STATE="" WAS_SPOT=0 FROM_QUEUE=0
      return 0
    fi
    local line
    line="$(grep -v '^\s*$' "$err" | head -n 1)"
    rm -f "$err"
    fail "'gcloud compute tpus tpu-vm describe $NAME' failed (exit $code): ${line:-no message};" \
      "check --project (or 'gcloud config set project'), --zone and 'gcloud auth login'"
  fi
  rm -f "$err"
  STATE="${out%%[[:space:]]*}"
  WAS_SPOT=0 FROM_QUEUE=0
  [[ "${out#"$STATE"}" =~ [Tt]rue ]] && WAS_SPOT=1
  [[ "$out" == *queuedResources/* ]] && FROM_QUEUE=1
  return 0
}

delete_vm() {  # the VM, or its queued resource with it (--force deletes the request's nodes too)
  if ((QUEUED || FROM_QUEUE)); then
    run "${QR[@]}" delete "$NAME" "${WHERE[@]}" --force --quiet
  else
    run "${GCLOUD[@]}" delete "$NAME" "${WHERE[@]}" --quiet
  fi
}

# ---- following a run -------------------------------------------------------------------------
case "$ACTION" in
  list_slices)
    for slice in $SLICES; do
      echo "$slice $(replicas_of "${slice%-*}" "${slice##*-}") $(hosts_of "${slice##*-}")"
    done
    exit 0 ;;
  status | logs | delete)
    check_name
    ZONE="${ZONE:-us-central2-b}"
    set_where
    need_gcloud ;;
esac
case "$ACTION" in
  status)
    status_cmd="$PID_CHECK; echo '--- last lines of $R_LOGS/latest.log:'; tail -n 5 $R_LOGS/latest.log 2>/dev/null || echo '(no log yet)'"
    if ((DRY_RUN)); then
      echo "# the VM's state: $(show "${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" "--format=value(state)")"
      echo "# READY: $(show "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$status_cmd")"
      exit 0
    fi
    read_vm
    if [[ -z "$STATE" ]]; then
      echo "TPU VM $NAME: not found in $ZONE"
      exit 0
    fi
    echo "TPU VM $NAME: $STATE$( ((WAS_SPOT)) && echo " (spot)")$( ((FROM_QUEUE)) && echo " (queued resource)")"
    [[ "$STATE" == READY ]] && run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$status_cmd"
    exit 0 ;;
  logs)
    [[ "$LINES" =~ ^[0-9]+$ ]] || die "--lines=$LINES: give a number"
    TAIL="tail -n $LINES"
    ((FOLLOW)) && TAIL+=" -F"
    run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$TAIL $R_LOGS/latest.log"
    exit 0 ;;
  delete)
    ((DRY_RUN)) || read_vm
    delete_vm
    exit 0 ;;
  report)
    check_workdir
    # On this machine: reads the finished trials from the bucket (TensorFlow reads gs:// with the
    # application-default credentials: `gcloud auth application-default login`).
    run "${PYTHON:-python3}" -m wide_tf.report "--workdir=$WORKDIR"
    ((DRY_RUN)) || echo "# the report: ${WORKDIR%/}/report/report.md" >&2
    exit 0 ;;
esac

# ---- a launch: the arguments -----------------------------------------------------------------
check_name
[[ -n "$CONFIG" ]] || die "--config is required (e.g. --config=configs/wrn.py)"
check_workdir
[[ "$CONFIG" =~ ^[A-Za-z0-9_.][-A-Za-z0-9_./]*(:[A-Za-z0-9_.-]+)?$ ]] || die "--config=$CONFIG: use a" \
  "path of letters, digits and '-_./' with an optional :VARIANT (no spaces, quotes or shell" \
  "characters: it goes into the VM's shell line), e.g. --config=configs/wrn.py:check"
CONFIG_FILE="${CONFIG%%:*}"
[[ -f "$REPO_DIR/$CONFIG_FILE" ]] \
  || die "--config=$CONFIG: no file $CONFIG_FILE in $REPO_DIR (give it relative to the repository)"
# setup.cfg: python_requires = >=3.11,<3.13 (Keras 3.15 needs 3.11; the package is not measured on
# 3.13).
[[ "$PYTHON_VERSION" =~ ^3\.1[12]$ ]] \
  || die "--python=$PYTHON_VERSION: setup.cfg allows Python 3.11 and 3.12 (Keras 3.15 needs 3.11); use --python=3.11"
[[ -z "$LIBTPU" || "$LIBTPU" =~ ^[0-9][0-9.a-z]*$ ]] || die "--libtpu=$LIBTPU: give a libtpu version (e.g. 0.0.14)"
[[ "$PJRT" =~ ^(auto|on|off)$ ]] || die "--pjrt=$PJRT: choose auto, on or off"
[[ "$BACKEND" =~ ^(tensorflow|jax)$ ]] || die "--backend=$BACKEND: choose tensorflow (the default) or jax"
JAX=0
[[ "$BACKEND" == jax ]] && JAX=1
[[ "$ACCELERATOR" =~ ^(v2|v3|v4|v5litepod|v5p|v6e)-([0-9]+)$ ]] \
  || die "--accelerator=$ACCELERATOR: expected TYPE-SIZE with TYPE one of v2, v3, v4, v5litepod, v5p, v6e (e.g. v4-8)"
FAMILY="${BASH_REMATCH[1]}"
SIZE="${BASH_REMATCH[2]}"
[[ " $(sizes_of "$FAMILY") " == *" $SIZE "* ]] || die "--accelerator=$ACCELERATOR: no such slice;" \
  "$FAMILY comes as $(sizes_of "$FAMILY" | sed "s/\([0-9]*\)/$FAMILY-\1/g; s/ /, /g") (v2-v4 and v5p" \
  "count TensorCores, 2 per chip; v5e and v6e count chips); docs/tpu.md lists the ones checked here"
REPLICAS="$(replicas_of "$FAMILY" "$SIZE")"
if [[ -z "$ZONE" ]]; then
  ZONE="$(default_zone "$FAMILY")"
  [[ -n "$ZONE" ]] || die "--accelerator=$ACCELERATOR needs --zone: us-central2-b (the v4 default) has" \
    "no $FAMILY; Google lists $FAMILY in $(zones_of "$FAMILY") (docs/tpu.md, 'Which config runs where')"
fi
set_where
[[ -z "$SHARDS" || "$SHARDS" =~ ^[1-9][0-9]*$ ]] || die "--shards=$SHARDS: give a number of VMs, e.g. --shards=4"
[[ "$STALL_MINUTES" =~ ^[0-9]{1,5}$ ]] || die "--stall_minutes=$STALL_MINUTES: give whole minutes (0 turns" \
  "the watchdog off), e.g. --stall_minutes=30"
STALL_S="${WIDE_TF_STALL_S:-$((STALL_MINUTES * 60))}"
((KEEP_ON_FAILURE && !DELETE_WHEN_DONE)) && die "--keep_on_failure goes with --delete_when_done (without" \
  "it nothing is deleted)"
((DELETE_WHEN_DONE && !WATCH)) && die "--delete_when_done needs --watch: this machine deletes the VM" \
  "once the study is done, so it must follow it (run the launch under nohup, tmux or screen)"
# More VMs than a study has groups would idle; 4096 bounds a typo (10^20) before any loop over it.
[[ -z "$SHARDS" || ${#SHARDS} -le 4 && "$SHARDS" -le 4096 ]] || die "--shards=$SHARDS: at most" \
  "4096 VMs (a shard per (member, batch size) group at most); give fewer, e.g. --shards=4"
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do
  [[ -n "$SHARDS" && "$a" == --shard=* ]] && die "--shards=$SHARDS deals the groups to the VMs from one" \
    "claim pool; drop $a"
  # The launcher owns these: passed through, the VM would write where --watch and --report don't read.
  case "$a" in
    --workdir | --workdir=* | --config | --config=* | --trial | --trial=*)
      die "${a%%=*} after -- is the launcher's own flag (the VM would not run what --watch and" \
        "--report read); give it before --, or drop it" ;;
  esac
done
HOSTS="$(hosts_of "$SIZE")"
MULTI_HOST=$((HOSTS > 1 ? 1 : 0))
# A TensorFlow pod: gRPC TPU servers on every worker, one client on worker 0. (JAX on a
# multi-host slice: the same program on every worker, each its own host's TPU client.)
TF_POD=$((MULTI_HOST && !JAX))
if ((TF_POD)); then TPU_ARG="$NAME"; else TPU_ARG=local; fi
# The flags of wide_tf.main on the VM, one list: the workstation's check runs with exactly these
# (plus --dry_run, --replicas and --accelerator), so a flag only the VM would refuse (--workers=2
# under runtime.strategy=tpu) is refused here, before any gcloud call.
BACKEND_FLAGS=()
((JAX)) && BACKEND_FLAGS=(--config.runtime.backend=jax)
VM_FLAGS=("--config=$CONFIG" "--workdir=$WORKDIR" "${BACKEND_FLAGS[@]+"${BACKEND_FLAGS[@]}"}"
  --config.runtime.strategy=tpu "--config.runtime.tpu=$TPU_ARG" "${EXTRA[@]+"${EXTRA[@]}"}")
CHECK_FLAGS=("--config=$CONFIG_FILE:check" --workdir=/tmp/wide_tf_check
  "${BACKEND_FLAGS[@]+"${BACKEND_FLAGS[@]}"}" --config.runtime.strategy=tpu
  "--config.runtime.tpu=$TPU_ARG" --no_report)
# The study stage of --check (wide_tf/tools/check.py): the study's own worst row (largest member at
# the largest batch per replica) stepped, its peak memory beside the memory model's, 20 steps timed,
# a checkpoint written to the study's workdir (gs://) and read back. Only --config.* overrides go
# with it (the study's shapes); the other flags are main's.
STUDY_CHECK_FLAGS=("--config=$CONFIG" "--workdir=$WORKDIR" --config.runtime.strategy=tpu
  "--config.runtime.tpu=$TPU_ARG")
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do
  [[ "$a" == --config.* ]] && STUDY_CHECK_FLAGS+=("$a")
done
# --backend=jax: Google's image for JAX per family (cloud.google.com/tpu/docs/runtimes, "PyTorch
# and JAX": v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v4 and older
# tpu-ubuntu2204-base), on a single host and on every worker of a multi-host slice alike (JAX needs
# no TPU server); the TensorFlow flags do not apply.
jax_software() {
  local a
  for a in "${ORIG_ARGS[@]}"; do
    [[ "$a" == -- ]] && break
    case "$a" in
      --tf_tpu=* | --tf_version=* | --libtpu=* | --pjrt=*)
        die "${a%%=*} is for --backend=tensorflow; --backend=jax installs jax[tpu]==$JAX_TPU with the" \
          "libtpu its tpu extra pins (libtpu==$JAX_LIBTPU) and no PJRT variables: drop ${a%%=*}" ;;
    esac
  done
  [[ -z "$VERSION" || "$VERSION" == "$(base_image "$FAMILY")" ]] || die "--version=$VERSION:" \
    "--backend=jax on $FAMILY takes Google's JAX image $(base_image "$FAMILY") (cloud.google.com/tpu/docs/runtimes);" \
    "drop --version"
  VERSION="$(base_image "$FAMILY")"
  RUNTIME=jax
  TF_TPU="" LIBTPU="$JAX_LIBTPU"
}

# The TensorFlow path's software: tensorflow-tpu and its libtpu, the image, PJRT or the pod's servers.
tf_software() {
if ((TF_POD)); then
  # The pod image runs TensorFlow's TPU server, the client on worker 0 is tensorflow-tpu: the two
  # must be one TensorFlow X.Y. One is derived from the other; both given and different: refused.
  if [[ -n "$VERSION" ]]; then
    [[ "$VERSION" =~ ^tpu-vm-tf-([0-9]+\.[0-9]+)\.[0-9]+-pod(-[a-z0-9]+)*$ ]] || die "--accelerator=$ACCELERATOR is a" \
      "multi-host slice: it needs a TensorFlow pod image (tpu-vm-tf-X.Y.Z-pod-pjrt), which starts the TPU server on every worker"
    IMAGE_MINOR="${BASH_REMATCH[1]}"
    if [[ -z "$TF_TPU" ]]; then
      TF_TPU="$(tf_tpu_for_minor "$IMAGE_MINOR")" || die "--version=$VERSION: no tensorflow-tpu" \
        "$IMAGE_MINOR.x in the launcher's table (2.17 to 2.20); give --tf_tpu=$IMAGE_MINOR.Z and --libtpu"
    fi
    [[ "$TF_TPU" =~ ^([0-9]+\.[0-9]+) && "${BASH_REMATCH[1]}" == "$IMAGE_MINOR" ]] || die "--tf_tpu=$TF_TPU" \
      "does not match --version=$VERSION (TensorFlow $IMAGE_MINOR): the client must be the image's" \
      "TensorFlow; drop --tf_tpu to use tensorflow-tpu $(tf_tpu_for_minor "$IMAGE_MINOR" || echo "$IMAGE_MINOR.x")"
  fi
fi
if [[ -n "$TF_VERSION" ]]; then  # --tf_version=X.Y: the table's tensorflow-tpu of that minor
  tf_of_minor="$(tf_tpu_for_minor "$TF_VERSION")" || die "--tf_version=$TF_VERSION: the launcher's" \
    "table has TensorFlow 2.17, 2.18, 2.19 (the default, 2.19.1) and 2.20 (opt-in); give one of those"
  [[ -z "$TF_TPU" || "$TF_TPU" == "$tf_of_minor" ]] || die "--tf_tpu=$TF_TPU does not match" \
    "--tf_version=$TF_VERSION ($tf_of_minor); give one of the two"
  TF_TPU="$tf_of_minor"
fi
TF_TPU="${TF_TPU:-$DEFAULT_TF_TPU}"
[[ "$TF_TPU" =~ ^([0-9]+\.[0-9]+)\.[0-9]+$ ]] \
  || die "--tf_tpu=$TF_TPU: give a tensorflow-tpu version from PyPI (e.g. $DEFAULT_TF_TPU)"
TF_MINOR="${BASH_REMATCH[1]}"
if [[ -z "$LIBTPU" ]]; then
  LIBTPU="$(libtpu_for "$TF_TPU")" || die "--tf_tpu=$TF_TPU: not in the launcher's table" \
    "(tensorflow-tpu 2.17.0, 2.17.1, 2.18.0, 2.19.1, 2.20.0); give the libtpu its wheel declares with --libtpu"
fi
case "$TF_MINOR" in
  2.19) ;;  # the default: the TensorFlow upstream's TPU recipe uses (docs/tpu.md)
  2.20) note "note: tensorflow-tpu $TF_TPU (opt-in): no Keras-team file pins it for TPU and no" \
    "tpu-vm-tf-2.20 image is on record; the default is $DEFAULT_TF_TPU (docs/tpu.md)" ;;
  *) note "note: tensorflow-tpu $TF_TPU: the package's CPU suite was not run on TensorFlow" \
    "$TF_MINOR (docs/tpu.md); the default is $DEFAULT_TF_TPU" ;;
esac
if ((TF_POD)); then
  # Google documents TensorFlow pod images (tpu-vm-tf-X.Y.Z-pod-pjrt) for v2-v4, v5e and v5p;
  # TensorFlow is not in its v6e support list (docs/tpu.md): no default image there.
  [[ "$FAMILY" == v6e && -z "$VERSION" ]] && die "--accelerator=$ACCELERATOR: Google documents no" \
    "TensorFlow pod image for multi-host v6e; use v6e-8 or smaller, N x v4-8 with --shards=N, or" \
    "--version=tpu-vm-tf-X.Y.Z-pod-pjrt if 'gcloud compute tpus tpu-vm versions list' shows one"
  VERSION="${VERSION:-tpu-vm-tf-$TF_TPU-pod-pjrt}"
else
  local base
  base="$(base_image "$FAMILY")"
  # A single host takes the family's framework-neutral image (Google's runtimes page) or a
  # TensorFlow image tpu-vm-tf-X.Y.Z[-pjrt][-...] (the venv's TensorFlow is used either way).
  [[ -z "$VERSION" || "$VERSION" == "$base" || "$VERSION" =~ ^tpu-vm-tf-[0-9]+\.[0-9]+\.[0-9]+(-[a-z0-9]+)*$ ]] \
    && [[ "$VERSION" != *-pod* ]] || die "--version=$VERSION: a single-host $FAMILY takes $base (the" \
    "default) or a TensorFlow image tpu-vm-tf-X.Y.Z[-pjrt] ('gcloud compute tpus tpu-vm versions list" \
    "--zone=$ZONE' lists them); drop --version for the default"
  VERSION="${VERSION:-$base}"
fi
# PJRT on every single host (v2 to v6e): the recipe's runtime. A pod's client talks to the image's
# TPU servers over gRPC, where the PJRT variables do not apply.
if [[ "$PJRT" == auto ]]; then
  if ((TF_POD)); then PJRT=off; else PJRT=on; fi
fi
if ((TF_POD)); then RUNTIME=grpc_tpu_server; elif [[ "$PJRT" == on ]]; then RUNTIME=pjrt; else RUNTIME=stream_executor; fi
# Experimental for TensorFlow (docs/tpu.md, "Which path upstream supports"): v6e (TensorFlow is not
# in Google's v6e framework list; Keras's TPU CI runs JAX there) and every pod slice (one client
# feeding gRPC TPU servers; public reports of TF 2.17/2.18 pod images that hang or crash:
# tensorflow/tensorflow#82208). The recommended paid path is N single hosts: v4-8 or v5litepod-8.
if ((MULTI_HOST)) || [[ "$FAMILY" == v6e ]]; then
  note "note: $ACCELERATOR is experimental for TensorFlow ($( ((MULTI_HOST)) && echo "a pod slice" \
    || echo "v6e")); the recommended paid path is N x v4-8 (--shards=N) or v5litepod-8 (docs/tpu.md)"
fi
}
if ((JAX)); then jax_software; else tf_software; fi

# TFDS data (configs/wrn.py: CIFAR-10) must be prepared once into the bucket (docs/tpu.md): a
# fresh VM has none, and a preempted one loses its disk.
DATA_DIR=""
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do
  [[ "$a" == --config.data.data_dir=* ]] && DATA_DIR="${a#*=}"
done
if [[ -z "$DATA_DIR" ]]; then
  note "note: no --config.data.data_dir after '--': a TFDS data set (CIFAR-10 in configs/wrn.py)" \
    "must then be in the VM's default folder, which a new VM does not have; pass" \
    "-- --config.data.data_dir=gs://BUCKET/tfds (the embedded data sets need none)"
elif [[ "$DATA_DIR" != gs://* ]]; then
  note "note: --config.data.data_dir=$DATA_DIR is on worker 0's disk: a new or re-created VM has" \
    "no data there; a gs:// path survives preemptions"
fi

# The config file goes to the VM with the checkout's tracked files; one git does not track yet is
# added to the copy explicitly (before, it passed this check and was missing on the VM).
UNTRACKED_CONFIG=0
if ! git -C "$REPO_DIR" ls-files --error-unmatch -- "$CONFIG_FILE" >/dev/null 2>&1; then
  UNTRACKED_CONFIG=1
  note "note: $CONFIG_FILE is not tracked by git; it is copied to the VM explicitly (commit it to" \
    "keep the study reproducible)"
fi

# ---- 0. the config, checked here for the slice's replica count -------------------------------
# No TensorFlow and no VM: `wide_tf.main --dry_run --replicas=N` runs the package's own checks
# (wide_tf/checks/validate.py) with N replicas, so a study that cannot run on the slice (a batch that
# does not split into whole ghost batches per replica, ...) is refused before anything is billed.
OUT="" CODE=0
# The VM's environment for the checks here: JAX on a multi-host slice runs as one of several
# processes (WIDE_TF_JAX_DISTRIBUTED=1), under which the package refuses a study (checks/preflight.py).
HERE_ENV=()
((JAX && MULTI_HOST)) && HERE_ENV=(WIDE_TF_JAX_DISTRIBUTED=1)
here() {  # MODULE ARGS...: a wide_tf module run on this machine (this checkout); sets OUT and CODE
  CODE=0
  OUT="$(cd "$REPO_DIR" && env "${HERE_ENV[@]+"${HERE_ENV[@]}"}" PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" \
    -m "$@" 2>&1)" || CODE=$?
}
refuse_here() {  # WHAT: a failed check as one line; exit 2 for a config that cannot run (its
  # usage errors and a study that does not fit the memory), 1 for anything else
  ((CODE)) || return 0
  local line
  line="$(grep -E '^(error|memory): ' <<<"$OUT" | tail -n 1)"
  line="${line#error: }"
  echo "$PROG: error: $1 on $ACCELERATOR ($REPLICAS replicas): ${line:-$(tail -n 1 <<<"$OUT")}" >&2
  exit "$((CODE == 2 || CODE == 3 ? 2 : 1))"
}
validate_here() {
  if ! "${PYTHON:-python3}" -c 'import absl, ml_collections' >/dev/null 2>&1; then
    fail "cannot check the config on this machine: '${PYTHON:-python3}' lacks absl-py and ml-collections;" \
      "pip install -e . here (TensorFlow is not needed for the check), point PYTHON= at a" \
      "Python that has them, or skip the check with --no_validate"
  fi
  # With --accelerator the same call runs the memory model (wide_tf/schema/memory.py): every member
  # at every batch on one replica's HBM; exit 3 when it does not fit (refused as 2).
  here wide_tf.main "${VM_FLAGS[@]}" --dry_run "--replicas=$REPLICAS" "--accelerator=$FAMILY"
  refuse_here "$CONFIG"
  note_checked "checked here"
  if ((CHECK)) && ! ((JAX && MULTI_HOST)); then  # the config --check runs on the VM, at the same replica count
    here wide_tf.main "${CHECK_FLAGS[@]}" --dry_run "--replicas=$REPLICAS" "--accelerator=$FAMILY"
    refuse_here "$CONFIG_FILE:check (--check)"
    note_checked "checked here for --check"
  fi
}
note_checked() {  # PREFIX: the dry run's "dry run: ..." and "memory: ..." lines, one note each
  local line
  while IFS= read -r line; do
    [[ "$line" =~ ^(dry\ run|memory):\  ]] && note "$1: $line"
  done <<<"$OUT"
  return 0
}
((VALIDATE)) && validate_here

# The study's (member, batch size) groups, counted here from the config and the flags the VM gets
# (wide_tf.study.trials, no TensorFlow): --shards may not exceed them (a VM beyond would have
# nothing to claim and would bill for nothing).
read -r -d '' GROUPS_PY <<'PY' || true
import sys
from absl import flags
from ml_collections import config_flags
config = config_flags.DEFINE_config_file("config")
flags.FLAGS(sys.argv, known_only=True)
from wide_tf.study.trials import group_trials, list_trials
print(len(group_trials(list_trials(config.value))))
PY
study_groups() {  # prints the count, or nothing when it cannot be read here
  (cd "$REPO_DIR" && PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -c \
    "$GROUPS_PY" wide_tf "${VM_FLAGS[@]}" 2>/dev/null) || true
}
if [[ -n "$SHARDS" ]] && ((VALIDATE)); then
  GROUP_COUNT="$(study_groups)"
  if [[ "$GROUP_COUNT" =~ ^[0-9]+$ ]]; then
    ((SHARDS <= GROUP_COUNT)) || die "--shards=$SHARDS: $CONFIG has $GROUP_COUNT (member, batch size)" \
      "groups and a group runs on one VM; VMs beyond $GROUP_COUNT would bill with nothing to run:" \
      "give --shards=$GROUP_COUNT or fewer"
    note "checked here: $GROUP_COUNT groups for $SHARDS VMs, dealt from one claim pool"
  else
    note "note: could not count $CONFIG's groups here; --shards=$SHARDS is not checked against them"
  fi
fi

# ---- N VMs, one claim pool --------------------------------------------------------------------
# --shards=N: N single launches NAME-0 ... NAME-(N-1) of the whole study on the one gs:// workdir.
# Every VM claims the next open (member, batch size) group from the workdir's claims
# (wide_tf/store/claims.py; atomic on gs:// through google-cloud-storage, which every VM gets), so
# the groups are dealt as VMs free up: balanced by the work itself, and a preempted VM's group is
# taken over by another once its heartbeat is stale. Before, each VM got --shard=i/N, a static hash
# split: configs/wrn.py's 30 groups on 8 VMs gave 2 to 10 groups per VM. Each child is this script
# with the same flags; under --dry_run they print one after the other, otherwise they run side by
# side, their lines prefixed with the VM's name, and the exit status is the worst.
if [[ -n "$SHARDS" ]]; then
  child_args=()
  for a in "${ORIG_ARGS[@]}"; do
    [[ "$a" == -- ]] && break
    [[ "$a" == --name=* || "$a" == --shards=* ]] || child_args+=("$a")
  done
  ((VALIDATE)) && child_args+=(--no_validate)  # checked once above, for the same replica count
  pids=()
  # Ctrl-C or TERM stops every shard's launcher (which deletes its VM under --delete_when_done),
  # not this shell alone: they run in the background, where SIGINT does not reach them. The
  # prompt comes back once they have finished.
  trap 'stop_background; wait; exit 130' INT
  trap 'stop_background; wait; exit 143' TERM
  for ((i = 0; i < SHARDS; i++)); do
    args=("${child_args[@]}" "--name=$NAME-$i" -- "${EXTRA[@]+"${EXTRA[@]}"}")
    if ((DRY_RUN)); then
      echo "# ---- VM $NAME-$i: $((i + 1)) of $SHARDS, each claiming groups from the one pool in $WORKDIR"
      bash "$SELF" "${args[@]}"
    else
      bash "$SELF" "${args[@]}" 2>&1 | sed -u "s/^/[$NAME-$i] /" &
      pids+=("$!")
    fi
  done
  worst=0
  for p in "${pids[@]+"${pids[@]}"}"; do
    wait "$p" || { c=$?; ((c > worst)) && worst=$c; }
  done
  exit "$worst"
fi

need_gcloud  # after every usage check: a typo is reported before a missing tool
if ((MULTI_HOST)); then
  # gcloud's --worker=all opens one ssh per worker; with a passphrase on the key it asks once per
  # worker unless the key is in an agent (Google's pod guide: ssh-add first).
  if ((JAX)); then
    note "note: multi-host slice ($HOSTS workers): run 'ssh-add ~/.ssh/google_compute_engine' first;" \
      "the run starts on every worker (JAX: one program on every host), worker 0 writes the workdir"
  else
    note "note: multi-host slice ($HOSTS workers): run 'ssh-add ~/.ssh/google_compute_engine' first," \
      "and give the VM's service account roles/tpu.viewer if the client cannot resolve the TPU (docs/tpu.md)"
  fi
fi

# A queued request outlives its node: after a spot preemption the node is deleted and the request
# is SUSPENDED ("the resources specified in the QueuedResource request have been deleted"), or it
# is FAILED; either way it is no longer eligible for allocation, and a new request under its name
# would be refused or never served. So a leftover request is deleted first (delete is allowed in
# ACCEPTED, FAILED and SUSPENDED; --force deletes any node too), and one that is still on its way
# (CREATING, ACCEPTED, WAITING_FOR_RESOURCES, PROVISIONING) is waited for instead. Google:
# https://cloud.google.com/python/docs/reference/tpu/latest/google.cloud.tpu_v2.types.QueuedResourceState.State
# and .../google.cloud.tpu_v2.types.DeleteQueuedResourceRequest.
QR_PENDING=0
clear_old_request() {
  QR_PENDING=0
  local describe=("${QR[@]}" describe "$NAME" "${WHERE[@]}" "--format=value(state.state)")
  if ((DRY_RUN)); then
    echo "# a queued resource $NAME left SUSPENDED, FAILED or ACTIVE without its node is deleted first; one still queued is waited for: $(show "${describe[@]}")"
    return 0
  fi
  local qs err code=0
  err="$(mktemp "${TMPDIR:-/tmp}/wide_tf_describe.XXXXXX")"
  qs="$("${describe[@]}" 2>"$err")" || code=$?
  if ((code)); then
    if grep -q "NOT_FOUND" "$err"; then
      rm -f "$err"
      return 0
    fi
    local line
    line="$(grep -v '^\s*$' "$err" | head -n 1)"
    rm -f "$err"
    fail "'gcloud compute tpus queued-resources describe $NAME' failed (exit $code): ${line:-no message}"
  fi
  rm -f "$err"
  case "$qs" in
    SUSPENDED | SUSPENDING | FAILED | ACTIVE)
      note "the queued resource $NAME is $qs without its node; deleting it before queueing again"
      run "${QR[@]}" delete "$NAME" "${WHERE[@]}" --force --quiet ;;
    DELETING)
      refuse "the queued resource $NAME is being deleted; launch again once" \
        "'gcloud compute tpus queued-resources describe $NAME --zone=$ZONE' says NOT_FOUND" ;;
    *)
      note "the queued resource $NAME is $qs; waiting for it instead of queueing again"
      QR_PENDING=1 ;;
  esac
}

create_vm() {
  local spot="$1"
  if ((QUEUED)); then
    clear_old_request
    if ((!QR_PENDING)); then
      local cmd=("${QR[@]}" create "$NAME" "${WHERE[@]}" "--node-id=$NAME" \
        "--accelerator-type=$ACCELERATOR" "--runtime-version=$VERSION")
      ((spot)) && cmd+=(--spot)
      run "${cmd[@]}"
    fi
    wait_for_queue
  else
    local cmd=("${GCLOUD[@]}" create "$NAME" "${WHERE[@]}" "--accelerator-type=$ACCELERATOR" \
      "--version=$VERSION")
    ((spot)) && cmd+=(--spot)
    run "${cmd[@]}"
  fi
  ((DRY_RUN)) || remember_spot "$spot"
}

# A queued request waits for capacity (WAITING_FOR_RESOURCES, PROVISIONING) until it is ACTIVE;
# FAILED and SUSPENDED end it (Google: cloud.google.com/tpu/docs/queued-resources).
wait_for_queue() {
  ((DRY_RUN)) && {
    echo "# then until ACTIVE, every ${POLL_S}s: $(show "${QR[@]}" describe "$NAME" "${WHERE[@]}" "--format=value(state.state)")"
    return 0
  }
  local qs="" last=""
  while :; do
    qs="$("${QR[@]}" describe "$NAME" "${WHERE[@]}" "--format=value(state.state)")" \
      || fail "could not read the queued resource $NAME; see 'gcloud compute tpus queued-resources describe $NAME --zone=$ZONE'"
    [[ "$qs" != "$last" ]] && note "queued resource $NAME: $qs"
    last="$qs"
    case "$qs" in
      ACTIVE) return 0 ;;
      FAILED | SUSPENDED | SUSPENDING)
        OWNED=0  # no node was made: nothing is billed (--delete_when_done still clears the request)
        fail "the queued resource $NAME is $qs; see 'gcloud compute tpus queued-resources describe" \
          "$NAME --zone=$ZONE', delete it with '$PROG --name=$NAME --zone=$ZONE --queued --delete' and try another zone or time" ;;
    esac
    sleep "$POLL_S"
  done
}

# A pod image must exist in the zone (`versions list` is the source of truth, Google's pages lag).
check_image_offered() {
  ((TF_POD)) || return 0
  local listed
  if ((DRY_RUN)); then
    echo "# the pod image must be offered here: $(show "${GCLOUD[@]}" versions list "${WHERE[@]}" "--format=value(version)")"
    return 0
  fi
  listed="$("${GCLOUD[@]}" versions list "${WHERE[@]}" "--format=value(version)" 2>/dev/null)" || {
    note "warning: could not list the TPU software versions in $ZONE; creating with $VERSION anyway"
    return 0
  }
  grep -qx -- "$VERSION" <<<"$listed" && return 0
  local pods
  pods="$(grep -E '^tpu-vm-tf-.*-pod' <<<"$listed" | sort -V | tr '\n' ' ')"
  die "--version=$VERSION is not offered in $ZONE; TensorFlow pod images there: ${pods:-none};" \
    "pick one with --version= (the client's tensorflow-tpu follows it)"
}

# 1. The VM. Sets ATTACHED=1 when --watch found the study already running there (nothing to
# start). (A status, not a return code: under 'if f', 'set -e' is off inside f.)
ATTACHED=0
ensure_vm() {
  local spot
  ATTACHED=0
  if ((DRY_RUN)); then
    spot="${SPOT:-0}"
    echo "# the VM's state: $(show "${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" "--format=value(state,schedulingConfig.spot,schedulingConfig.preemptible,queuedResource)")"
    echo "# (any describe error but NOT_FOUND stops here, exit 1)"
    check_image_offered
    # Printed live: the branch of a fresh launch (no such VM). The others are commented out, so
    # that a pasted block does not create a VM and then delete it.
    echo "# no such VM (the branch printed as commands; the other states' are commented out):"
    create_vm "$spot"
    COMMENT=1
    echo "# PREEMPTED or TERMINATED: delete it, then create it as above (spot or not as it was):"
    delete_vm
    echo "# STOPPED:"
    run "${GCLOUD[@]}" start "$NAME" "${WHERE[@]}"
    echo "# READY: refuse if a run is active (pid file on worker 0)$( ((WATCH)) && echo "; --watch follows it"):"
    run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$PID_CHECK"
    COMMENT=0
    return 0
  fi
  read_vm
  # A re-created VM keeps the choice it was made with unless --spot / --no_spot says otherwise:
  # forgetting --spot after a preemption would silently bill an on-demand VM. The choice is read
  # from the VM, or, once Google has deleted a preempted spot node (describe: NOT_FOUND), from the
  # note this machine kept when it last saw or made the VM.
  if [[ -n "$STATE" ]]; then
    remember_spot "$WAS_SPOT"
  elif [[ -z "$SPOT" ]] && [[ "$(recalled_spot)" == 1 ]]; then
    WAS_SPOT=1
    note "$NAME was last a spot VM ($(spot_file)); it is made as one again (--no_spot to change)"
  fi
  spot="${SPOT:-$WAS_SPOT}"
  if [[ -n "$STATE" && -z "$SPOT" ]] && ((WAS_SPOT)); then
    note "$NAME was a spot VM; it stays one (--no_spot to change)"
  fi
  ((FROM_QUEUE)) && QUEUED=1
  case "$STATE" in
    "")
      note "no TPU VM $NAME in $ZONE; $( ((QUEUED)) && echo "queueing" || echo "creating") it"
      check_image_offered
      arm_delete
      create_vm "$spot" ;;
    READY)
      local active code=0
      active="$(with_timeout "$SSH_TIMEOUT_S" "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 \
        "--command=$PID_CHECK")" || code=$?
      ((code)) && refuse "could not reach worker 0 of $NAME to check for an active run (exit $code)"
      if [[ "$active" == *"wide_tf: running"* ]]; then
        if ((WATCH)); then
          note "a run is active on $NAME ($(pid_of "$active")); watching it"
          ATTACHED=1
          return 0
        fi
        refuse "a run is active on $NAME ($(pid_of "$active")); follow it with '$PROG --name=$NAME --zone=$ZONE --logs'" \
          "or wait for it to end: a second launch would replace its checkout and compete for the TPU"
      fi
      note "TPU VM $NAME is READY and idle; reusing it"
      arm_delete ;;
    PREEMPTED | TERMINATED)
      note "TPU VM $NAME is $STATE; deleting and creating it again (the study resumes from $WORKDIR)"
      arm_delete
      delete_vm
      create_vm "$spot" ;;
    STOPPED)
      note "TPU VM $NAME is STOPPED; starting it"
      arm_delete
      run "${GCLOUD[@]}" start "$NAME" "${WHERE[@]}" ;;
    *)
      refuse "TPU VM $NAME is $STATE; launch again once it is READY, STOPPED or PREEMPTED ('$PROG --name=$NAME --zone=$ZONE --status')" ;;
  esac
  return 0
}

# From here on the launch is this VM's: a failure deletes it under --delete_when_done (unless
# --keep_on_failure), and prints the billing line otherwise. Not before: a launch refused because
# another run is active, or a VM in transition, leaves that VM alone.
OWNED=0
arm_delete() {
  OWNED=1
  ((DELETE_WHEN_DONE)) && DELETE_ON_EXIT=1
  return 0
}

# The spot choice, kept on this machine per project, zone and name (one line: 1 spot, 0 not).
spot_file() {
  echo "${WIDE_TF_STATE_DIR:-${XDG_STATE_HOME:-${HOME:-/tmp}/.local/state}/wide_tf}/spot-${PROJECT:-default}-$ZONE-$NAME"
}
remember_spot() {  # 0|1; best effort (a read-only home only loses the note)
  local f
  f="$(spot_file)"
  { mkdir -p "${f%/*}" && echo "$1" >"$f"; } 2>/dev/null || true
}
recalled_spot() {
  cat "$(spot_file)" 2>/dev/null || true
}

# 2. This checkout's files (tracked ones, as they are in the working tree; no .venv, no runs/),
# and the config file if git does not track it.
ARCHIVE=""
make_archive() {
  [[ -n "$ARCHIVE" ]] && return 0
  local list="git ls-files -z"
  ((UNTRACKED_CONFIG)) && list+="; printf '%s\\0' $CONFIG_FILE"
  if ((DRY_RUN)); then
    ARCHIVE="/tmp/wide_tf_checkout.tar.gz"
    echo "# (cd $REPO_DIR && { $list; } | tar --null -T - -czf $ARCHIVE)"
  else
    ARCHIVE_DIR="$(mktemp -d "${TMPDIR:-/tmp}/wide_tf_checkout.XXXXXX")"  # on_exit removes it
    ARCHIVE="$ARCHIVE_DIR/wide_tf.tar.gz"
    (
      cd "$REPO_DIR"
      {
        git ls-files -z
        ((UNTRACKED_CONFIG)) && printf '%s\0' "$CONFIG_FILE"
        true
      } | tar --null -T - -czf "$ARCHIVE"
    )
  fi
}

# 3. Install on every worker. uv provides Python $PYTHON_VERSION (it downloads a standalone CPython
# build); the venv is kept between launches, its packages are brought to the pinned versions.
PIP="$R_VENV/bin/python -m pip install -q"
if ((JAX)); then mapfile -t NON_TF_DEPS < <(jax_deps); else mapfile -t NON_TF_DEPS < <(non_tf_deps); fi
mapfile -t GCS_DEPS < <(gcs_deps)
NON_TF_DEPS+=("${GCS_DEPS[@]}")
((${#NON_TF_DEPS[@]})) || fail "could not read install_requires from $REPO_DIR/setup.cfg"
DEPS=""  # double quotes: the remote shell must not glob or redirect on '*' and '>'
for d in "${NON_TF_DEPS[@]}"; do DEPS+="\"$d\" "; done
((TF_POD)) && DEPS+="\"cloud-tpu-client>=0.10\" "
# '; ' between the steps, not '&&': under 'set -e' a failure inside an '&&' list does not stop the shell.
INSTALL="set -e; rm -rf $R_CHECKOUT; mkdir -p $R_CHECKOUT; tar -xzf /tmp/wide_tf.tar.gz -C $R_CHECKOUT"
INSTALL+="; if [ ! -x $R_VENV/bin/python ]; then python3 -m pip install -q --user uv"
INSTALL+="; ~/.local/bin/uv venv --seed --python $PYTHON_VERSION $R_VENV; fi"
# One pip call for TensorFlow's TPU build, its libtpu and everything else: in two calls, the
# second one could move a package under the first (cloud-tpu-client's newest google-api-core 1.x
# wants protobuf < 4, which breaks TensorFlow; resolved together, pip keeps protobuf).
if ((JAX)); then  # jax[tpu] brings the libtpu its extra pins; no -f index (libtpu 0.0.x is on PyPI)
  INSTALL+="; $PIP \"jax[tpu]==$JAX_TPU\" ${DEPS% }"
else
  INSTALL+="; $PIP \"tensorflow-tpu==$TF_TPU\" \"libtpu==$LIBTPU\" ${DEPS% } -f $LIBTPU_INDEX"
fi
INSTALL+="; cd $R_CHECKOUT; $PIP --no-deps -e ."
INSTALL+="; echo '# written by launch_tpu.sh' > $R_ENV"
if [[ "$PJRT" == on ]]; then
  INSTALL+="; lib=\$($R_VENV/bin/python -c 'import libtpu; print(libtpu.get_library_path())')"
  INSTALL+="; echo \"export PJRT_DEVICE=TPU NEXT_PLUGGABLE_DEVICE_USE_C_API=true TF_PLUGGABLE_DEVICE_LIBRARY_PATH=\$lib\" >> $R_ENV"
fi
# The recipe's MLIR-bridge flags wherever TensorFlow builds the TPU program with the recipe's
# runtime: the single host's process under PJRT, a pod's client (the bridge runs where the graph
# is built). Not under --pjrt=off, the fallback to the old path.
if ((!JAX)) && { [[ "$PJRT" == on ]] || ((TF_POD)); }; then
  INSTALL+="; echo \"export TF_XLA_FLAGS='$RECIPE_XLA_FLAGS'\" >> $R_ENV"
fi
if ((TF_POD)); then
  INSTALL+="; echo 'export TPU_NAME=$NAME TPU_LOAD_LIBRARY=0' >> $R_ENV"
fi
# JAX on a multi-host slice: every worker's process calls jax.distributed.initialize() (engine/jax/run.py).
((JAX && MULTI_HOST)) && INSTALL+="; echo 'export WIDE_TF_JAX_DISTRIBUTED=1' >> $R_ENV"
# For the Python side (its logs and --check): the runtime the launcher set up and the pinned pair.
if ((JAX)); then
  INSTALL+="; echo \"export WIDE_TF_TPU_RUNTIME=$RUNTIME WIDE_TF_TPU_STACK='jax[tpu]==$JAX_TPU libtpu==$JAX_LIBTPU'\" >> $R_ENV"
  INSTALL+="; KERAS_BACKEND=jax $R_VENV/bin/python -c 'import sys, importlib.metadata as md, jax, keras, google.cloud.storage as gcs; print(\"wide_tf install:\", sys.version.split()[0], \"JAX\", jax.__version__, \"libtpu\", md.version(\"libtpu\"), \"Keras\", keras.__version__, \"tensorflow-cpu\", md.version(\"tensorflow-cpu\"), \"google-cloud-storage\", gcs.__version__)'"
else
  INSTALL+="; echo \"export WIDE_TF_TPU_RUNTIME=$RUNTIME WIDE_TF_TPU_STACK='tensorflow-tpu==$TF_TPU libtpu==$LIBTPU'\" >> $R_ENV"
  INSTALL+="; $R_VENV/bin/python -c 'import sys, tensorflow as tf, keras, google.cloud.storage as gcs; print(\"wide_tf install:\", sys.version.split()[0], \"TensorFlow\", tf.__version__, \"Keras\", keras.__version__, \"google-cloud-storage\", gcs.__version__)'"
fi
if ((TF_POD)); then
  INSTALL+="; systemctl is-active --quiet tpu-runtime || echo \"warning: the tpu-runtime service (TensorFlow's TPU server, port 8470) is not active on \$(hostname)\""
fi

quoted() {  # ARGS...: one shell word each (printf %q), for the VM's shell line
  local out="" a
  for a in "$@"; do out+=" $(printf '%q' "$a")"; done
  echo "${out# }"
}

# --check: on worker 0, initialise the TPU system; print its replica count (refused when it is not
# the one the config was checked for), the runtime path (PJRT through the pluggable-device variables,
# or TensorFlow's stream executor), the libtpu and TensorFlow versions and the memory TensorFlow
# reports for the first TPU device; then run the config's :check variant (batches that fit every
# slice of SLICES) in a scratch folder.
read -r -d '' CHECK_PY <<'PY' || true
import importlib.metadata as md, os, sys
import tensorflow as tf
r = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=sys.argv[1])
tf.config.experimental_connect_to_cluster(r)
tf.tpu.experimental.initialize_tpu_system(r)
n = tf.distribute.TPUStrategy(r).num_replicas_in_sync
env = os.environ.get
pjrt = env('PJRT_DEVICE') == 'TPU' and env('NEXT_PLUGGABLE_DEVICE_USE_C_API') == 'true' and bool(env('TF_PLUGGABLE_DEVICE_LIBRARY_PATH'))
try:
    maps = open('/proc/self/maps').read().split()
except OSError:
    maps = []
libs = sorted({w for w in maps if w.startswith('/') and 'libtpu' in w.rsplit('/', 1)[-1]})
if sys.argv[1] != 'local':
    path = 'gRPC TPU servers of the pod image (no PJRT variables)'
elif pjrt:
    path = 'PJRT (pluggable device %s, TF_XLA_FLAGS %s)' % (env('TF_PLUGGABLE_DEVICE_LIBRARY_PATH'), env('TF_XLA_FLAGS') or 'unset')
else:
    path = 'stream executor (no PJRT variables)'
def version(p):
    try:
        return md.version(p)
    except md.PackageNotFoundError:
        return 'not installed'
print('wide_tf check: runtime %s; tensorflow %s, libtpu %s; loaded %s; the launcher set up %s' % (path, tf.__version__, version('libtpu'), ', '.join(libs) or 'no libtpu', env('WIDE_TF_TPU_RUNTIME', '?')))
try:
    devs = tf.config.list_logical_devices('TPU')
    info = tf.config.experimental.get_memory_info(devs[0].name)
    print('wide_tf check: %s memory in use %d bytes, peak %d (the HBM per replica is in wide_tf/schema/memory.py)' % (devs[0].name, info['current'], info['peak']))
except Exception as e:
    print('wide_tf check: device memory not reported (%s: %s)' % (type(e).__name__, e))
print('wide_tf check: the TPU system has %d replicas (expected %s)' % (n, sys.argv[2]))
sys.exit(0 if n == int(sys.argv[2]) else 3)
PY
TPU_CHECK="cd $R_CHECKOUT && . $R_ENV && $R_VENV/bin/python -c $(printf '%q' "$CHECK_PY") $TPU_ARG $REPLICAS"
TPU_CHECK+=" && rm -rf /tmp/wide_tf_check && $R_VENV/bin/python -m wide_tf.main $(quoted "${CHECK_FLAGS[@]}") && echo 'wide_tf check: the :check run passed'"
TPU_CHECK+=" && $R_VENV/bin/python -m wide_tf.tools.check $(quoted "${STUDY_CHECK_FLAGS[@]}") && echo 'wide_tf check: the study stage passed'"
# --backend=jax: JAX's devices as the run takes them, their kinds, the process count and a psum over
# all of them (wide_tf/tools/jax_check.py, no TensorFlow), then the :check study on the JAX
# backend. A multi-host slice runs the device stage on every worker (JAX programs are the same on
# every host) and no :check study (a sweep, refused over several processes: checks/preflight.py).
# The study stage (wide_tf/tools/check.py) is TensorFlow's (TPUStrategy) and not run here.
CHECK_WORKER=0 RUN_WORKERS=0
if ((JAX)); then
  TPU_CHECK="cd $R_CHECKOUT && . $R_ENV && $R_VENV/bin/python -m wide_tf.tools.jax_check --replicas=$REPLICAS"
  if ((MULTI_HOST)); then
    CHECK_WORKER=all RUN_WORKERS=all
  else
    TPU_CHECK+=" && rm -rf /tmp/wide_tf_check && $R_VENV/bin/python -m wide_tf.main $(quoted "${CHECK_FLAGS[@]}") && echo 'wide_tf check: the :check run passed'"
  fi
fi

# 4. The run on worker 0: it outlives the ssh session; one log per launch; its pid on file. A
# small bash wrapper (argv: log, gs:// folder, command) runs it, copies the log to the workdir
# (the VM's disk goes with the VM) and then writes the exit status, which --watch reads: 0 done,
# 143 preempted (SIGTERM; wide_tf/engine/preemption.py), anything else failed. gcloud ships on TPU VM
# images; gsutil is the fallback.
# shellcheck disable=SC2016  # single quotes on purpose: the wrapper's $1, $@ ... are its own
readonly RUNNER='log=$1; dest=$2; shift 2; "$@" > "$log" 2>&1 < /dev/null; code=$?; { gcloud storage cp "$log" "$dest/" || gsutil -q cp "$log" "$dest/"; } >> "$log" 2>&1; echo "$code" > ~/wide_tf.exit; exit "$code"'
LOG="" START=""
start_command() {  # sets LOG and START (a global, not echoed: $(...) would lose LOG)
  local stamp log
  stamp="$(date -u +%Y%m%d-%H%M%S)"
  log="$R_LOGS/$stamp.log"
  # JAX on a multi-host slice: every worker logs; the worker's name in each log's (the copies
  # share WORKDIR/logs/NAME/), expanded by the worker's shell.
  ((JAX && MULTI_HOST)) && log="$R_LOGS/$stamp-\$(hostname).log"
  LOG="$log"
  local main
  main="$R_VENV/bin/python -m wide_tf.main $(quoted "${VM_FLAGS[@]}")"
  local start="cd $R_CHECKOUT && mkdir -p $R_LOGS && rm -f $R_EXIT && . $R_ENV && ln -sfn $log $R_LOGS/latest.log"
  # The braces: '&' would otherwise send the whole '&&' chain to a subshell, and $! would be its pid.
  start+=" && { nohup bash -c '$RUNNER' wide_tf_run $log ${WORKDIR%/}/logs/$NAME $main > /dev/null 2>&1 < /dev/null & echo \$! > $R_PID; }"
  START="$start"
}

check_words() {  # what --check runs, for the dry run
  if ((JAX && MULTI_HOST)); then
    echo "JAX's devices, process count and a psum on every worker (no :check study: a sweep is refused over several processes)"
  elif ((JAX)); then
    echo "JAX's devices and a psum, then a :check run on the JAX backend, on worker 0 (no study stage: wide_tf/tools/check.py is TensorFlow's)"
  else
    echo "the TPU system and a :check run on worker 0"
  fi
}

runtime_line() {  # the TPU software the VM gets, as one line (the dry run prints it first)
  local how
  if ((JAX)); then
    how="JAX through PJRT (libtpu), no TensorFlow TPU build"
    ((MULTI_HOST)) && how+="; jax.distributed.initialize() on each of $HOSTS workers (WIDE_TF_JAX_DISTRIBUTED=1)"
    echo "# TPU software: jax[tpu]==$JAX_TPU (libtpu==$JAX_LIBTPU, its tpu extra's pin), tensorflow-cpu for gs:// files only, image $VERSION, runtime $how"
    return 0
  fi
  case "$RUNTIME" in
    pjrt) how="PJRT (PJRT_DEVICE=TPU NEXT_PLUGGABLE_DEVICE_USE_C_API=true TF_PLUGGABLE_DEVICE_LIBRARY_PATH=libtpu's .so; TF_XLA_FLAGS=$RECIPE_XLA_FLAGS)" ;;
    stream_executor) how="stream executor (--pjrt=off: no PJRT variables, no TF_XLA_FLAGS)" ;;
    *) how="the PJRT pod image's TPU servers over gRPC, the client on worker 0 with TF_XLA_FLAGS=$RECIPE_XLA_FLAGS (experimental)" ;;
  esac
  echo "# TPU software: tensorflow-tpu==$TF_TPU libtpu==$LIBTPU, image $VERSION, runtime $how"
}

launch_once() {
  ((DRY_RUN)) && runtime_line
  ensure_vm
  ((ATTACHED)) && return 0
  make_archive
  ((DRY_RUN)) && echo "# each remote step is stopped past its limit (copy, start and checks ${SSH_TIMEOUT_S}s," \
    "install ${INSTALL_TIMEOUT_S}s$( ((CHECK)) && echo ", --check ${CHECK_TIMEOUT_S}s")): exit 1$( ((DELETE_WHEN_DONE && !KEEP_ON_FAILURE)) && echo ", the VM deleted")"
  limited "$SSH_TIMEOUT_S" WIDE_TF_SSH_TIMEOUT_S "the copy of the checkout" \
    "${GCLOUD[@]}" scp "$ARCHIVE" "$NAME:/tmp/wide_tf.tar.gz" "${WHERE[@]}" --worker=all \
    || fail "copying the checkout to $NAME failed; the output is above"
  limited "$INSTALL_TIMEOUT_S" WIDE_TF_INSTALL_TIMEOUT_S "the install" \
    "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all "--command=$INSTALL" \
    || fail "the install failed on $NAME; its output is above"
  if ((CHECK)); then
    ((DRY_RUN)) && echo "# --check: $(check_words), before the study"
    local out="" code=0
    if ((DRY_RUN)); then
      run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" "--worker=$CHECK_WORKER" "--command=$TPU_CHECK"
    else
      echo "+ $(show "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" "--worker=$CHECK_WORKER" "--command=$TPU_CHECK")" >&2
      out="$(with_timeout "$CHECK_TIMEOUT_S" "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" "--worker=$CHECK_WORKER" \
        "--command=$TPU_CHECK")" || code=$?
      echo "$out"
      ((code == 124)) && fail "--check on $NAME did not finish in ${CHECK_TIMEOUT_S}s and was stopped" \
        "(WIDE_TF_CHECK_TIMEOUT_S=SECONDS sets the limit); the study was not started"
      ((code)) && fail "--check failed on $NAME (exit $code; its output is above); the study was not started"
      local came_up
      came_up="$(grep -m 1 '^wide_tf check: runtime ' <<<"$out" || true)"
      note "the TPU came up through: ${came_up#wide_tf check: runtime }"
    fi
  fi
  start_command
  ((DRY_RUN && JAX && MULTI_HOST)) && echo "# the same run on every worker (JAX: one program on every host, jax.distributed); worker 0 writes the workdir and is the one watched"
  limited "$SSH_TIMEOUT_S" WIDE_TF_SSH_TIMEOUT_S "the start" \
    "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" "--worker=$RUN_WORKERS" "--command=$START" \
    || fail "starting the run on $NAME failed; the output is above"
  # The process checked alive: a run that dies at once (a missing data set, a bad flag that only
  # the VM sees) is reported now with its last log lines, not found hours later.
  if ((DRY_RUN)); then
    echo "# after ${ALIVE_WAIT_S}s, the run must be alive (or have exited 0):"
    run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 "--command=$PID_CHECK"
    return 0
  fi
  sleep "$ALIVE_WAIT_S"
  local alive code=0
  alive="$(with_timeout "$SSH_TIMEOUT_S" "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 \
    "--command=$PID_CHECK")" || code=$?
  ((code)) && fail "started on $NAME but could not reach worker 0 to check the run (exit $code);" \
    "'$PROG --name=$NAME --zone=$ZONE --status'"
  case "$alive" in
    *"wide_tf: running"* | *"wide_tf: exited 0"*) return 0 ;;
  esac
  last_lines "$LOG"
  fail "the run on $NAME is not running ($alive) ${ALIVE_WAIT_S}s after the start; its last log lines are above"
}

last_lines() {  # LOG: its last 20 lines on stderr, if worker 0 answers in time
  with_timeout "$SSH_TIMEOUT_S" "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 \
    "--command=tail -n 20 $1" >&2 || true
}

finish() {  # CODE: the end of a --watch (on_exit deletes the VM under --delete_when_done)
  ((DELETE_WHEN_DONE || $1)) || billing_line
  exit "$1"
}

billing_line() {
  note "$NAME is still billed while it exists: '$PROG --name=$NAME --zone=$ZONE${PROJECT:+ --project=$PROJECT} --delete'"
}

# Whatever ends the launch: the checkout archive goes. Under --delete_when_done the VM is deleted
# however the launch ends once it is this launch's VM (created, started, reused or attached to):
# done, a failed install, --check or start on the first launch, a step past its limit, a stuck
# study, a failed relaunch, an error, Ctrl-C. Before, the delete was armed only once the watch
# began, and a first launch that failed exited 1 with the VM up. --keep_on_failure keeps it after
# a failure (for debugging); any failure that leaves the VM says it is billed.
ARCHIVE_DIR="" DELETE_ON_EXIT=0
TIMEOUT_MARK="$(mktemp -u "${TMPDIR:-/tmp}/wide_tf_timeout.XXXXXX")"
on_exit() {
  local code=$?
  trap - EXIT
  [[ -n "$ARCHIVE_DIR" ]] && rm -rf "$ARCHIVE_DIR"
  rm -f "$TIMEOUT_MARK".*
  if ((DELETE_ON_EXIT)) && ((code == 0 || !KEEP_ON_FAILURE)); then
    note "deleting $NAME (--delete_when_done; the launch ended with exit $code)"
    if delete_vm; then
      exit "$code"
    fi
    note "warning: deleting $NAME failed"
    billing_line
  elif ((code && OWNED)); then
    ((DELETE_ON_EXIT)) && note "$NAME is kept for debugging (--keep_on_failure)"
    billing_line
  fi
  exit "$code"
}
trap on_exit EXIT
trap 'stop_background; exit 130' INT
trap 'stop_background; exit 143' TERM

# --watch: every POLL_S seconds, the VM's state and the run's. READY and running: wait, unless its
# log has not changed for --stall_minutes (the watchdog: a hung TPU initialisation, a stuck read,
# a deadlock), which is a failure; a run that waits for groups other VMs hold is not stuck. Exited
# 0: the study is done. Exited 143, or no run on a READY VM (a host maintenance reboot), or the VM
# PREEMPTED, TERMINATED, STOPPED or gone: launch again (the study resumes from the workdir).
# Exited with anything else: the study failed; relaunching would fail the same way.
watch_loop() {
  local relaunches=0 answer errors=0 idle code
  if ((DRY_RUN)); then
    echo "# --watch: every ${POLL_S}s the VM's state and the run's (above); preempted, gone or"
    echo "#   stopped: launch again as above (at most $MAX_RELAUNCHES times); exited 0: done;"
    echo "#   exited otherwise, or no new log line for $STALL_S s (--stall_minutes): failed (exit 1)$( ((DELETE_WHEN_DONE)) && echo "; then, however the launch ends (--delete_when_done$( ((KEEP_ON_FAILURE)) && echo ", kept after a failure: --keep_on_failure")):")"
    COMMENT=1
    ((DELETE_WHEN_DONE)) && delete_vm
    COMMENT=0
    return 0
  fi
  arm_delete
  while :; do
    sleep "$POLL_S"
    read_vm
    if [[ "$STATE" == READY ]]; then
      code=0
      answer="$(with_timeout "$SSH_TIMEOUT_S" "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 \
        "--command=$PID_CHECK")" || code=$?
      if ((code)); then
        errors=$((errors + 1))
        ((errors < 5)) || fail "could not reach worker 0 of $NAME 5 times in a row; stopped watching"
        continue
      fi
      errors=0
      case "$answer" in
        *"wide_tf: running"*)
          idle=0
          [[ "$answer" =~ idle\ ([0-9]+) ]] && idle="${BASH_REMATCH[1]}"
          if ((STALL_S > 0 && idle >= STALL_S)) && [[ "$answer" != *waiting* ]]; then
            last_lines "$R_LOGS/latest.log"
            fail "no progress on $NAME: the run's log has not changed for ${idle}s (--stall_minutes=$STALL_MINUTES);" \
              "the study is treated as stuck (its last log lines are above)"
          fi
          continue ;;
        *"wide_tf: exited 0"*)
          note "the study is done on $NAME; the results are in $WORKDIR (logs in ${WORKDIR%/}/logs/$NAME)"
          finish 0 ;;
        *"wide_tf: exited $EXIT_PREEMPTED"* | *"wide_tf: no run active"*)
          note "the run on $NAME stopped (${answer##*wide_tf: }); launching again" ;;
        *)
          note "the study failed on $NAME (${answer##*wide_tf: }); its log: ${WORKDIR%/}/logs/$NAME/"
          finish 1 ;;
      esac
    else
      case "$STATE" in
        PREEMPTED | TERMINATED | STOPPED | "") note "TPU VM $NAME is ${STATE:-gone}; launching again" ;;
        *) continue ;;  # CREATING, REPAIRING, STOPPING, ...: wait for it to settle
      esac
    fi
    relaunches=$((relaunches + 1))
    ((relaunches <= MAX_RELAUNCHES)) || fail "$NAME was launched again $MAX_RELAUNCHES times; stopped watching"
    launch_once
  done
}

# ---- a launch --------------------------------------------------------------------------------
launch_once
((WATCH)) && watch_loop

((DRY_RUN)) && STARTED="Would start" || STARTED="Started"
if ((JAX)); then STACK="jax[tpu] $JAX_TPU with libtpu $JAX_LIBTPU"; else STACK="tensorflow-tpu $TF_TPU with libtpu $LIBTPU"; fi
if ((JAX && MULTI_HOST)); then WHO="the run on every worker, worker 0 writing"; else WHO="the run on worker 0"; fi
OPTS="--name=$NAME --zone=$ZONE"
[[ -n "$PROJECT" ]] && OPTS+=" --project=$PROJECT"
cat <<EOT
# $STARTED on $NAME ($ACCELERATOR, $REPLICAS replicas, image $VERSION, $STACK, runtime $RUNTIME, $HOSTS host(s); $WHO), log ${LOG:-(on the VM)}.
#   $PROG $OPTS --status          # VM state, run active or not, last log lines
#   $PROG $OPTS --logs --follow   # the log (Ctrl-C stops following, not the run)
#   tensorboard --logdir=$WORKDIR # from any machine with access to the bucket
#   $PROG --workdir=$WORKDIR --report
#   $PROG $OPTS --delete          # the VM is billed while it exists
# After a preemption, run this same launch again (or add --watch): it recreates the VM and resumes the study.
EOT
