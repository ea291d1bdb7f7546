"""Owns a run's targets: the primary (train.target_metric, train.target_value) and
train.extra_targets, each one's first crossing on the evaluation cadence (interpolated between the
evaluations around it), and result.json's "targets" entries."""

from __future__ import annotations

from wide_tf.schema import targets as targets_lib
from wide_tf.schema.rules import parse_target

_comparison = targets_lib.comparison


def extra_targets(config) -> list[tuple[str, float]]:
    """train.extra_targets as (metric, value) pairs, in the config's order."""
    return [
        parse_target(f"train.extra_targets[{i}]", spec)
        for i, spec in enumerate(config.train.extra_targets or [])
    ]


def interpolated_crossing(prev: dict | None, now: dict, metric: str, target: float) -> float:
    """The step at which `metric` crossed `target`, interpolated linearly between the evaluation
    before (`prev`, where it had not) and `now` (where it first had). Without this, steps-to-target
    is rounded up to the evaluation cadence, which at large batches is a large fraction of S."""
    if prev is None or prev.get(metric) is None or now["step"] <= prev["step"]:
        return float(now["step"])
    v0, v1 = float(prev[metric]), float(now[metric])
    frac = (target - v0) / (v1 - v0) if v1 != v0 else 1.0
    frac = min(max(frac, 0.0), 1.0)
    return float(prev["step"] + frac * (now["step"] - prev["step"]))


def _target_met(metric: str, value: float, evaluation: dict) -> bool:
    return targets_lib.met(metric, value, evaluation[metric])


class Targets:
    """The targets of one run and their per-target state, which lives in the RunState (so that
    checkpoints carry it): steps_to_target(_interp) for the primary, extra_crossings (None, or
    [step, interpolated step]) for the extra ones. `log(message, *args)` writes a log line."""

    def __init__(self, config, batch: int, num_train: int, log):
        t = config.train
        self.primary = (t.target_metric, t.target_value)
        self.extra = extra_targets(config)
        self.batch, self.num_train, self.log = batch, num_train, log

    def adopt(self, state) -> None:
        """One crossing slot per extra target (a checkpoint may hold fewer, or more)."""
        n_extra = len(self.extra)
        crossings = list(state.extra_crossings)[:n_extra]
        state.extra_crossings = crossings + [None] * (n_extra - len(crossings))

    def unreached(self, state) -> list[tuple[str, float]]:
        """The (metric, value) of every target not met yet, the primary first."""
        st = state
        out = [] if st.steps_to_target is not None else [self.primary]
        return out + [t for t, c in zip(self.extra, st.extra_crossings) if c is None]

    def any_met(self, state, ev: dict) -> bool:
        """Whether the evaluation `ev` meets a target not met before it."""
        return any(_target_met(m, v, ev) for m, v in self.unreached(state) if m in ev)

    def check(self, state, ev: dict, prev: dict | None) -> None:
        """Records the first crossing of the primary target and of every extra target at the
        evaluation `ev`, each interpolated with `prev`, the evaluation step before it."""
        st = state
        metric, value = self.primary
        if st.steps_to_target is None and _target_met(metric, value, ev):
            st.steps_to_target, st.status = st.step, "reached"
            st.steps_to_target_interp = interpolated_crossing(prev, ev, metric, value)
            self._log_reached(st.step, metric, value)
        for i, (metric, value) in enumerate(self.extra):
            if st.extra_crossings[i] is None and _target_met(metric, value, ev):
                st.extra_crossings[i] = [st.step, interpolated_crossing(prev, ev, metric, value)]
                self._log_reached(st.step, metric, value)

    def _log_reached(self, step: int, metric: str, value: float) -> None:
        if step > 0:
            self.log(
                "target %s %s %s reached at step %d (%.3g epochs)",
                metric,
                _comparison(metric),
                value,
                step,
                step / (self.num_train / self.batch),
            )

    @staticmethod
    def all_reached(state) -> bool:
        st = state
        return st.steps_to_target is not None and all(c is not None for c in st.extra_crossings)

    def records(self, state) -> list[dict]:
        """result.json's "targets": the primary target, then train.extra_targets in order."""
        st = state
        primary = (
            None if st.steps_to_target is None else (st.steps_to_target, st.steps_to_target_interp)
        )
        return [self._record(st, *self.primary, primary)] + [
            self._record(st, m, v, c) for (m, v), c in zip(self.extra, st.extra_crossings)
        ]

    def _record(self, st, metric: str, value: float, crossing) -> dict:
        if crossing is None:
            status = "diverged" if st.diverged_at is not None else "not_reached"
            step = interp = None
        else:
            status, (step, interp) = "reached", crossing
            step, interp = int(step), float(step if interp is None else interp)
        return {
            "metric": metric,
            "value": float(value),
            "status": status,
            "steps_to_target": step,
            "steps_to_target_interp": interp,
            "epochs_to_target": None if step is None else step * self.batch / self.num_train,
        }
