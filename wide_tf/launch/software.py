"""Owns the TPU software a launch installs: the table of tensorflow-tpu releases and the libtpu each
wheel pairs with, the jax[tpu] pin, Google's images and zones per slice family, and the choice of
image and runtime (PJRT, the pod image's gRPC servers, JAX) for a slice; the slices themselves are
wide_tf/schema/memory.py's."""

from __future__ import annotations

import dataclasses
import re

from wide_tf.launch.options import Options, usage_error
from wide_tf.schema import memory

# Per TensorFlow minor: the tensorflow-tpu release on PyPI and the libtpu its wheel declares
# (Requires-Dist, read with `pip install --dry-run --no-deps --report - tensorflow-tpu==X`: 2.20.0
# 'libtpu~=0.0.14', 2.19.1 'libtpu==0.0.10', 2.18.0 'libtpu==2.18.0', 2.17.1 'libtpu==2.17.1';
# there is no tensorflow-tpu 2.19.0 or 2.21). The default, 2.19.1 with libtpu 0.0.10 through PJRT,
# is the pair upstream still tests and shows: keras-team/keras requirements-tensorflow-tpu.txt and
# keras-io examples/keras_rs/distributed_embedding_tf.py (PJRT_DEVICE=TPU,
# NEXT_PLUGGABLE_DEVICE_USE_C_API=true, TF_PLUGGABLE_DEVICE_LIBRARY_PATH, TF_XLA_FLAGS). 2.20.0 is
# opt-in: no Keras-team file pins it for TPU and no tpu-vm-tf-2.20 image is on record; its
# '~=0.0.14' lets pip take any 0.0.x, so the launcher pins the one it names. docs/tpu.md,
# "Matched TPU software", has the sources.
DEFAULT_TF_TPU = "2.19.1"
TF_TPU_OF_MINOR = {"2.17": "2.17.1", "2.18": "2.18.0", "2.19": "2.19.1", "2.20": "2.20.0"}
LIBTPU_OF = {
    "2.17.0": "2.17.0",
    "2.17.1": "2.17.1",
    "2.18.0": "2.18.0",
    "2.19.1": "0.0.10",
    "2.20.0": "0.0.14",
}
# Where TensorFlow's install page points pip for the libtpu builds that go with tensorflow-tpu.
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
# --backend=jax: jax[tpu] at the JAX this package's JAX path is tested with; its tpu extra pins
# libtpu (Requires-Dist of jax 0.10.2: 'libtpu==0.0.42.*; extra == "tpu"'), on PyPI, no index.
JAX_TPU, JAX_LIBTPU = "0.10.2", "0.0.42.*"
RECIPE_XLA_FLAGS = (
    "--tf_mlir_enable_mlir_bridge=true --tf_mlir_enable_convert_control_to_data_outputs_pass=true "
    "--tf_mlir_enable_merge_control_flow_pass=true"
)
# Google's framework-neutral image per family, for JAX and for TensorFlow from pip on a single
# host (cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX").
BASE_IMAGE = {"v5litepod": "v2-alpha-tpuv5-lite", "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}
# Only v4 has a default zone (us-central2-b, its only one); the zones per family for the message
# (cloud.google.com/tpu/docs/regions-zones, North America and Europe).
DEFAULT_ZONE = {"v4": "us-central2-b"}
ZONES = {
    "v2": "us-central1-b, us-central1-c (v2-8)",
    "v3": "us-central1-a, us-central1-b (v3-8)",
    "v5litepod": "us-central1-a, us-south1-a, us-west1-c, us-west4-a",
    "v5p": "us-central1-a, us-east5-a",
    "v6e": "us-central1-b, us-east1-d, us-east5-a, us-east5-b, europe-west4-a",
}


@dataclasses.dataclass
class Software:
    """What the VMs of a launch get: the image, the runtime and the pinned packages."""

    slice: memory.Slice
    jax: bool
    version: str = ""  # the image (--version of gcloud create)
    runtime: str = ""  # pjrt | stream_executor | grpc_tpu_server | jax
    tf_tpu: str = ""
    libtpu: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def multi_host(self) -> bool:
        return self.slice.hosts > 1

    @property
    def tf_pod(self) -> bool:  # gRPC TPU servers on every worker, one client on worker 0
        return self.multi_host and not self.jax

    @property
    def stack(self) -> str:
        if self.jax:
            return f"jax[tpu]=={JAX_TPU} libtpu=={JAX_LIBTPU}"
        return f"tensorflow-tpu=={self.tf_tpu} libtpu=={self.libtpu}"


def base_image(family: str) -> str:
    return BASE_IMAGE.get(family, "tpu-ubuntu2204-base")


def resolve_slice(o: Options) -> memory.Slice:
    try:
        s = memory.parse_slice(o.accelerator)
    except ValueError as e:
        raise usage_error(f"--accelerator={o.accelerator}: {e}") from None
    if not o.zone:
        o.zone = DEFAULT_ZONE.get(s.family, "")
        if not o.zone:
            raise usage_error(
                f"--accelerator={o.accelerator} needs --zone: us-central2-b (the v4 default) has "
                f"no {s.family}; Google lists {s.family} in {ZONES[s.family]} (docs/tpu.md, "
                "'Which config runs where')"
            )
    return s


def resolve(o: Options, s: memory.Slice) -> Software:
    sw = Software(s, jax=o.backend == "jax")
    if sw.jax:
        _jax(o, sw)
    else:
        _tensorflow(o, sw)
        _image(o, sw)
        if sw.tf_pod:
            sw.runtime = "grpc_tpu_server"
        else:
            sw.runtime = "stream_executor" if o.pjrt == "off" else "pjrt"
        # Experimental for TensorFlow (docs/tpu.md, "Which path upstream supports"): v6e and
        # every pod slice; the recommended paid path is N single hosts.
        if sw.multi_host or s.family == "v6e":
            what = "a pod slice" if sw.multi_host else "v6e"
            sw.notes.append(
                f"note: {o.accelerator} is experimental for TensorFlow ({what}); the recommended "
                "paid path is N x v4-8 (--shards=N) or v5litepod-8 (docs/tpu.md)"
            )
    return sw


def _jax(o: Options, sw: Software) -> None:
    for flag in ("tf_tpu", "tf_version", "libtpu", "pjrt"):
        if flag in o.given:
            raise usage_error(
                f"--{flag} is for --backend=tensorflow; --backend=jax installs "
                f"jax[tpu]=={JAX_TPU} with the libtpu its tpu extra pins (libtpu=={JAX_LIBTPU}) "
                f"and no PJRT variables: drop --{flag}"
            )
    image = base_image(sw.slice.family)
    if o.version and o.version != image:
        raise usage_error(
            f"--version={o.version}: --backend=jax on {sw.slice.family} takes Google's JAX image "
            f"{image} (cloud.google.com/tpu/docs/runtimes); drop --version"
        )
    sw.version, sw.runtime, sw.libtpu = image, "jax", JAX_LIBTPU


def _pod_client(o: Options) -> str:
    """A pod's client must be its image's TensorFlow X.Y: derived from --version, or refused."""
    m = re.fullmatch(r"tpu-vm-tf-([0-9]+\.[0-9]+)\.[0-9]+-pod(-[a-z0-9]+)*", o.version)
    if not m:
        raise usage_error(
            f"--accelerator={o.accelerator} is a multi-host slice: it needs a TensorFlow pod "
            "image (tpu-vm-tf-X.Y.Z-pod-pjrt), which starts the TPU server on every worker"
        )
    minor = m.group(1)
    if not o.tf_tpu and minor not in TF_TPU_OF_MINOR:
        raise usage_error(
            f"--version={o.version}: no tensorflow-tpu {minor}.x in the launcher's table (2.17 to "
            f"2.20); give --tf_tpu={minor}.Z and --libtpu"
        )
    tf_tpu = o.tf_tpu or TF_TPU_OF_MINOR[minor]
    if not tf_tpu.startswith(minor + "."):
        raise usage_error(
            f"--tf_tpu={tf_tpu} does not match --version={o.version} (TensorFlow {minor}): the "
            "client must be the image's TensorFlow; drop --tf_tpu to use tensorflow-tpu "
            f"{TF_TPU_OF_MINOR.get(minor, minor + '.x')}"
        )
    return tf_tpu


def _tensorflow(o: Options, sw: Software) -> None:
    tf_tpu = _pod_client(o) if sw.tf_pod and o.version else o.tf_tpu
    if o.tf_version:  # --tf_version=X.Y: the table's tensorflow-tpu of that minor
        if o.tf_version not in TF_TPU_OF_MINOR:
            raise usage_error(
                f"--tf_version={o.tf_version}: the launcher's table has TensorFlow 2.17, 2.18, "
                "2.19 (the default, 2.19.1) and 2.20 (opt-in); give one of those"
            )
        if tf_tpu and tf_tpu != TF_TPU_OF_MINOR[o.tf_version]:
            raise usage_error(
                f"--tf_tpu={tf_tpu} does not match --tf_version={o.tf_version} "
                f"({TF_TPU_OF_MINOR[o.tf_version]}); give one of the two"
            )
        tf_tpu = TF_TPU_OF_MINOR[o.tf_version]
    sw.tf_tpu = tf_tpu or DEFAULT_TF_TPU
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", sw.tf_tpu):
        raise usage_error(
            f"--tf_tpu={sw.tf_tpu}: give a tensorflow-tpu version from PyPI (e.g. {DEFAULT_TF_TPU})"
        )
    sw.libtpu = o.libtpu or LIBTPU_OF.get(sw.tf_tpu, "")
    if not sw.libtpu:
        raise usage_error(
            f"--tf_tpu={sw.tf_tpu}: not in the launcher's table (tensorflow-tpu "
            f"{', '.join(LIBTPU_OF)}); give the libtpu its wheel declares with --libtpu"
        )
    minor = sw.tf_tpu.rsplit(".", 1)[0]
    if minor == "2.20":
        sw.notes.append(
            f"note: tensorflow-tpu {sw.tf_tpu} (opt-in): no Keras-team file pins it for TPU and no "
            f"tpu-vm-tf-2.20 image is on record; the default is {DEFAULT_TF_TPU} (docs/tpu.md)"
        )
    elif minor != "2.19":
        sw.notes.append(
            f"note: tensorflow-tpu {sw.tf_tpu}: the package's CPU suite was not run on TensorFlow "
            f"{minor} (docs/tpu.md); the default is {DEFAULT_TF_TPU}"
        )


def _image(o: Options, sw: Software) -> None:
    family = sw.slice.family
    if sw.tf_pod:
        # Google documents TensorFlow pod images for v2-v4, v5e and v5p; TensorFlow is not in its
        # v6e support list (docs/tpu.md): no default image there.
        if family == "v6e" and not o.version:
            raise usage_error(
                f"--accelerator={o.accelerator}: Google documents no TensorFlow pod image for "
                "multi-host v6e; use v6e-8 or smaller, N x v4-8 with --shards=N, or "
                "--version=tpu-vm-tf-X.Y.Z-pod-pjrt if 'gcloud compute tpus tpu-vm versions "
                "list' shows one"
            )
        sw.version = o.version or f"tpu-vm-tf-{sw.tf_tpu}-pod-pjrt"
        return
    # A single host: the family's framework-neutral image or a TensorFlow image
    # tpu-vm-tf-X.Y.Z[-pjrt][-...] (the venv's TensorFlow is used either way).
    base = base_image(family)
    tf_image = re.fullmatch(r"tpu-vm-tf-[0-9]+\.[0-9]+\.[0-9]+(-[a-z0-9]+)*", o.version)
    if o.version and (o.version != base and not tf_image or "-pod" in o.version):
        raise usage_error(
            f"--version={o.version}: a single-host {family} takes {base} (the default) or a "
            "TensorFlow image tpu-vm-tf-X.Y.Z[-pjrt] ('gcloud compute tpus tpu-vm versions list "
            f"--zone={o.zone}' lists them); drop --version for the default"
        )
    sw.version = o.version or base


def runtime_line(sw: Software) -> str:
    """The TPU software the VMs get, as one line (the dry run prints it first)."""
    if sw.jax:
        how = "JAX through PJRT (libtpu), no TensorFlow TPU build"
        if sw.multi_host:
            how += (
                f"; jax.distributed.initialize() on each of {sw.slice.hosts} workers "
                "(WIDE_TF_JAX_DISTRIBUTED=1)"
            )
        return (
            f"# TPU software: jax[tpu]=={JAX_TPU} (libtpu=={JAX_LIBTPU}, its tpu extra's pin), "
            f"tensorflow-cpu for gs:// files only, image {sw.version}, runtime {how}"
        )
    how = {
        "pjrt": "PJRT (PJRT_DEVICE=TPU NEXT_PLUGGABLE_DEVICE_USE_C_API=true "
        f"TF_PLUGGABLE_DEVICE_LIBRARY_PATH=libtpu's .so; TF_XLA_FLAGS={RECIPE_XLA_FLAGS})",
        "stream_executor": "stream executor (--pjrt=off: no PJRT variables, no TF_XLA_FLAGS)",
        "grpc_tpu_server": "the PJRT pod image's TPU servers over gRPC, the client on worker 0 "
        f"with TF_XLA_FLAGS={RECIPE_XLA_FLAGS} (experimental)",
    }[sw.runtime]
    return f"# TPU software: {sw.stack}, image {sw.version}, runtime {how}"
