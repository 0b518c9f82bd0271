"""The origin's open files, kept across requests: one descriptor and one set of
validators per file, checked against the file system on every request.

A web seed's crowd asks for the same few files thousands of times a second, one
128 KiB - 1 MiB range at a time. Opening the file, ``fstat``, building the ETag and
``Last-Modified`` and closing it again was per-request work (``open`` + ``fstat`` +
``close``, a Python file object, the validators' strings). `OpenFiles` keeps each file
open with what its answers need and checks it with one ``stat`` of the path per
request: the device, inode, size and modification time must be those of the kept
descriptor, else the file was replaced or changed and it is opened again (the new
bytes, a new ETag). The old descriptor stays open until the transfers reading it end:
each holder has taken a reference (`OpenFiles.take`, `OpenFiles.give_back`).

Bounded: at most `OpenFiles.max_files` kept per process; beyond it the least recently
used one is dropped (closed when nobody reads it). Out of descriptors, the caller first
drops every unused one (`OpenFiles.drop_unused`) and then waits.

Every descriptor is read with explicit offsets (``sendfile(2)``, ``pread``), never
through a file position, so concurrent transfers of one file share it safely.
"""

from __future__ import annotations

import os
import stat
from collections import OrderedDict
from dataclasses import dataclass, field
from email.utils import formatdate

from pressrun.origin.core import content_type_for, make_etag

#: files kept open per process by default (a few issues' bundles, each a few files)
MAX_FILES = 256


class NotAFile(OSError):
    """The path exists but is not a regular file (a directory, a device)."""


@dataclass(slots=True, eq=False)
class OpenFile:
    """One kept file: its descriptor and what every answer about it says."""

    fd: int
    #: (st_dev, st_ino, st_size, st_mtime_ns) of the open file: the version it reads
    version: tuple[int, int, int, int]
    size: int
    etag: str
    last_modified: str
    content_type: str
    #: transfers reading it now (plus one while it is the kept version)
    refs: int = field(default=1)

    def _unref(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            os.close(self.fd)
            self.fd = -1


def _version(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class OpenFiles:
    """The kept files of one origin process (see the module docstring)."""

    def __init__(self, root: str, *, max_files: int = MAX_FILES) -> None:
        if max_files < 1:
            raise ValueError("max_files must be at least 1")
        self.root = root
        self.max_files = max_files
        self._kept: OrderedDict[str, OpenFile] = OrderedDict()
        self.opened = 0  # files opened since start (a re-open after a change counts)

    def __len__(self) -> int:
        return len(self._kept)

    def take(self, issue: str, name: str) -> OpenFile:
        """The current version of ``ROOT/issue/name``, referenced for the caller, who
        gives it back with `give_back` when its transfer ends.

        Raises the ``OSError`` of ``stat``/``open`` (FileNotFoundError,
        NotADirectoryError, PermissionError, EMFILE...) or `NotAFile`. The names
        must have been checked (`pressrun.origin.core.valid_name`) by the caller.
        """
        path = f"{self.root}/{issue}/{name}"
        st = os.stat(path)
        kept = self._kept.get(path)
        if kept is not None and kept.version == _version(st):
            self._kept.move_to_end(path)
            kept.refs += 1
            return kept
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(f"{path} is not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            # the version of what was opened: the path may have been replaced
            # between the stat and the open
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotAFile(f"{path} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        mtime = st.st_mtime
        opened = OpenFile(
            fd=fd,
            version=_version(st),
            size=st.st_size,
            etag=make_etag(st.st_size, st.st_mtime_ns, st.st_ino),
            last_modified=formatdate(mtime, usegmt=True),
            content_type=content_type_for(name),
            refs=2,  # the cache's and the caller's
        )
        self.opened += 1
        if kept is not None:
            kept._unref()  # closed now, or when its last transfer ends
        self._kept[path] = opened
        self._kept.move_to_end(path)
        while len(self._kept) > self.max_files:
            _, oldest = self._kept.popitem(last=False)
            oldest._unref()
        return opened

    @staticmethod
    def give_back(opened: OpenFile) -> None:
        """The caller's transfer of `opened` ended (closes it when it was replaced,
        dropped or evicted meanwhile and nobody else reads it)."""
        opened._unref()

    def drop_unused(self) -> int:
        """Close every kept file no transfer reads (out of descriptors); how many."""
        dropped = 0
        for path, opened in list(self._kept.items()):
            if opened.refs == 1:
                del self._kept[path]
                opened._unref()
                dropped += 1
        return dropped

    def close(self) -> None:
        """Drop every kept file (closed as their transfers end)."""
        kept, self._kept = self._kept, OrderedDict()
        for opened in kept.values():
            opened._unref()
