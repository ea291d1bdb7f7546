"""Owns the default value of every config field, one function per sub-config (model, data, optim,
train, runtime, sweep), and the names a choice field accepts where the module that uses them imports
TensorFlow. Pure Python: config files and validate.py import it without importing TensorFlow.

Every config is built from `base_config`, so every field below exists in every config: code reads
`config.section.field` and never restates a default."""

from __future__ import annotations

import ml_collections

# optim.name: the keys of optim.OPTIMIZERS (checked there at import), here for the modules that
# must not import TensorFlow (validate.py checks configs before TensorFlow starts).
OPTIMIZER_NAMES = ("sgd", "momentum", "nesterov", "lars", "adam", "adamw", "lamb")
SCHEDULE_NAMES = ("constant", "cosine", "multistep", "polynomial")  # optim.schedule
SCALING_RULES = ("none", "linear", "sqrt")  # optim.scaling
TRUST_RATIO_FORMS = ("you", "decayed_grad")  # optim.lars_trust_ratio
TARGET_BN_MODES = ("moving", "recompute")  # train.target_bn


def model_config(
    arch: str = "mlp", depth: int = 2, width: float = 256.0
) -> ml_collections.ConfigDict:
    # A float: units for an MLP (a whole number), the multiplier k for a WRN (fractional allowed).
    return ml_collections.ConfigDict(
        dict(
            arch=arch,
            depth=depth,
            width=width,
            norm="none",  # 'none' | 'batch' | 'ghost'
            # The virtual batch of ghost batch norm: its statistics do not depend on the batch.
            ghost_batch_size=32,
        )
    )


def data_config(name: str = "mnist_embedded") -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            name=name,
            data_dir=ml_collections.FieldReference(None, field_type=str),
            download=False,  # never touch the network unless asked
            augment=False,
            # Fixed: a buffer that grew with the batch would change the data order.
            shuffle_buffer=10_000,
            num_train=0,  # 0: the whole training split
        )
    )


def optim_config(name: str = "sgd", base_lr: float = 0.1) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            name=name,
            base_lr=base_lr,
            reference_batch=256,
            scaling="sqrt",  # base_lr is the lr at reference_batch
            lr_multiplier=1.0,  # the study's learning-rate grid multiplies the rule's guess
            momentum=0.9,
            # momentum/nesterov/lars: momentum rises linearly from 0 to optim.momentum over this
            # many steps (0: off), to check that steps-to-target is not momentum's build-up.
            momentum_warmup_steps=0,
            weight_decay=0.0,
            lars_eta=0.001,
            lars_trust_ratio="you",
            lars_epsilon=0.0,
            lars_clip=False,
            schedule="constant",
            warmup_epochs=0.0,
            warmup_steps=0,
            warmup_fixed="epochs",
            decay_epochs=[],
            decay_factor=0.1,
            poly_power=2.0,
            end_lr_fraction=0.0,
        )
    )


def train_config(global_batch: int = 128) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            global_batch=global_batch,
            max_device_batch=0,  # >0: accumulate micro-batches of at most this many per replica
            max_epochs=50.0,
            max_steps=0,
            # A floor of the budget in steps: large batches are not censored by max_epochs alone.
            min_steps=0,
            steps_per_loop=100,  # optimizer steps per tf.function call
            eval_every_examples=0,  # 0: once per epoch; the same points of training for every batch
            eval_batch=1024,
            eval_train_limit=0,  # 0: training accuracy over the whole training set
            target_metric="train_accuracy",
            target_value=0.99,
            # Stop once the primary target and every extra target is met (or at the budget).
            stop_at_target=True,
            # More targets judged on the same evaluations, each "metric:value" with a metric of
            # target_metric's choices, e.g. ["train_loss:0.1", "test_accuracy:0.9"].
            extra_targets=[],
            # The batch-norm statistics of the evaluations (every one, so also those that judge
            # the targets): 'moving' (the training run's moving averages, which lag the weights
            # by ~1/(1 - 0.9) steps) or 'recompute' (recomputed before each evaluation from the
            # first target_bn_examples training examples in batches of target_bn_batch; the
            # training run's moving averages are put back after it).
            target_bn="moving",
            target_bn_examples=1024,
            target_bn_batch=256,
            seed=0,
            checkpoint_every_steps=0,  # 0: ten checkpoints per run
            diverge_loss=1e3,  # a loss above this (or non-finite) ends the run as 'diverged'
            gradient_every_examples=0,
            gradient_at_init=False,
            # Examples of the gradient probe; 0: the whole training set (the batch bound
            # n x diversity saturates near the probe size n, so a small probe caps it).
            probe_size=0,
            probe_chunk=256,
            noise_scale_ema=0.95,
        )
    )


def runtime_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            strategy="auto",  # auto | tpu | gpu | cpu | multi_worker
            tpu="",  # TPU name or 'local'; empty: auto-detect a TPU VM
            # cpu strategy only: e.g. ['/cpu:0', '/cpu:1'] to rehearse multi-replica runs.
            devices=[],
            jit_compile="auto",  # auto: XLA on TPU and GPU, off on CPU
            mixed_precision="auto",  # auto: bfloat16 on TPU, float32 elsewhere
        )
    )


def sweep_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        dict(
            family=dict(
                # 'budget' (depths at a fixed budget), 'width' (fixed depth), 'depth' (fixed width)
                kind="budget",
                budget=0.0,
                depths=[],
                widths=[],
                depth=0,
                width=0.0,
                tolerance=0.05,
            ),
            batch_sizes=[],
            lr_multipliers=[1.0],  # log grid around the scaling rule's guess, per batch size
            extend_lr_grid=True,  # add one grid point past an edge that won
            max_lr_extensions=2,
            seeds=[0],  # tuning seeds: every learning rate of the grid runs on each
            confirm_seeds=[],  # the chosen learning rate of each cell is re-run on these seeds
            # B_x(1+eps), the model-free critical batch: epochs-to-target (1 + eps)-fold over the
            # two smallest batches' (1.0: doubled, McCandlish's B_crit; Zhang et al. use 0.2).
            eps=1.0,
        )
    )


def base_config(arch: str = "mlp", data: str = "mnist_embedded") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.kind = "study"
    config.model = model_config(arch)
    config.data = data_config(data)
    config.optim = optim_config()
    config.train = train_config()
    config.runtime = runtime_config()
    config.sweep = sweep_config()
    return config
