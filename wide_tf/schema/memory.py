"""Owns the memory model: each accelerator's memory per replica (with its source) and the bytes one
member needs per example, from its architecture alone; pure Python, no TensorFlow.

The model (docs/accelerators.md, "Memory"): a training step keeps, per example, the output of every
layer of the forward pass (each Keras layer's output tensor counted once: an upper bound on what the
backward pass needs, since an Add or a pooling layer saves nothing) at the compute dtype (4 bytes in
float32, 2 under mixed_bfloat16), times the per-replica (micro-)batch; plus 16 bytes per parameter
(float32 weights, gradients and two optimizer slots). A replica may use `USABLE_FRACTION` of its
device's memory; the rest is left to the runtime, XLA's scratch space, the evaluation and probe sets
and fragmentation. Checked on CPU (tests/schema/test_memory.py): the element counts equal the sum of
the Keras models' layer output sizes; WRN-40-1.64 counts 8.2 MB per example in float32 against the
5.7 MB measured on CPU, so the model errs on the safe side by about 1.4x. Not modelled: TPU layout
padding (XLA tiles the two minor dimensions to 8 x 128, which may pad narrow channel counts),
rematerialisation (which lowers the peak)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from wide_tf.schema import architectures, rules

GB = 10**9
GIB = 2**30
USABLE_FRACTION = 0.85
STATE_BYTES_PER_PARAM = 16  # float32 weights, gradients and two optimizer slots (momentum, ...)
POLICY_BYTES = {"float32": 4, "mixed_bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class Device:
    """One replica's device: its memory in bytes and where the number comes from."""

    name: str
    platform: str  # 'tpu' | 'gpu': the runtime's default dtype policy follows it
    memory: int  # bytes per replica (a TensorCore on v2/v3, a chip on v4 and later, a GPU)
    stated: str  # the figure as its source states it
    source: str

    @property
    def usable(self) -> int:
        return int(self.memory * USABLE_FRACTION)


def _tpu(name, memory, stated, source) -> Device:
    return Device(name, "tpu", memory, stated, source)


def _gpu(name, gb, source) -> Device:
    # NVIDIA states GPU memory in GB; the A100 40GB reports 40,441 MiB (42.4e9 bytes) to CUDA, so
    # reading "GB" as 10^9 bytes errs low.
    return Device(name, "gpu", gb * GB, f"{gb} GB", source)


