"""Errors that name the real cause: a full disk and a folder removed mid-save are
named as such, never with the advice to delete the run's checkpoints/."""

import errno

import pytest
import tensorflow as tf

from wide_tf import errors


def _raised(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - the test looks at any error
        return e
    raise AssertionError("did not raise")


def save_checkpoint(exc):  # its name holds "save", as the checkpoint writers' do
    raise exc


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        tf.errors.ResourceExhaustedError(None, None, "ckpt-3.data: No space left on device"),
        tf.errors.UnknownError(None, None, "Write failed: Disk quota exceeded"),
    ],
)
def test_a_full_disk_is_named_and_keeps_the_checkpoints(exc):
    line, code = errors.error_line(_raised(lambda: save_checkpoint(exc)), None)
    assert code == 1 and "is full" in line and "run the same command again" in line, line
    assert "delete" not in line


def test_a_full_disk_behind_another_error_is_named():
    def outer():
        try:
            save_checkpoint(OSError(errno.ENOSPC, "No space left on device"))
        except OSError as e:
            raise RuntimeError("save failed") from e

    line, _ = errors.error_line(_raised(outer), None)
    assert "is full" in line and "delete" not in line


def test_a_folder_removed_mid_save_is_named_not_called_damage():
    exc = tf.errors.NotFoundError(
        None, None, "runs/x/trials/t/checkpoints/ckpt-4_temp/part-00000; No such file or directory"
    )
    line, code = errors.error_line(_raised(lambda: save_checkpoint(exc)), None)
    assert code == 1 and "disappeared while it was being written" in line, line
    assert "delete" not in line and "damaged" not in line
