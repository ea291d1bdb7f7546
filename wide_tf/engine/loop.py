"""Owns the loop of one training run, the Orbit Controller way: restore, train until the next
evaluation, evaluate, measure, save, stop, then write the result. The loop owns the checkpoints
(their manager, cadence, SIGTERM) and the summaries (TensorBoard scalars, metrics.jsonl, the log
lines of progress); the trainer (engine.train.Run) owns the step, the evaluations and the state."""

from __future__ import annotations

import time

import tensorflow as tf

from wide_tf.engine import preemption, timing
from wide_tf.engine import result as result_lib
from wide_tf.engine.state import RunState
from wide_tf.store import workdir as wd

# With train.checkpoint_every_steps=0 (ten checkpoints per run), at least this long between two.
DEFAULT_CHECKPOINT_MIN_S = 10.0

EVAL_SCALARS = ("train_accuracy", "train_loss", "test_accuracy", "test_loss")


class Controller:
    """Drives a trainer `run` (engine.train.Run) through one run, from its checkpoint if any.

    Multi-worker: every worker restores from, and saves with, the chief's checkpoints (a save may
    run collectives), but only the chief writes into the workdir; the others save into a scratch
    folder that they delete, and write no summaries, metrics or result."""

    def __init__(self, run):
        self.run_, self.metrics = run, run.metrics
        strategy, workdir = run.runtime.strategy, run.workdir
        self.scratch = (
            None if run.chief else wd.join(workdir, f".worker{strategy.cluster_resolver.task_id}")
        )
        self.checkpoint_dir = wd.join(workdir, wd.CHECKPOINTS)
        run.built.host_var.assign("")
        self.manager = tf.train.CheckpointManager(
            run.built.checkpoint,
            self.checkpoint_dir if run.chief else wd.join(self.scratch, wd.CHECKPOINTS),
            max_to_keep=2,
        )
        self._clock = time.time()

    # ---- checkpoints -----------------------------------------------------------------------------

    def restore(self) -> None:
        """Continues from the chief's last checkpoint, if any."""
        run, state = self.run_, None
        latest = tf.train.latest_checkpoint(self.checkpoint_dir)
        if latest:
            run.built.checkpoint.restore(latest).assert_existing_objects_matched()
            # A diverged run's optimizer may have run past the step it diverged at (see
            # Stepper): the state's step is the one that counts.
            state = RunState.from_json(
                run.built.host_var.numpy().decode(), int(run.optimizer.iterations.numpy())
            )
            self.metrics.log("resumed from %s at step %d", latest, state.step)
        run.restore(state)

    def save(self, checkpoint: bool = True) -> None:
        """A checkpoint (model, optimizer, state) and metrics.jsonl; at the end of a run the
        metrics alone (`checkpoint=False`): a finished run is never resumed (its result.json
        says it is done), and a run killed before that file is written resumes from its last
        checkpoint and repeats the same steps."""
        st = self.run_.state
        with timing.timed("checkpoint", st.time_s) as timed:
            now = time.time()
            st.wall_time_s += now - self._clock
            self._clock = now
            self.run_.built.host_var.assign(st.to_json())
            if checkpoint:
                self.manager.save(checkpoint_number=st.step)
            self.metrics.history(st.history)
            self.metrics.flush()  # the events up to this checkpoint, with it
            timed["count"] = st.step

    # ---- the loop --------------------------------------------------------------------------------

    def run(self) -> dict:
        run = self.run_
        self.restore()
        st = run.state
        self.log_start()
        self._clock = time.time()
        if st.step == 0 and not st.history:
            self.evaluate()
            if run.probe is not None:
                self.measure()
        self.train_to_the_end()
        run.train_iter = None  # the data stream's threads end here, not in a later collection
        run.finish()
        final = run.economy.finish()  # the final numbers; the targets count on the cadence only
        if final is not None:
            self.write_eval(final)
        self.save(checkpoint=False)
        self.write_time()
        self.metrics.close()
        return self.write_result()

    def train_to_the_end(self) -> None:
        """Host loops until the budget, a divergence or every target; evaluations, probe
        measurements and checkpoints on their cadences; SIGTERM: a checkpoint, then Preempted."""
        run, t = self.run_, self.run_.config.train
        st = run.state
        ckpt_every = t.checkpoint_every_steps or max(1, run.total_steps // 10)
        # The default cadence (ten per run) also waits DEFAULT_CHECKPOINT_MIN_S between saves: a
        # run of a few seconds needs no checkpoint every 0.1 s (each cost ~25 ms here). Resume is
        # exact from any checkpoint, so this only changes how much work a kill can lose.
        ckpt_min_s = 0.0 if t.checkpoint_every_steps else DEFAULT_CHECKPOINT_MIN_S
        last_ckpt, last_ckpt_time = st.step, time.time()
        while run.running():
            examples_before = st.step * run.batch
            scalars = run.train_until(min(s for s in run.eval_steps if s > st.step))
            self.metrics.scalars("train", st.step, scalars)
            if st.diverged_at is not None:
                break
            if run.probe is not None and run.probe.due(examples_before, st.step * run.batch):
                self.measure()
            if st.step in run.eval_steps:
                ev = self.evaluate(scalars)
                if ev is not None:  # None: a pass that could not be a crossing, cut short
                    self.log_progress(scalars, ev)
            if st.step - last_ckpt >= ckpt_every and time.time() - last_ckpt_time >= ckpt_min_s:
                self.save()
                last_ckpt, last_ckpt_time = st.step, time.time()
            if preemption.requested():  # SIGTERM: checkpoint now and stop (engine/preemption.py)
                if last_ckpt != st.step:
                    self.save()
                raise preemption.Preempted(run.name, st.step)

    def evaluate(self, train_scalars: dict | None = None) -> dict | None:
        """The evaluation of an evaluation step (engine/evaluation.py), its targets checked."""
        ev = self.run_.economy.evaluate(train_scalars)
        if ev is not None:
            self.write_eval(ev)
        return ev

    def write_eval(self, ev: dict) -> None:
        self.metrics.scalars("eval", ev["step"], {k: ev[k] for k in EVAL_SCALARS if k in ev})

    def write_time(self) -> None:
        """The run's seconds by kind (engine/timing.py), as TensorBoard scalars at its last step."""
        st = self.run_.state
        account = timing.settle(st.time_s, st.wall_time_s)
        self.metrics.scalars("train", st.step, {f"time/{k}_s": v for k, v in account.items()})

    def measure(self) -> None:
        run = self.run_
        g = run.measure()
        self.metrics.scalars(
            "eval",
            g["step"],
            {
                "gradient/diversity": g["diversity"],
                "gradient/batch_bound": g["batch_bound"],
                "gradient/noise_scale_exact": g["noise_scale"],
            },
        )
        self.metrics.log(
            "step %d: gradient diversity %.4g, batch bound %.4g (probe of %d examples)",
            g["step"],
            g["diversity"],
            g["batch_bound"],
            run.probe.n,
        )

    # ---- summaries and the result ----------------------------------------------------------------

    def log_start(self) -> None:
        run = self.run_
        plan = run.plan
        self.metrics.log(
            "%s, %d params, batch %d (%d replica(s) x %d micro-batch(es) of %d), "
            "peak lr %.4g, %d steps (%.3g epochs) budget, eval every %d examples",
            run.model.name,
            run.params,
            run.batch,
            plan.num_replicas,
            plan.num_micro_batches,
            plan.micro_batch,
            run.peak_lr,
            run.total_steps,
            run.total_steps / run.steps_per_epoch,
            run.eval_every,
        )

    def log_progress(self, scalars: dict, ev: dict) -> None:
        run = self.run_
        st = run.state
        self.metrics.log(
            "step %d/%d  epoch %.2f  loss %.4f  acc %.4f | train acc %.4f  test acc %s | "
            "lr %.4g  %.0f ex/s",
            st.step,
            run.total_steps,
            st.step / run.steps_per_epoch,
            scalars["batch_loss"],
            scalars["batch_accuracy"],
            ev["train_accuracy"],
            f"{ev['test_accuracy']:.4f}" if "test_accuracy" in ev else "-",
            scalars["learning_rate"],
            scalars["examples_per_s"],
        )

    def write_result(self) -> dict:
        """result.json (written by the chief; the other workers delete their scratch folder)."""
        run = self.run_
        result = result_lib.build(run)
        if run.chief:
            wd.write_json(wd.join(run.workdir, wd.RESULT), result)
        elif tf.io.gfile.exists(self.scratch):
            tf.io.gfile.rmtree(self.scratch)
        self.metrics.log(
            "%s: steps to target %s, epochs to target %s, final train acc %s, test acc %s",
            run.state.status,
            result["steps_to_target"],
            None if result["epochs_to_target"] is None else round(result["epochs_to_target"], 3),
            *(
                None if v is None else round(v, 4)
                for v in (result["final"]["train_accuracy"], result["final"]["test_accuracy"])
            ),
        )
        return result