# One replica per TPU device under TPUStrategy: v2 and v3 show each of a chip's two TensorCores as
# a device (half the chip's HBM each), v4 and v5p chips are one device (megacore), v5e and v6e
# have one TensorCore per chip.
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # 16 GiB of HBM per chip, two TensorCores (Jouppi et al., "A Domain Specific
        # Supercomputer for Training Deep Neural Networks", https://dl.acm.org/doi/pdf/10.1145/3360307,
        # the architecture reference of https://cloud.google.com/tpu/docs/v2; not read here).
        _tpu(
            "v2", 8 * GIB, "16 GiB per chip, 2 TensorCores", "https://cloud.google.com/tpu/docs/v2"
        ),
        # "HBM2 capacity and bandwidth: 32 GiB, 900 GBps" per chip, two TensorCores.
        _tpu(
            "v3", 16 * GIB, "32 GiB per chip, 2 TensorCores", "https://cloud.google.com/tpu/docs/v3"
        ),
        # "HBM2 capacity and bandwidth: 32 GiB, 1200 GBps" per chip (megacore: one device).
        _tpu("v4", 32 * GIB, "32 GiB per chip", "https://cloud.google.com/tpu/docs/v4"),
        # "HBM2 capacity and bandwidth: 16 GB, 819 GBps" per chip.
        _tpu("v5e", 16 * GB, "16 GB per chip", "https://cloud.google.com/tpu/docs/v5e"),
        # "HBM2e capacity and bandwidth: 95 GB, 2765 GBps" per chip (megacore: one device).
        _tpu("v5p", 95 * GB, "95 GB per chip", "https://cloud.google.com/tpu/docs/v5p"),
        # "HBM capacity per chip: 32 GB".
        _tpu("v6e", 32 * GB, "32 GB per chip", "https://cloud.google.com/tpu/docs/v6e"),
        # NVIDIA data sheets; the search that found them returned secondary copies, named here.
        _gpu("v100-16gb", 16, "NVIDIA V100 data sheet (16 GB HBM2)"),
        _gpu("v100-32gb", 32, "NVIDIA V100 data sheet (32 GB HBM2)"),
        _gpu("t4", 16, "NVIDIA T4 data sheet (16 GB GDDR6)"),
        _gpu("l4", 24, "NVIDIA L4 data sheet (24 GB GDDR6)"),
        _gpu("a10g", 24, "AWS G5 instances (24 GB per A10G)"),
        _gpu(
            "a100-40gb",
            40,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        ),
        _gpu(
            "a100-80gb",
            80,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        ),
        _gpu("h100-80gb", 80, "NVIDIA H100 data sheet (80 GB HBM3, SXM and PCIe)"),
        _gpu("h200", 141, "NVIDIA H200 data sheet (141 GB HBM3e)"),
        # The GPUs rented most often beside those. The searches found NVIDIA's figures
        # through resellers' and reviewers' copies of the data sheets, named here.
        _gpu(
            "l40s",
            48,
            "NVIDIA L40S data sheet (48 GB GDDR6 with ECC; copy: "
            "https://www.itcreations.com/nvidia-gpu/nvidia-l40s-gpu-accelerator)",
        ),
        _gpu(
            "l40",
            48,
            "NVIDIA L40/L40S data sheet (48 GB GDDR6 with ECC; copy: "
            "https://www.mullet.se/product.html?product_id=355414)",
        ),
        _gpu(
            "a40",
            48,
            "NVIDIA A40 product brief PB-09976-001_v04 (48 GB GDDR6 with ECC; copy: "
            "https://readkong.com/page/nvidia-a40-gpu-accelerator-product-brief-7654466)",
        ),
        _gpu(
            "a10",
            24,
            "NVIDIA A10 (24 GB GDDR6, as the A10G: "
            "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/)",
        ),
        _gpu(
            "rtx-6000-ada",
            48,
            "NVIDIA RTX 6000 Ada Generation (48 GB GDDR6 with ECC; "
            "https://cputronic.com/de/gpu/nvidia-rtx-6000-ada-generation)",
        ),
        _gpu(
            "rtx-a6000",
            48,
            "NVIDIA RTX A6000 (48 GB GDDR6 with ECC; "
            "https://servethehome.com/nvidia-rtx-a6000-48gb-gpu-drops-quadro-designation)",
        ),
        # 180 GB per GPU in HGX/DGX B200 (DGX B200: 1,440 GB over 8 GPUs); some pages say 192 GB
        # (the stacks' raw size) and nvidia-smi on an HGX B200 shows 179 GB
        # (https://docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview);
        # 180 GB read as 10^9 bytes errs low.
        _gpu(
            "b200",
            180,
            "NVIDIA DGX/HGX B200 (180 GB HBM3e per GPU; "
            "https://www.server-parts.eu/post/nvidia-b200-gb200-blackwell-gpu-server-comparison)",
        ),
        # The GH200 came with 96 GB of HBM3 and later 144 GB of HBM3e (its CPU's LPDDR5X is not
        # the GPU's); both may carry the same CUDA name, so the table holds the smaller figure.
        _gpu(
            "gh200",
            96,
            "NVIDIA GH200 Grace Hopper (96 GB HBM3; the HBM3e version has 144 GB: "
            "https://spheron.network/blog/nvidia-gh200-guide)",
        ),
    )
}
# The TPU slice table, its one home (the launcher, wide_tf/launch, reads it). Slice families (the
# prefix of an accelerator type such as v5litepod-8) -> the device of one replica.
SLICE_FAMILIES = {
    "v2": "v2",
    "v3": "v3",
    "v4": "v4",
    "v5litepod": "v5e",
    "v5p": "v5p",
    "v6e": "v6e",
}
# The sizes Google offers per family (cloud.google.com/tpu/docs/v2, /v3, /v4, /v5e, /v5p, /v6e:
# their configuration tables; v5p lists more shapes, the larger ones pods that are experimental
# here). v2-v4 and v5p count TensorCores (2 a chip), v5e and v6e count chips.
SLICE_SIZES = {
    "v2": (8, 32, 128, 256, 512),
    "v3": (8, 32, 64, 128, 256, 512, 1024, 2048),
    "v4": (8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 4096),
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
    "v5p": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288),
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
}
# The slices docs/tpu.md's table covers ("Which config runs where"): each config's :check variant
# must fit every one (tests/test_launch.py runs it at each of their replica counts).
DOCUMENTED_SLICES = (
    "v2-8 v3-8 v4-8 v4-16 v4-32 v5litepod-1 v5litepod-4 v5litepod-8 v5litepod-16 v5p-8 "
    "v6e-1 v6e-4 v6e-8"
).split()


