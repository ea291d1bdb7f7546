"""What a user meets after a study: provenance in config.json, every result.json, the
report's protocol table and TensorBoard's HParams; TensorBoard's curated sessions with one tag
set. Read from the session's finished smoke study (tests/conftest.py), plus the probes alone."""

import glob
import json
import os

from wide_tf.schema import provenance

FIELDS = ("wide_tf", "command", "python", "tensorflow", "keras", "numpy", "machine", "env")


def _check(p: dict, command_has: str) -> None:
    assert set(FIELDS) <= set(p)
    assert p["wide_tf"]["version"] and len(p["wide_tf"]["commit"] or "") == 40  # a git checkout
    assert isinstance(p["wide_tf"]["dirty"], bool)
    assert command_has in p["command"] and p["command"].startswith("python -m wide_tf.main")
    assert p["tensorflow"].startswith("2.") and p["keras"].startswith("3.") and p["numpy"]
    m = p["machine"]
    assert m["cpu_cores"] >= 1 and m["accelerator"] and isinstance(m["cpu_flags"], list)


def test_cpu_model_and_flags_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Test CPU @ 2GHz\nflags\t\t: fpu sse4_2 avx avx2 fma "
        "avx512f amx_tile amx_bf16\n\nprocessor\t: 1\nmodel name\t: Test CPU @ 2GHz\n"
    )
    model, flags = provenance._cpuinfo(str(info))
    assert model == "Test CPU @ 2GHz"
    assert flags == ["sse4_2", "avx", "avx2", "fma", "avx512f", "amx_tile", "amx_bf16"]
    assert provenance._cpuinfo(str(tmp_path / "missing"))[1] == []


def test_command_line_names_the_module_and_is_handed_to_children(monkeypatch):
    monkeypatch.delenv(provenance.COMMAND_ENV, raising=False)
    argv = ["/x/wide_tf/main.py", "--config=configs/mlp.py:local", "--workdir=a b"]
    assert (
        provenance.command_line(argv)
        == "python -m wide_tf.main --config=configs/mlp.py:local '--workdir=a b'"
    )
    monkeypatch.setattr("sys.argv", argv)
    monkeypatch.setenv(provenance.COMMAND_ENV, provenance.child_env()[provenance.COMMAND_ENV])
    assert provenance.command_line() == provenance.command_line(argv)  # what a worker records


def test_settings_that_change_float_arithmetic_are_recorded(monkeypatch):
    """oneDNN on/off and its instruction-set cap both change float32 results on one machine
    (docs/results/digits_mlp.md, "How much the numbers move between machines"): each must be
    in `env`."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    p = provenance.collect(["python", "-m", "wide_tf.main"])
    assert p["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2" and p["env"]["TF_ENABLE_ONEDNN_OPTS"] == "0"
    assert "XLA_FLAGS" not in p["env"]  # recorded only when set
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in provenance.summary(p)["env"]


def test_summary_rows_are_readable():
    rows = provenance.summary(provenance.collect(["python", "-m", "wide_tf.main", "--x=1"]))
    assert rows["versions"].startswith("Python 3.") and "TensorFlow 2." in rows["versions"]
    assert "accelerator" in rows["machine"] and rows["command"].endswith("--x=1")


def test_config_results_and_report_carry_provenance(smoke_study):
    workdir, _ = smoke_study
    config = json.loads((workdir / "config.json").read_text())
    _check(config["provenance"], "--config=configs/mlp.py:smoke")
    records = [json.loads(p.read_text()) for p in (workdir / "results").glob("*.json")]
    assert records
    for r in records:
        _check(r["provenance"], "--config=configs/mlp.py:smoke")
    md = (workdir / "report" / "report.md").read_text()
    for label in ("| Code (wide_tf) | 0.", "| Command | python -m wide_tf.main", "| Versions |"):
        assert label in md, label
    assert "| Machine | " in md and "accelerator" in md


def test_tensorboard_opens_on_sessions_with_curves_and_hparams(smoke_study):
    """report/tb: a session per (member, batch) with train/, train_set/ and test/ runs sharing
    the tags accuracy and loss, and the session's HParams beside them."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import plugin_data_pb2

    workdir, _ = smoke_study
    tb = workdir / "report" / "tb"
    sessions = sorted(os.path.dirname(f) for f in glob.glob(str(tb / "*" / "b*" / "events.*")))
    assert len(sessions) == 4  # smoke: 2 members x 2 batches
    for session in sessions:
        tags = {}
        for run in ("train", "train_set", "test"):
            files = glob.glob(os.path.join(session, run, "events.*"))
            assert files, (session, run)
            tags[run] = {
                v.tag
                for f in files
                for raw in tf.data.TFRecordDataset(f)
                for v in tf.compat.v1.Event.FromString(raw.numpy()).summary.value
            }
        assert {"accuracy", "loss"} <= tags["train"] & tags["train_set"] & tags["test"]
        hp = [
            v
            for f in glob.glob(os.path.join(session, "events.*"))
            for raw in tf.data.TFRecordDataset(f)
            for v in tf.compat.v1.Event.FromString(raw.numpy()).summary.value
            if v.metadata.plugin_data.plugin_name == "hparams"
        ]
        start = plugin_data_pb2.HParamsPluginData.FromString(
            hp[0].metadata.plugin_data.content
        ).session_start_info
        assert "TensorFlow 2." in start.hparams["provenance/versions"].string_value


def test_readme_offers_both_installs_and_says_where_its_numbers_come_from():
    """The first command stays; the plain install is offered beside it; the README sends every
    number's machine to docs/results/digits_mlp.md, whose machine table names the recorded run
    they come from;
    TensorBoard is opened on the curated folder."""
    import pathlib

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    first = readme.split("```bash\n", 1)[1].splitlines()[0]
    assert first == (
        "pip install -e '.[test]' && python -m wide_tf.main --config=configs/mlp.py:local "
        "--workdir=runs/mlp_local"
    )
    assert "`pip install -e .` installs the" in readme
    assert "docs/results/digits_mlp.md#how-much-the-numbers-move-between-machines" in readme
    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "digits_mlp.md"
    where = page.read_text().split("## How much the numbers move between machines", 1)[1][:4000]
    row = next(line for line in where.splitlines() if line.startswith("| the reference |"))
    for fact in ("59a862c", "TF 2.21.0", "Keras 3.15.1", "NumPy 2.4.6", "AVX-512"):
        assert fact in row, fact
    assert "tensorboard --logdir runs/mlp_local/report/tb" in readme
