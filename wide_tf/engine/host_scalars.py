"""Owns the numbers one host call of the training loop logs, from the sums its device loop
accumulated (TRAIN_SCALARS: the mean loss and accuracy, the norms, the examples per second, the
optimizer's diagnostics) and the two-batch noise-scale estimate they update; and the initial
model's numbers that a kept build's runs share (at_init). Shared by every backend."""

from __future__ import annotations

import math

# Scalars the training loop accumulates on the device between two host reads (both backends).
TRAIN_SCALARS = (
    "loss_sum",
    "correct",
    "examples",
    "grad_norm_sq",
    "small_grad_sq",
    "big_grad_sq",
    "update_norm_sq",
    "param_norm_sq",
    "steps",
)


def at_init(cache: dict, seed: int, step: int, what: str, compute) -> dict:
    """`compute()`, a dict of numbers of the model at `step`; at step 0 (the initial weights of
    this seed) computed once per seed and key of a kept build (`cache`: its at_init dict), and
    copied for the other runs of the build (a learning-rate grid measures them once)."""
    if step != 0:
        return compute()
    cache = cache.setdefault(seed, {})
    if what not in cache:
        cache[what] = compute()
    return dict(cache[what])


def from_sums(
    scalars: dict, dt: float, batch_plan, batch: int, noise, diagnostics=()
) -> tuple[dict, bool]:
    """(the logged numbers of one host call, whether `noise` was updated): `noise` (a
    TwoBatchNoiseScale) takes the call's squared norms when the batch is split (replicas x
    micro-batches > 1) and they are finite."""
    examples = max(scalars["examples"], 1.0)
    out = {
        "batch_loss": scalars["loss_sum"] / examples,
        "batch_accuracy": scalars["correct"] / examples,
        "grad_norm": math.sqrt(scalars["grad_norm_sq"]),
        "param_norm": math.sqrt(scalars["param_norm_sq"]),
        "update_norm": math.sqrt(scalars["update_norm_sq"]),
        "learning_rate": scalars["learning_rate"],  # of the next step
        "examples_per_s": scalars["examples"] / dt if dt > 0 else 0.0,
    }
    out.update({k: scalars[k] for k in diagnostics})  # the optimizer's own, e.g. LARS ratios
    bp = batch_plan
    updated = False
    if bp.num_replicas * bp.num_micro_batches > 1 and math.isfinite(scalars["big_grad_sq"]):
        # Averages over the loop's steps: G2 and S are linear in the two squared norms.
        done = max(scalars["steps"], 1.0)
        noise.update(
            scalars["small_grad_sq"] / done, scalars["big_grad_sq"] / done, bp.micro_batch, batch
        )
        updated = True
        if noise.value is not None:
            out["noise_scale_two_batch"] = float(noise.value)
    return out, updated
