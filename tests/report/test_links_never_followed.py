"""Deletes confined to what the package created: a symbolic link to a victim folder is planted in
every place the package cleans (a previous report set aside, a dead writer's folder, a failed
writer's folder, a worker's scratch folder, a pruned checkpoint, WORKDIR/report itself, a link
inside a folder being deleted), and the victim is shown intact after the clean-up."""

import ast
import os
import pathlib
import socket
import subprocess
import sys

import pytest
from test_report import MEMBERS, make_records

from wide_tf import report
from wide_tf.report import publish
from wide_tf.report.protocol import ReportError
from wide_tf.store import remove
from wide_tf.store import workdir as wd

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _victim(tmp_path):
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "keep.txt").write_text("user data")
    (victim / "sub" / "deep.txt").write_text("more user data")
    return victim


def _intact(victim) -> bool:
    return (victim / "keep.txt").read_text() == "user data" and (
        victim / "sub" / "deep.txt"
    ).read_text() == "more user data"


def _study(tmp_path):
    path = tmp_path / "study"
    path.mkdir()
    from test_report import CONFIG

    wd.write_json(str(path / wd.CONFIG), CONFIG)
    for rec in make_records(MEMBERS[:3], seeds=(0,), batches=(32, 64, 128)):
        wd.record_result(str(path), rec)
    return path


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_report_clean_up_unlinks_planted_links_and_keeps_their_targets(tmp_path):
    victim, study = _victim(tmp_path), _study(tmp_path)
    old_link = study / f"{publish.OLD_PREFIX}planted"
    dead_link = study / f"{publish.TMP_PREFIX}{socket.gethostname()}-{_dead_pid()}-planted"
    old_real = study / f"{publish.OLD_PREFIX}real"  # a real folder holding a link
    old_real.mkdir()
    (old_real / "inner").symlink_to(victim, target_is_directory=True)
    (old_real / "file").symlink_to(victim / "keep.txt")
    for link in (old_link, dead_link):
        link.symlink_to(victim, target_is_directory=True)
    report.write_report(str(study))
    assert _intact(victim)
    for gone in (old_link, dead_link, old_real):
        assert not os.path.lexists(gone)
    assert (study / "report" / "report.md").is_file()
    # A second report swaps the first aside and deletes it: still nothing outside.
    report.write_report(str(study))
    assert _intact(victim)


def test_a_report_folder_that_is_a_link_is_refused_in_one_line(tmp_path):
    victim, study = _victim(tmp_path), _study(tmp_path)
    (study / "report").symlink_to(victim, target_is_directory=True)
    with pytest.raises(ReportError) as e:
        report.write_report(str(study))
    assert "is a symbolic link" in str(e.value) and "\n" not in str(e.value)
    assert _intact(victim) and sorted(os.listdir(victim)) == ["keep.txt", "sub"]
    assert (study / "report").is_symlink()  # the link is the user's: left as it was
    assert not [n for n in os.listdir(study) if n.startswith(".report.")]
    # The swap itself refuses it too (a link planted after the writer's own check).
    tmpdir = publish.new_tmpdir(str(study))
    with pytest.raises(ReportError):
        publish.publish(str(study), tmpdir)
    assert _intact(victim)


def test_a_failed_writers_folder_that_is_a_link_is_unlinked(tmp_path):
    victim = _victim(tmp_path)
    link = tmp_path / f"{publish.TMP_PREFIX}x"
    link.symlink_to(victim, target_is_directory=True)
    publish.discard(str(link))
    assert not os.path.lexists(link) and _intact(victim)


@pytest.mark.parametrize("prefix", ["", "file://"])
def test_remove_tree_never_follows_a_link(tmp_path, prefix):
    victim = _victim(tmp_path)
    scratch = tmp_path / ".worker1"  # a worker's scratch folder (engine's Checkpointer.close)
    scratch.symlink_to(victim, target_is_directory=True)
    remove.remove_tree(prefix + str(scratch))
    assert not os.path.lexists(scratch) and _intact(victim)
    real = tmp_path / "real"
    (real / "a" / "b").mkdir(parents=True)
    (real / "a" / "b" / "link").symlink_to(victim, target_is_directory=True)
    (real / "a" / "file_link").symlink_to(victim / "keep.txt")
    (real / "a" / "own.txt").write_text("ours")
    remove.remove_tree(prefix + str(real))
    assert not os.path.lexists(real) and _intact(victim)
    remove.remove_tree(str(real))  # absent: nothing to do


def test_the_fallback_walk_never_follows_a_link(tmp_path, monkeypatch):
    victim = _victim(tmp_path)
    real = tmp_path / "real"
    (real / "a").mkdir(parents=True)
    (real / "a" / "link").symlink_to(victim, target_is_directory=True)
    monkeypatch.setattr(remove.shutil.rmtree, "avoids_symlink_attacks", False)
    remove.remove_tree(str(real))
    assert not os.path.lexists(real) and _intact(victim)


def test_a_pruned_checkpoint_that_is_a_link_is_unlinked(tmp_path):
    victim = _victim(tmp_path)
    link = tmp_path / "ckpt-1.npz"  # the JAX Checkpointer prunes old ones with wd.remove
    link.symlink_to(victim, target_is_directory=True)
    wd.remove(str(link))
    assert not os.path.lexists(link) and _intact(victim)


def test_object_store_folders_are_deleted_by_listed_names(tmp_path):
    """gs:// has no links; the listed-names path runs here on TensorFlow's in-memory file system
    (ram://), which answers the same gfile calls."""
    tf = pytest.importorskip("tensorflow")
    base = f"ram://{tmp_path.name}/tree"
    tf.io.gfile.makedirs(f"{base}/a/b")  # ram:// lists only folders made (gs:// lists prefixes)
    for name in ("a/x.txt", "a/b/y.txt", "z.txt"):
        with tf.io.gfile.GFile(f"{base}/{name}", "w") as f:
            f.write("x")
    keep = f"ram://{tmp_path.name}/treekeep.txt"  # a sibling sharing the prefix stays
    with tf.io.gfile.GFile(keep, "w") as f:
        f.write("x")
    remove.remove_tree(base)
    assert not tf.io.gfile.exists(f"{base}/a/b/y.txt") and not tf.io.gfile.exists(f"{base}/z.txt")
    assert tf.io.gfile.exists(keep)


def test_no_recursive_delete_outside_store_remove():
    """Every recursive delete in the package goes through store/remove.py: tf.io.gfile.rmtree
    follows links on a local path. (shutil.rmtree never follows one, and is allowed: the
    launcher removes its own temporary folder on the workstation with it.)"""
    found = []
    for path in sorted((ROOT / "wide_tf").rglob("*.py")):
        if path == ROOT / "wide_tf" / "store" / "remove.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("rmtree", "removedirs"):
                if isinstance(node.value, ast.Name) and node.value.id == "shutil":
                    continue
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"recursive deletes outside store/remove.py: {found}"
