"""`python tests/tf_import_spy.py MAIN_FLAGS...`: runs `python -m wide_tf.main MAIN_FLAGS...` and,
the first time this process imports TensorFlow, writes to $WIDE_TF_TF_SPY (JSON) what the process
stood at then: its resident memory, its CPU seconds, the result files recorded in --workdir, and the
functions on the stack. Nothing is written when TensorFlow is never imported. The workers of
--workers=N are plain `wide_tf.study.worker` processes: only the parent is watched. Used by
tests/study/test_workers.py (the parent supervises without TensorFlow)."""

import json
import os
import resource
import runpy
import sys
import traceback


class _Spy:
    """A meta-path finder that finds nothing: it only notes the first import of tensorflow."""

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow":
            sys.meta_path.remove(self)
            _note()
        return None


def _note() -> None:
    flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    results = os.path.join(flags.get("workdir", ""), "results")
    with open("/proc/self/status") as f:
        rss_kb = next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    note = {
        "rss_mb": rss_kb / 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "results": sorted(os.listdir(results)) if os.path.isdir(results) else [],
        "stack": [f"{os.path.basename(fs.filename)}:{fs.name}" for fs in traceback.extract_stack()],
    }
    with open(os.environ["WIDE_TF_TF_SPY"], "w") as f:
        json.dump(note, f)


if __name__ == "__main__":
    sys.meta_path.insert(0, _Spy())
    sys.argv[0] = "wide_tf.main"
    runpy.run_module("wide_tf.main", run_name="__main__", alter_sys=True)
