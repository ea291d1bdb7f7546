#!/usr/bin/env bash
# Sets a TPU VM up for wide_tf, on every worker (python -m wide_tf.launch runs it over ssh from
# the unpacked checkout): a Python venv (uv brings the Python; TPU images ship 3.10), one pip
# install of everything (resolved together: in two calls the second could move a package under
# the first), this checkout without its dependencies, then the environment file and a line of
# versions (python -m wide_tf.launch.vm.setup).
#   bash vm_setup.sh VENV PYTHON_VERSION PIP_ARGS... -- SETUP_FLAGS...
set -euo pipefail
venv=$1 python=$2
shift 2
pip=()
while (($#)) && [[ $1 != -- ]]; do pip+=("$1"); shift; done
shift
if [[ ! -x $venv/bin/python ]]; then
  python3 -m pip install -q --user uv
  ~/.local/bin/uv venv --seed --python "$python" "$venv"
fi
"$venv/bin/python" -m pip install -q "${pip[@]}"
cd "$(dirname "$0")"
"$venv/bin/python" -m pip install -q --no-deps -e .
exec "$venv/bin/python" -m wide_tf.launch.vm.setup "$@"
