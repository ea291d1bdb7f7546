"""Owns the checks of what surrounds a valid config before TensorFlow starts: this machine's
hardware and data for the strategy and data set it names, the --shard and --workers flags, and the
workdir (a folder that can be written, of the same kind of run, with whole result and checkpoint
files), and the one "same study" check of its config.json (`check_same_study`, which the study
runs once where it writes that file). No file of the workdir is changed here."""

from __future__ import annotations

import glob
import json
import os
import re
import tempfile

from wide_tf.checks.overrides import is_sweep
from wide_tf.schema import datasets, families, hardware, identity
from wide_tf.schema.problems import RuntimeProblem, UsageError
from wide_tf.store import checkpoint_state
from wide_tf.store import workdir as wd


def check_data_present(config, tfds_name) -> None:
    """A TFDS set that is not prepared, or an idx set's missing files, found without importing
    TensorFlow (local folders only)."""
    d = config.data
    spec = datasets.get(d.name)
    if spec.loader == "idx":
        folder = datasets.idx_folder(spec, d.data_dir)
        if "://" not in folder:
            try:
                datasets.idx_paths(spec, d.data_dir, "train")
                datasets.idx_paths(spec, d.data_dir, "test")
            except FileNotFoundError as e:
                raise RuntimeProblem(str(e)) from None
        return
    if tfds_name is None or d.download:
        return
    data_dir = (
        d.data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
    )
    if "://" in data_dir:
        return
    if glob.glob(os.path.join(data_dir, tfds_name, "*", "dataset_info.json")):
        return
    raise RuntimeProblem(
        f"TFDS data set {d.name!r} is not prepared in data_dir={data_dir}; point "
        f"--config.data.data_dir at a prepared copy, prepare it on a machine with network "
        f'(python -c "import '
        f"tensorflow_datasets as tfds; tfds.builder({tfds_name!r}, data_dir={data_dir!r})"
        f'.download_and_prepare()", or --config.data.download=True), or use the offline '
        f"--config.data.name=mnist_embedded (or digits_embedded)"
    )


def check_hardware(config) -> None:
    """Hardware that a strategy asks for and that is plainly absent (no TensorFlow needed to see
    it)."""
    rt = config.runtime
    name = rt.strategy
    if name == "tpu" and not hardware.tpu_reachable(rt.tpu):
        raise RuntimeProblem(
            "runtime.strategy=tpu but this machine is not a TPU VM (no /dev/accel0 or /dev/vfio/0) "
            "and no TPU is named; run on a TPU VM, name one with --config.runtime.tpu=NAME, or use "
            "--config.runtime.strategy=auto"
        )
    if name == "gpu" and not hardware.gpu_visible():
        raise RuntimeProblem(
            "runtime.strategy=gpu but this machine shows no GPU (no /dev/nvidia*, or "
            "CUDA_VISIBLE_DEVICES hides them); run on a GPU machine with the [gpu] extra, or use "
            "--config.runtime.strategy=cpu (or auto)"
        )
    if name == "multi_worker":
        tf_config = os.environ.get("TF_CONFIG")
        if not tf_config:
            raise RuntimeProblem(
                "runtime.strategy=multi_worker needs TF_CONFIG (cluster and task) in the "
                "environment; set it on every worker, or use --config.runtime.strategy=auto"
            )
        try:
            json.loads(tf_config)
        except json.JSONDecodeError as e:
            raise RuntimeProblem(
                f"TF_CONFIG is not valid JSON ({e}); fix the environment variable"
            ) from None


# engine/jax/run.DISTRIBUTED_ENV: this JAX process is one of several (launch_tpu.sh --backend=jax
# sets it on every worker of a multi-host slice). Read here without importing JAX.
JAX_DISTRIBUTED_ENV = "WIDE_TF_JAX_DISTRIBUTED"


