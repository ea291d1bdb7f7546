"""Owns the launcher's command line: its flags, their forms and the input checks that answer a bad
one in one line (exit 2) before anything runs; the launcher's exit statuses."""

from __future__ import annotations

import dataclasses
import re

PROG = "launch_tpu.sh"
EXIT_USAGE, EXIT_FAILED, EXIT_REFUSED = 2, 1, 3

USAGE = f"""usage: {PROG} --name=TPU_NAME --config=CONFIG[:VARIANT] --workdir=gs://BUCKET/PATH
         [--accelerator=v4-8] [--zone=ZONE (default us-central2-b for v4; required otherwise)]
         [--backend=tensorflow|jax]
         [--shards=N] [--spot | --no_spot] [--queued] [--watch] [--delete_when_done] [--check]
         [--keep_on_failure] [--stall_minutes=30]
         [--version=IMAGE] [--tf_version=2.19|2.20] [--tf_tpu=2.19.1] [--libtpu=VERSION]
         [--python=3.11|3.12]
         [--pjrt=auto|on|off] [--project=PROJECT] [--no_validate] [--dry_run]
         [-- EXTRA_MAIN_FLAGS...]
       {PROG} --name=TPU_NAME [--zone=...] [--project=...] [--queued]
         --status | --logs [--lines=N] [--follow] | --delete
       {PROG} --workdir=gs://BUCKET/PATH --report
       {PROG} --list_slices     # the slices of docs/tpu.md's table: SLICE REPLICAS HOSTS"""


class Stop(Exception):  # noqa: N818  (an outcome, not an error of the launcher)
    """Ends the launch: `code` is the exit status, `line` what stderr says (one line)."""

    def __init__(self, code: int, line: str, usage: bool = False):
        super().__init__(line)
        self.code, self.line, self.usage = code, line, usage


def usage_error(message: str) -> Stop:
    return Stop(EXIT_USAGE, f"{PROG}: error: {message}", usage=True)


def failed(message: str) -> Stop:
    return Stop(EXIT_FAILED, f"{PROG}: error: {message}")


def refused(message: str) -> Stop:
    return Stop(EXIT_REFUSED, f"{PROG}: refused: {message}")


@dataclasses.dataclass
class Options:
    """The parsed command line. `spot` is None when neither --spot nor --no_spot was given."""

    action: str = "launch"
    name: str = ""
    config: str = ""
    workdir: str = ""
    zone: str = ""
    project: str = ""
    accelerator: str = "v4-8"
    backend: str = "tensorflow"
    version: str = ""
    tf_tpu: str = ""
    tf_version: str = ""
    libtpu: str = ""
    python: str = "3.11"
    pjrt: str = "auto"
    lines: str = "100"
    shards: str = ""
    stall_minutes: str = "30"
    spot: bool | None = None
    queued: bool = False
    watch: bool = False
    delete_when_done: bool = False
    keep_on_failure: bool = False
    check: bool = False
    validate: bool = True
    dry_run: bool = False
    follow: bool = False
    extra: list[str] = dataclasses.field(default_factory=list)
    given: set[str] = dataclasses.field(default_factory=set)  # the flags on the command line


VALUED = {
    "name", "config", "workdir", "zone", "project", "accelerator", "backend", "version", "tf_tpu",
    "tf_version", "libtpu", "python", "pjrt", "lines", "shards", "stall_minutes",
}  # fmt: skip
SWITCHES = {
    "spot": ("spot", True),
    "no_spot": ("spot", False),
    "queued": ("queued", True),
    "watch": ("watch", True),
    "delete_when_done": ("delete_when_done", True),
    "keep_on_failure": ("keep_on_failure", True),
    "check": ("check", True),
    "no_validate": ("validate", False),
    "dry_run": ("dry_run", True),
    "follow": ("follow", True),
}
ACTIONS = ("status", "logs", "report", "delete", "list_slices")