@dataclasses.dataclass(frozen=True)
class Slice:
    """One TPU slice: its family and size, the replicas TPUStrategy (or JAX) makes of it, its
    hosts (VMs)."""

    family: str
    size: int

    @property
    def name(self) -> str:
        return f"{self.family}-{self.size}"

    @property
    def replicas(self) -> int:
        # One replica per TPU device: v2/v3 show each TensorCore as a device (v3-8: 8); v4 and v5p
        # chips are megacores, one device per chip of two TensorCores (v4-8: 4); v5e and v6e have
        # one TensorCore per chip (v5litepod-8: 8). cloud.google.com/tpu/docs/
        # system-architecture-tpu-vm and the per-generation pages (docs/tpu.md).
        return self.size // 2 if self.family in ("v4", "v5p") else self.size

    @property
    def hosts(self) -> int:
        # 8 TensorCores (v2-v4, v5p) or 8 chips (v5e, v6e) a host.
        return (self.size + 7) // 8


def parse_slice(accelerator: str) -> Slice:
    """`accelerator` (e.g. 'v4-8') as a Slice; ValueError naming what Google offers otherwise."""
    family, _, size = accelerator.rpartition("-")
    if family not in SLICE_SIZES or not size.isdigit():
        raise ValueError(
            f"expected TYPE-SIZE with TYPE one of {', '.join(SLICE_SIZES)} (e.g. v4-8)"
        )
    if int(size) not in SLICE_SIZES[family]:
        offered = ", ".join(f"{family}-{n}" for n in SLICE_SIZES[family])
        raise ValueError(
            f"no such slice; {family} comes as {offered} (v2-v4 and v5p count TensorCores, 2 per "
            "chip; v5e and v6e count chips); docs/tpu.md lists the ones checked here"
        )
    return Slice(family, int(size))


def device(name: str) -> Device:
    """The device `name` (a key of DEVICES, or a slice family such as 'v5litepod')."""
    key = SLICE_FAMILIES.get(name, name)
    if key not in DEVICES:
        raise ValueError(
            f"unknown accelerator {name!r}; choose one of {', '.join(DEVICES)} "
            f"(or a slice family: {', '.join(SLICE_FAMILIES)})"
        )
    return DEVICES[key]


# The names CUDA gives these GPUs (TensorFlow's get_device_details(...)["device_name"], e.g.
# "NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-16GB", "NVIDIA H100 80GB HBM3", "NVIDIA RTX 6000 Ada
# Generation"), as words ('-' splits words), each entry's words all present; matched in this order.
_GPU_NAMES = (
    (("A100", "80GB"), "a100-80gb"),
    (("A100",), "a100-40gb"),
    (("H100",), "h100-80gb"),
    (("H200",), "h200"),  # a word: "GH200" is not "H200"
    (("GH200",), "gh200"),
    (("B200",), "b200"),
    (("V100", "32GB"), "v100-32gb"),
    (("V100",), "v100-16gb"),
    (("T4",), "t4"),
    (("L4",), "l4"),
    (("L40S",), "l40s"),
    (("L40",), "l40"),
    (("A10G",), "a10g"),
    (("A10",), "a10"),
    (("A40",), "a40"),
    (("RTX", "6000", "ADA"), "rtx-6000-ada"),  # not the Turing "Quadro RTX 6000" (24 GB)
    (("A6000",), "rtx-a6000"),
)


def gpu_from_name(device_name: str) -> Device | None:
    """The DEVICES entry of a GPU named as CUDA names it; None for one not in the table, and for
    a MIG instance (the word MIG: a slice of the GPU has a fraction of its memory; mig_device). So
    a GPU run can get a default train.max_device_batch (hardware_fit.check with this device)."""
    words = device_name.upper().replace("-", " ").split()
    if "MIG" in words:
        return None
    for required, key in _GPU_NAMES:
        if all(w in words for w in required):
            return DEVICES[key]
    return None


