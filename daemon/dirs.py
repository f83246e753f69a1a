"""meshd's own directories (state, jobs, runtime): created private (0700), and refused when someone else
owns them or may write into them -- another local user must not pre-create /tmp/meshsched-$UID and swap
api.sock."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeDirectory(RuntimeError):
    """A directory meshd must not use; the message says why and what to do."""


def private_dir(path: Path) -> Path:
    """Create `path` (mode 0700) or check an existing one: owned by this user, not writable by group or
    others, not a symlink. Tightens an owned 0755 directory to 0700. Raises UnsafeDirectory."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise UnsafeDirectory(f"{path} exists and is not a directory") from None
    except PermissionError as exc:
        raise UnsafeDirectory(f"cannot create {path}: {exc.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is a symbolic link or not a directory; meshd uses only a real directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"{path} is owned by uid {st.st_uid}, not by meshd's user (uid {os.geteuid()}); "
            "remove it or choose another directory"
        )
    if st.st_mode & 0o022:
        raise UnsafeDirectory(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"`chmod 700 {path}` or choose another directory"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def highest_job_dir(jobs_dir: Path) -> int:
    """The largest job number under `jobs_dir` (0 when none; an array task's `12_3` counts as 12): new job ids
    continue past it."""
    try:
        names = os.listdir(jobs_dir)
    except OSError:
        return 0
    heads = (n.split("_", 1)[0].rsplit(".", 1)[-1] for n in names)  # a mesh's `n1.12_3` counts as 12 too
    return max((int(h) for h in heads if h.isdigit()), default=0)