def check_processes(config, environ=os.environ) -> None:
    """JAX on several processes runs one program on every host (SPMD): one run spans the slice.
    A study cannot: each process claims its own next group from the workdir (study/scheduler.py,
    store/claims.py), so the hosts would start different runs whose collectives never meet (a
    hang, billed). Refused until the scheduler lets process 0 choose for all of them."""
    if environ.get(JAX_DISTRIBUTED_ENV, "") != "1":
        return
    if str(config.get("runtime", {}).get("backend", "tensorflow")) != "jax":
        raise UsageError(
            f"{JAX_DISTRIBUTED_ENV}=1 is for runtime.backend=jax (one JAX program over several "
            f"hosts); add --config.runtime.backend=jax or unset {JAX_DISTRIBUTED_ENV}"
        )
    if is_sweep(config):
        raise UsageError(
            "a study (a sweep) cannot run as one JAX program over several hosts yet: each host "
            "would claim a different group and the hosts' collectives would never meet; run the "
            "study on single hosts (launch_tpu.sh --accelerator=v4-8 --shards=N, one claim pool), "
            "or one run (a :single variant) on the multi-host slice"
        )


def check_shard(text) -> None:
    if not text:
        return
    try:
        i, n = (int(v) for v in str(text).split("/"))
    except ValueError:
        raise UsageError(
            f"--shard={text!r} is not of the form i/n; e.g. --shard=0/2 and --shard=1/2"
        ) from None
    if not 0 <= i < n:
        raise UsageError(f"--shard={text!r}: need 0 <= i < n, e.g. --shard=0/{max(n, 2)}")


def parse_workers(text) -> int | None:
    """--workers as a count, or None when it was left out (the machine's default)."""
    if text is None or str(text).strip() == "":
        return None
    fix = "give a whole number of processes, e.g. --workers=2, or leave it out for one per core"
    try:
        n = int(str(text).strip())
    except ValueError:
        raise UsageError(f"--workers={text!r} is not a whole number; {fix}") from None
    if n < 1:
        raise UsageError(f"--workers={n} is less than 1; {fix}")
    return n


def check_workers(text, config=None, trial=None) -> None:
    """--workers=N with N > 1 needs a study, one trial at a time per process, and a strategy that
    one process per core or GPU can use (their claims are files of this machine: any workdir)."""
    n = parse_workers(text)
    if n is None or n == 1:
        return
    if trial is not None:
        raise UsageError(f"--trial runs one trial in this process; drop --workers={n} or --trial")
    if config is not None and not is_sweep(config):
        raise UsageError(
            f"--workers={n} needs a study (a config with a sweep); a single run or the theory "
            "check runs in one process: drop --workers"
        )
    if config is not None and config.runtime.strategy in ("tpu", "multi_worker"):
        raise UsageError(
            f"--workers={n} with runtime.strategy={config.runtime.strategy}: one process drives "
            "those devices; drop --workers (or use --workers=1)"
        )


def check_trial(text, config) -> None:
    """--trial names a trial of the study (its index in --list_trials, or an id of the form
    <member>_b<batch>_lr<m>_s<seed>_<hash> with a member and batch of the study), without
    TensorFlow; the run itself matches the id exactly."""
    if text is None:
        return
    if not is_sweep(config):
        raise UsageError("--trial picks a trial of a study; this config has no sweep: drop --trial")
    s = config.sweep
    d = datasets.of(config.data)
    members = families.from_config(
        config.model.arch,
        s.family,
        num_classes=d.num_classes,
        input_shape=d.input_shape,
        norm=config.model.norm,
    )
    n = len(members) * len(s.batch_sizes) * len(s.lr_multipliers) * len(s.seeds)
    fix = "--list_trials shows them (give an index or an id)"
    text = str(text).strip()
    if text.isdigit():
        if int(text) >= n:
            raise UsageError(f"--trial={text}: the study has {n} trials (0 to {n - 1}); {fix}")
        return
    m = re.fullmatch(r"(?P<member>.+)_b(?P<batch>\d+)_lr[^_]+_s\d+_[0-9a-f]{8}", text)
    names = {x.name for x in members}
    if not m or m["member"] not in names or int(m["batch"]) not in set(s.batch_sizes):
        raise UsageError(f"--trial={text!r} matches no trial of this study; {fix}")