def parse(argv: list[str]) -> Options:
    """The flags as Options; a flag given twice, an unknown one or two actions: one line."""
    o = Options()
    for i, arg in enumerate(argv):
        if arg == "--":
            o.extra = list(argv[i + 1 :])
            break
        if arg in ("-h", "--help"):
            o.action = "help"
            return o
        key, eq, value = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or (key in VALUED) != bool(eq):
            raise usage_error(f"unknown argument '{arg}' (flags take the form --name=value)")
        if key in ACTIONS:
            if o.action != "launch":
                raise usage_error("give one of --status, --logs, --report, --delete, --list_slices")
            o.action = key
            continue
        field = SWITCHES.get(key, (key, None))[0]
        if key not in VALUED and key not in SWITCHES:
            raise usage_error(f"unknown argument '{arg}' (flags take the form --name=value)")
        if field in o.given:
            raise usage_error(f"--{key} is given twice (or with its opposite); give it once")
        o.given.add(field)
        setattr(o, field, value if key in VALUED else SWITCHES[key][1])
    return o


# GCE's resource names (a TPU VM is a Compute Engine VM: its name is its host name): a lower-case
# letter, then lower-case letters, digits and '-', not ending in '-', at most 63 characters, the
# regex `[a-z]([-a-z0-9]{0,61}[a-z0-9])?` that Compute Engine quotes when it refuses a name
# (https://cloud.google.com/compute/docs/naming-resources). The TPU API's own node_id pattern is
# looser (`^[A-Za-z0-9_.+%-]+$`: https://cloud.google.com/python/docs/reference/tpu/latest/
# google.cloud.tpu_v2alpha1.types.QueuedResource.Tpu.NodeSpec); the stricter rule is the one that
# every name the launcher makes (NAME-i under --shards) also passes.
NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
# Project IDs: 6 to 30 lower-case letters, digits or '-', a letter first, no '-' last
# (`gcloud projects create`: https://cloud.google.com/sdk/gcloud/reference/projects/create), or a
# domain-scoped ID of the older form `example.com:my-project`.
PROJECT = re.compile(r"([a-z0-9][-a-z0-9.]{0,62}:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")
# Zones: REGION-LETTER, a region being lower-case words and a number (us-central2-b,
# europe-west4-a, northamerica-northeast1-a: https://cloud.google.com/compute/docs/regions-zones).
ZONE = re.compile(r"[a-z]+(-[a-z]+)*[0-9]+-[a-z]")
# Bucket names: 3 to 63 of a-z, 0-9, '-', '_' and '.', a letter or digit first and last
# (https://cloud.google.com/storage/docs/buckets#naming); object names here keep to a safe alphabet
# because they go into the VM's shell line and into gs:// names.
BUCKET = re.compile(r"[a-z0-9]([-a-z0-9_.]{1,61}[a-z0-9])")
PATH_PART = re.compile(r"[-A-Za-z0-9_.=+@,]+")
CONFIG = re.compile(r"[A-Za-z0-9_.][-A-Za-z0-9_./]*(:[A-Za-z0-9_.-]+)?")


def check_name(name: str, shards: int = 0) -> None:
    if not name:
        raise usage_error("--name is required (the TPU VM's name, e.g. --name=wide-v4)")
    longest = f"{name}-{shards - 1}" if shards else name
    if not NAME.fullmatch(name) or not NAME.fullmatch(longest):
        raise usage_error(
            f"--name={name} is not a valid TPU name: a lower-case letter, then lower-case letters, "
            f"digits and '-', not ending in '-', at most 63 characters"
            + (f" with the -{shards - 1} of --shards" if shards else "")
            + " (Compute Engine's rule), e.g. --name=wide-v4"
        )


def check_where(zone: str, project: str) -> None:
    if zone and not ZONE.fullmatch(zone):
        raise usage_error(
            f"--zone={zone} is not a zone name (REGION-LETTER, e.g. us-central2-b; "
            "'gcloud compute tpus locations list' lists them)"
        )
    if project and not PROJECT.fullmatch(project):
        raise usage_error(
            f"--project={project} is not a project ID (6 to 30 lower-case letters, digits or '-', "
            "a letter first, no '-' last; 'gcloud projects list' shows yours)"
        )


