"""Owns every recursive delete the package makes in a workdir: never through a link.

A workdir may be shared, copied or downloaded, and a folder the package cleans (a previous report
set aside, a dead writer's temporary folder, a worker's scratch folder) may be a symbolic link, or
hold one, that points anywhere. A recursive delete that follows links (tf.io.gfile.rmtree on a
local path does: it asks whether each entry is a folder through stat) empties the link's target.
Here a link is unlinked and never followed:

  * local paths: the top entry is read with lstat (a link or a file is unlinked; the link's target
    stays), and a real folder goes through shutil.rmtree, which works on open folder descriptors
    where the platform allows (`shutil.rmtree.avoids_symlink_attacks`) and unlinks every link it
    meets inside; where that is not available a walk that never follows links deletes it.
  * object stores (gs://): there are no links; the objects under the folder are listed and each is
    deleted by its listed name, then the empty folder markers.

`file://` paths count as local.
"""

from __future__ import annotations

import os
import shutil
import stat

FILE_SCHEME = "file://"


def remove_tree(path: str) -> None:
    """Deletes the folder or file `path` (nothing when it is absent), unlinking links, never
    following one."""
    if path.startswith(FILE_SCHEME):
        path = path[len(FILE_SCHEME) :]
    if "://" in path:
        _remove_listed(path)
    else:
        _remove_local(path)


def is_link(path: str) -> bool:
    """True for a local symbolic link (object stores have none)."""
    if path.startswith(FILE_SCHEME):
        path = path[len(FILE_SCHEME) :]
    return "://" not in path and os.path.islink(path)


def _remove_local(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):  # a link (to a folder or not) or a file: the entry itself goes
        os.unlink(path)
        return
    if shutil.rmtree.avoids_symlink_attacks:
        # Descriptor-based: a folder swapped for a link after the lstat above is refused (OSError)
        # rather than followed, and links inside are unlinked.
        shutil.rmtree(path)
    else:
        _walk_remove(path)


def _walk_remove(path: str) -> None:
    """The fallback: depth first, each entry judged by lstat, links unlinked."""
    with os.scandir(path) as entries:
        found = list(entries)
    for entry in found:
        if entry.is_dir(follow_symlinks=False):
            _walk_remove(entry.path)
        else:
            os.unlink(entry.path)
    os.rmdir(path)


def _remove_listed(path: str) -> None:
    import tensorflow as tf  # only for a path with a scheme

    gfile = tf.io.gfile
    if not gfile.exists(path):
        return
    if not gfile.isdir(path):
        gfile.remove(path)
        return
    folders = []
    for top, _, files in gfile.walk(path):
        folders.append(top)
        for name in files:
            try:
                gfile.remove(f"{top.rstrip('/')}/{name}")
            except tf.errors.NotFoundError:
                pass  # deleted meanwhile
    # Only empty folder markers are left: deepest first, so each is empty when deleted.
    for top in sorted(folders, key=len, reverse=True):
        try:
            gfile.rmtree(top)
        except tf.errors.NotFoundError:
            pass  # an implied folder (no marker object): gone with its last object