def check_workdir_scheme(workdir) -> None:
    """Only local folders and gs:// are stores this package writes; a gs:// path names a bucket
    that Cloud Storage's naming rules allow and no `.` or `..` part (object names are not paths:
    `gs://b/../x` is an object under a folder named `..`, not `gs://x`)."""
    if workdir and "://" in workdir and not workdir.startswith("gs://"):
        scheme = workdir.split("://", 1)[0]
        raise UsageError(
            f"--workdir={workdir}: {scheme}:// is not supported; use a local folder or "
            "gs://bucket/path"
        )
    if workdir and workdir.startswith("gs://"):
        problem = gcs_path_problem(workdir)
        if problem:
            raise UsageError(
                f"--workdir={workdir}: {problem}; e.g. --workdir=gs://my-bucket/runs/a"
            )


# Cloud Storage bucket names (https://cloud.google.com/storage/docs/buckets, "Bucket names"):
# lowercase letters, digits, '-', '_' and '.', starting and ending with a letter or digit, 3-63
# characters (up to 222 with dots, each dot-separated part at most 63), not an IP address, not
# "goog..." and not containing "google".
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


def gcs_path_problem(path: str) -> str:
    """Why `path` (gs://...) is not a usable workdir; '' when it is."""
    bucket, _, rest = path[len("gs://") :].partition("/")
    if not bucket:
        return "names no bucket"
    if not _BUCKET.match(bucket) or any(len(p) > 63 or not p for p in bucket.split(".")):
        return (
            f"{bucket!r} is not a Cloud Storage bucket name (3-63 lowercase letters, digits, "
            f"'-', '_' or '.', starting and ending with a letter or digit)"
        )
    if (len(bucket) > 63 and "." not in bucket) or re.fullmatch(r"[0-9.]+", bucket):
        return f"{bucket!r} is not a Cloud Storage bucket name (too long, or an IP address)"
    if bucket.startswith("goog") or "google" in bucket:
        return f"{bucket!r} is not a Cloud Storage bucket name (no 'goog' prefix or 'google')"
    parts = [p for p in rest.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return "has a '.' or '..' part, which Cloud Storage keeps as a folder name, not a step up"
    return ""


# ------------------------------------------------------------------------------------------------
# The workdir


def _writable(path: str) -> None:
    """Raises RuntimeProblem unless a file can be created in `path` or its nearest existing
    folder."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise UsageError(
            f"cannot create --workdir={path}: {probe} is a file, not a folder; choose "
            f"another --workdir"
        )
    try:
        fd, name = tempfile.mkstemp(prefix=".wide_tf_write_test-", dir=probe)
        os.close(fd)
        os.remove(name)
    except OSError as e:
        raise RuntimeProblem(
            f"cannot write in {probe} ({e.strerror or e}); choose a --workdir you can write to, "
            f"or fix the folder's permissions"
        ) from None


def _check_run_kind(config, workdir: str) -> None:
    """Refuses a study in a single run's workdir, and a single run in a study's."""
    is_study = is_sweep(config)
    has_study = os.path.exists(os.path.join(workdir, "config.json")) or os.path.isdir(
        os.path.join(workdir, "trials")
    )
    has_single = os.path.exists(os.path.join(workdir, "result.json")) or os.path.isdir(
        os.path.join(workdir, "checkpoints")
    )
    kind = config.get("kind", "study")
    if kind == "study" and is_study and has_single and not has_study:
        raise UsageError(
            f"--workdir={workdir} holds a single run (result.json or checkpoints/), not a "
            f"study; use a new --workdir for the study"
        )
    if kind == "study" and not is_study and has_study:
        raise UsageError(
            f"--workdir={workdir} holds a study (config.json, trials/); a config without a "
            f"sweep runs in the workdir itself: use a new --workdir"
        )


def check_same_study(config, workdir: str) -> bool:
    """The one "same study" check: refuses a study whose results-defining config differs from the
    workdir's config.json (UsageError), or a config.json that cannot be read (RuntimeProblem).
    Returns whether config.json exists. Any store (a gs:// path is read through TensorFlow's
    gfile); called once per study command, by trials.check_workdir, which writes config.json when
    there is none."""
    cfg_path = wd.join(workdir, wd.CONFIG)
    if not wd.exists(cfg_path):
        return False
    try:
        theirs = wd.read_json(cfg_path)
    except wd.NotARegularFile as e:
        raise RuntimeProblem(f"{e} (it should be this study's config.json)") from None
    except (OSError, ValueError) + wd.read_errors() as e:
        raise RuntimeProblem(
            f"{cfg_path} is unreadable ({type(e).__name__}: {e}); restore it, or move it aside "
            f"and run the same command to write it again"
        ) from None
    if not isinstance(theirs, dict):
        raise RuntimeProblem(
            f"{cfg_path} holds {type(theirs).__name__}, not a study's settings (a JSON object); "
            "restore it, or move it aside and run the same command to write it again"
        )
    diff = identity.differing_fields(theirs, config)
    if diff:
        raise UsageError(
            f"--workdir={workdir} holds a different study (config differs in: "
            f"{identity.describe(diff, norm=config.model.norm)}); use a new --workdir, or the "
            f"config that made it"
        )
    return True


def _result_files_warnings(workdir: str) -> list[str]:
    """A warning for each results/<id>.json that is partial (the study sets it aside and runs its
    trial again: said here, in the console, not only in a worker's log) or cannot be read."""
    folder = os.path.join(workdir, wd.RESULTS_DIR)
    names = (
        sorted(n for n in os.listdir(folder) if n.endswith(".json"))
        if os.path.isdir(folder)
        else []
    )
    warnings = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            why = wd.record_problem(wd.read_json(path))
        except (ValueError, UnicodeDecodeError) as e:
            why = f"not JSON ({type(e).__name__})"
        except OSError as e:
            warnings.append(f"{path} {wd.unreadable(e)}")
            continue
        if why:
            warnings.append(
                f"{path} is {why}: the study moves it aside (to {name}.partial-<time>) and runs "
                "that trial again, resuming from its checkpoint"
            )
    return warnings


_CKPT_STEP = re.compile(r"^ckpt-(\d+)\.")


def _check_run_files(workdir: str) -> list[str]:
    """An unreadable result.json of a trial is a warning (the study moves it aside itself and runs
    that trial again); the single run's unreadable result.json is refused; an empty (truncated)
    checkpoint file is a warning when an older checkpoint is beside it (the run resumes from
    that one), else refused. No advice deletes anything a run could resume from."""
    warnings = []
    result_files = glob.glob(os.path.join(workdir, "result.json")) + glob.glob(
        os.path.join(workdir, "trials", "*", "result.json")
    )
    for path in result_files:
        try:
            wd.read_json(path)
        except (OSError, ValueError) as e:
            if os.path.dirname(path) != workdir.rstrip(os.sep):  # a trial's: the study heals it
                warnings.append(
                    f"{path} is not a whole result ({type(e).__name__}): the study moves it "
                    "aside (to result.json.partial-<time>) and runs that trial again, resuming "
                    "from its checkpoint"
                )
                continue
            raise RuntimeProblem(
                f"{path} is not a whole result ({type(e).__name__}); move it aside (e.g. to "
                f"{os.path.basename(path)}.bad) and run the same command again: the run resumes "
                f"from its checkpoint"
            ) from None
    ckpt_files = glob.glob(os.path.join(workdir, "checkpoints", "ckpt-*")) + glob.glob(
        os.path.join(workdir, "trials", "*", "checkpoints", "ckpt-*")
    )
    for path in ckpt_files:
        if os.path.isfile(path) and os.path.getsize(path) == 0:
            folder = os.path.dirname(path)
            step = _CKPT_STEP.match(os.path.basename(path))
            if (
                step
                and not path.endswith(".npz")
                and int(step.group(1)) not in (checkpoint_state.committed_steps(folder))
            ):  # TensorFlow's: a save cut short before its state file named it
                warnings.append(
                    f"checkpoint file {path} is empty, left by a save that never finished: the "
                    "run sets it aside and resumes from the newest finished checkpoint, if any"
                )
                continue
            others = {
                m.group(1)
                for m in map(_CKPT_STEP.match, os.listdir(folder))
                if m and (step is None or m.group(1) != step.group(1))
            }
            if others:  # the run resumes from an older one (engine/restore.py)
                warnings.append(
                    f"checkpoint file {path} is empty (truncated): the run skips that checkpoint "
                    f"and resumes from the newest one that reads whole"
                )
                continue
            raise RuntimeProblem(
                f"checkpoint file {path} is empty (truncated): the run cannot resume from it; "
                f"restore the file, or move {folder} aside (it is kept, not read) and run the "
                f"same command again: that run then starts from the beginning"
            )
    return warnings


# The longest path a study writes below its workdir, beyond the trial id: a checkpoint's data
# file with TensorFlow's temporary suffix (trials/<id>/checkpoints/ckpt-<step>.data-00000-of-00001
# .tempstate<19 digits>), with room to spare.
_DEEPEST_BELOW = 160


def _check_path_length(workdir: str) -> None:
    """Refuses a workdir whose paths the file system cannot hold, before any folder is made (a
    name over NAME_MAX, or a path that leaves no room for the files below it under PATH_MAX)."""
    path = os.path.abspath(workdir)
    probe = path
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        name_max, path_max = os.pathconf(probe, "PC_NAME_MAX"), os.pathconf(probe, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096  # Linux's limits
    longest = max(len(os.fsencode(part)) for part in path.split(os.sep))
    if longest > name_max:
        raise UsageError(
            f"--workdir={workdir[:60]}...: a folder name of {longest} bytes is longer than the "
            f"{name_max} this file system allows; choose a shorter --workdir"
        )
    if len(os.fsencode(path)) + _DEEPEST_BELOW > path_max:
        raise UsageError(
            f"--workdir={workdir[:60]}...: a path of {len(os.fsencode(path))} bytes leaves no "
            f"room under this file system's {path_max} for the study's files (up to "
            f"{_DEEPEST_BELOW} more); choose a shorter --workdir"
        )


def check_workdir(config, workdir: str) -> list[str]:
    """Checks a local workdir without changing any of its files; returns warning lines.

    Refuses (UsageError) a workdir that is a file or holds another kind of run (whether it holds
    the same study is `check_same_study`'s, run once by the study: trials.check_workdir);
    RuntimeProblem for a folder that cannot be written, an unreadable single-run result.json,
    and an empty (truncated) checkpoint file; a trial's unreadable result.json is a warning (the
    study moves it aside and runs the trial again)."""
    check_workdir_scheme(workdir)
    if not workdir or "://" in workdir:
        return []
    if os.path.islink(workdir) and not os.path.exists(workdir):
        raise UsageError(
            f"--workdir={workdir} is a symbolic link to {os.readlink(workdir)}, which does not "
            "exist; create that folder, or point --workdir at an existing folder or a new path"
        )
    _check_path_length(workdir)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise UsageError(f"--workdir={workdir} is a file, not a folder; choose another --workdir")
    _writable(workdir)
    if not os.path.isdir(workdir):
        return []
    _check_run_kind(config, workdir)  # (the same study: once, where config.json is written)
    return _result_files_warnings(workdir) + _check_run_files(workdir)