def check_workdir(workdir: str) -> None:
    if not workdir:
        raise usage_error("--workdir is required (a gs:// path, e.g. --workdir=gs://BUCKET/wrn)")
    # The run writes checkpoints, events and results there; a worker's disk goes with the VM (a
    # preempted one is deleted), and the VMs of --shards share one workdir.
    if not workdir.startswith("gs://"):
        raise usage_error(f"--workdir={workdir} must be a gs:// path on a TPU VM")
    bucket, _, path = workdir[5:].partition("/")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in [bucket, *parts]):
        raise usage_error(
            f"--workdir={workdir}: '.' and '..' are not folders in a bucket (gs:// names are "
            "taken literally); give the path itself, e.g. --workdir=gs://BUCKET/wrn"
        )
    if not BUCKET.fullmatch(bucket) or not all(PATH_PART.fullmatch(p) for p in parts):
        raise usage_error(
            f"--workdir={workdir}: use a bucket name (a-z, 0-9, '-', '_', '.') and a path of "
            "letters, digits and '-_.=+@,/' only (no spaces, quotes or shell characters), e.g. "
            "--workdir=gs://BUCKET/wrn"
        )


def check_config(config: str) -> None:
    if not config:
        raise usage_error("--config is required (e.g. --config=configs/wrn.py)")
    if not CONFIG.fullmatch(config) or ".." in config.split(":")[0].split("/"):
        raise usage_error(
            f"--config={config}: use a path of letters, digits and '-_./' with an optional "
            ":VARIANT inside the checkout (no spaces, quotes, '..' or shell characters: it goes "
            "into the VM's shell line), e.g. --config=configs/wrn.py:check"
        )


def check_numbers(o: Options) -> int:
    """--shards, --stall_minutes and the --watch pairings; returns the shard count (0: none)."""
    if o.shards and not re.fullmatch(r"[1-9][0-9]*", o.shards):
        raise usage_error(f"--shards={o.shards}: give a number of VMs, e.g. --shards=4")
    if not re.fullmatch(r"[0-9]{1,5}", o.stall_minutes):
        raise usage_error(
            f"--stall_minutes={o.stall_minutes}: give whole minutes (0 turns the watchdog off), "
            "e.g. --stall_minutes=30"
        )
    if o.keep_on_failure and not o.delete_when_done:
        raise usage_error(
            "--keep_on_failure goes with --delete_when_done (without it nothing is deleted)"
        )
    if o.delete_when_done and not o.watch:
        raise usage_error(
            "--delete_when_done needs --watch: this machine deletes the VM once the study is "
            "done, so it must follow it (run the launch under nohup, tmux or screen)"
        )
    # More VMs than a study has groups would idle; 4096 bounds a typo (10^20) before any loop.
    if o.shards and (len(o.shards) > 4 or int(o.shards) > 4096):
        raise usage_error(
            f"--shards={o.shards}: at most 4096 VMs (a shard per (member, batch size) group at "
            "most); give fewer, e.g. --shards=4"
        )
    return int(o.shards or 0)


def check_extra(o: Options, shards: int) -> None:
    """The flags after --, for wide_tf.main on the VM: not the launcher's own."""
    for a in o.extra:
        if shards and a.startswith("--shard="):
            raise usage_error(
                f"--shards={shards} runs one study on a Ray cluster of the VMs; drop {a}"
            )
        if a.split("=")[0] in ("--workdir", "--config", "--trial", "--cluster"):
            raise usage_error(
                f"{a.split('=')[0]} after -- is the launcher's own flag (the VM would not run "
                "what --watch and --report read); give it before --, or drop it"
            )


def check_versions(o: Options) -> None:
    """The software flags' forms (what they name is software.py's to check)."""
    # python_requires = >=3.11,<3.13 (Keras 3.15 needs 3.11; the package is not measured on 3.13).
    if o.python not in ("3.11", "3.12"):
        raise usage_error(
            f"--python={o.python}: pyproject.toml allows Python 3.11 and 3.12 (Keras 3.15 needs "
            "3.11); use --python=3.11"
        )
    if o.libtpu and not re.fullmatch(r"[0-9][0-9.a-z]*", o.libtpu):
        raise usage_error(f"--libtpu={o.libtpu}: give a libtpu version (e.g. 0.0.14)")
    if o.pjrt not in ("auto", "on", "off"):
        raise usage_error(f"--pjrt={o.pjrt}: choose auto, on or off")
    if o.backend not in ("tensorflow", "jax"):
        raise usage_error(f"--backend={o.backend}: choose tensorflow (the default) or jax")
