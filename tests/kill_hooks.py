"""`python tests/kill_hooks.py MAIN_FLAGS...`: runs `python -m wide_tf.main MAIN_FLAGS...` with a
SIGKILL planted at one point of the study, chosen by WIDE_TF_KILL_AT=POINT:N (the N-th time this
process reaches POINT). Used by tests/study/test_interruptions.py; the points are

  trial       inside a trial, on the N-th call of the compiled training loop
  checkpoint  inside a checkpoint save: the files are written, the 'checkpoint' state is not
  record      inside the recording of a result: half of the new file under a temporary name
  between     between trials: at the start of the N-th trial
  report      inside the report: at the N-th plot saved
"""

import os
import signal
import sys


def _kill():
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _countdown(n):
    calls = [0]

    def due():
        calls[0] += 1
        return calls[0] == n

    return due


def _install(point: str, n: int) -> None:
    due = _countdown(n)
    if point == "trial":
        from wide_tf.engine.tf import span
        from wide_tf.engine.tf import step as steps

        # Either call trains: a run that spans (engine/tf/span.py) trains with span.run alone.
        for owner, name in ((steps.Stepper, "train"), (span, "run")):
            original = getattr(owner, name)

            def call(*args, _original=original, **kwargs):
                if due():
                    _kill()
                return _original(*args, **kwargs)

            setattr(owner, name, call)
    elif point == "checkpoint":
        from tensorflow.python.checkpoint import checkpoint_management as cm

        original = cm.update_checkpoint_state_internal

        def update(*args, **kwargs):
            if due():
                _kill()
            return original(*args, **kwargs)

        cm.update_checkpoint_state_internal = update
    elif point == "record":
        from wide_tf.store import workdir as wd

        original = wd.write_text_atomic

        def write(path, text):
            recording = os.path.basename(os.path.dirname(path)) == "results"
            if recording and due():
                with open(f"{path}.tmp-killed", "w") as f:  # a torn temporary file, never renamed
                    f.write(text[: len(text) // 2])
                _kill()
            return original(path, text)

        wd.write_text_atomic = write
    elif point == "between":
        from wide_tf.engine import train as train_lib

        original = train_lib.train_and_evaluate

        def train_and_evaluate(*args, **kwargs):
            if due():
                _kill()
            return original(*args, **kwargs)

        train_lib.train_and_evaluate = train_and_evaluate
    elif point == "report":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.figure

        original = matplotlib.figure.Figure.savefig

        def savefig(self, *args, **kwargs):
            if due():
                _kill()
            return original(self, *args, **kwargs)

        matplotlib.figure.Figure.savefig = savefig
    else:
        raise SystemExit(f"unknown kill point {point!r}")


if __name__ == "__main__":
    spec = os.environ.get("WIDE_TF_KILL_AT")
    if spec:
        point, _, n = spec.partition(":")
        _install(point, int(n or 1))
    from wide_tf import main

    sys.argv = ["wide_tf.main", *sys.argv[1:]]
    main.run()