def mig_device(device_name: str) -> Device | None:
    """A MIG instance's memory from its profile in the name ('... MIG 3g.20gb': 20 GB), None when
    the name holds no profile. (How CUDA names a MIG instance was not checked on one here.)"""
    for word in device_name.lower().split():
        head, _, size = word.partition(".")
        if head[:-1].isdigit() and head.endswith("g") and size.endswith("gb"):
            if size[:-2].isdigit():
                return _gpu(f"mig {word}", int(size[:-2]), f"the MIG profile in {device_name!r}")
    return None


def gpu_from_memory(device_name: str, total_bytes: int, source: str) -> Device:
    """A GPU outside the table, from the total memory its driver reports (schema/hardware.py)."""
    return Device(device_name, "gpu", int(total_bytes), f"{total_bytes / GIB:.1f} GiB", source)


def _wrn_elements(depth: int, width: float, num_classes: int, input_shape, norm: str) -> int:
    spec = architectures.WRN_SPEC
    n = spec.blocks_per_group(depth)
    h, w = input_shape[0], input_shape[1]
    bn = 0 if norm == "none" else 1
    total = h * w * spec.stem_channels  # stem conv
    prev = spec.stem_channels
    for c, stride in zip(spec.channels(width), spec.group_strides):
        for b in range(n):
            s = stride if b == 0 else 1
            total += (bn + 1) * h * w * prev  # pre-activation norm and ReLU, at the input's size
            h, w = math.ceil(h / s), math.ceil(w / s)
            out = h * w * c
            # conv1, the middle norm, its ReLU, conv2, the 1x1 shortcut where the shape changes,
            # the Add
            total += out * (4 + bn + (1 if (prev != c or s != 1) else 0))
            prev = c
    total += (bn + 1) * h * w * prev  # final norm and ReLU
    return total + prev + 2 * num_classes  # pooling, logits, float32 logits


def _mlp_elements(depth: int, width, num_classes: int, input_shape, norm: str) -> int:
    per_layer = 2 if norm == "none" else 3  # Dense, [norm], ReLU
    return math.prod(input_shape) + depth * per_layer * int(width or 0) + 2 * num_classes


def activation_elements(
    arch: str, depth: int, width, num_classes: int, input_shape: Sequence[int], norm: str
) -> int:
    """Elements of every layer's output for one example (the Input layer not counted)."""
    architectures.check_norm(norm)
    if arch == "wrn":
        return _wrn_elements(depth, width, num_classes, tuple(input_shape), norm)
    if arch == "mlp":
        return _mlp_elements(depth, width, num_classes, tuple(input_shape), norm)
    raise ValueError(f"no memory model for arch {arch!r}; add one to wide_tf/schema/memory.py")


def policy_for(platform: str, requested: str = "auto") -> str:
    """The dtype policy a run gets (engine/tf/strategy.py: auto is bfloat16 on TPU, else
    float32)."""
    if requested in ("auto", None, ""):
        return "mixed_bfloat16" if platform == "tpu" else "float32"
    return requested


def step_bytes(elements: int, params: int, micro_batch: int, policy: str) -> int:
    """Bytes one replica holds for a training step on `micro_batch` examples."""
    return micro_batch * elements * POLICY_BYTES[policy] + params * STATE_BYTES_PER_PARAM


def micro_batches(per_replica: int, cap: int) -> int:
    """How many equal micro-batches a replica's batch is split into under
    train.max_device_batch=cap (0: no cap): the one rule, schema/rules.py's, that the config checks
    and engine/tf/step.py's BatchPlan use too."""
    return rules.micro_batches(per_replica, cap)


def largest_batch(elements: int, params: int, dev: Device, policy: str, multiple: int = 1) -> int:
    """The largest per-replica micro-batch, a multiple of `multiple`, whose step fits `dev`
    (0: not even one)."""
    room = dev.usable - params * STATE_BYTES_PER_PARAM
    if room <= 0:
        return 0
    n = room // (elements * POLICY_BYTES[policy])
    return int(n // multiple * multiple)


def cap_for(per_replica_batches, largest: int, multiple: int = 1) -> int:
    """The largest train.max_device_batch, at most `largest` (largest_batch's answer), under which
    every per-replica batch splits into equal micro-batches that are whole multiples of
    `multiple` (the ghost batch); 0 when none does. checks/hardware_fit.py's suggestion and the
    GPU default (engine/tf/strategy.py) both use it."""
    for cap in range(largest // multiple * multiple, 0, -multiple):
        if all((p // micro_batches(p, cap)) % multiple == 0 for p in per_replica_batches):
            return cap
    return 0
