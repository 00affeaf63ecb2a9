"""A size-limited filesystem for kvtier's data dir: a sparse image file beside the folder,
formatted ext4 (O_DIRECT works there, as on a real NVMe filesystem) and loop-mounted onto it,
so the soak's ``fs-full`` fault can fill the very filesystem the engine's store writes to::

    workdir/engine-0.img   sparse image, ``mib`` MiB, ext4 (4 KiB blocks, none reserved)
    workdir/engine-0/      its mount point: kvtier's data dir

Needs root, ``mkfs.ext4`` and loop devices; :func:`why_not` says which is missing without
changing anything.  Not thread-safe: one thread mounts and closes.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class MountError(RuntimeError):
    """A mount, mkfs or umount command failed; the message holds its stderr."""


def why_not() -> str | None:
    """Why a size-limited mount cannot be made here (not root, no ``mkfs.ext4``, no ``mount``),
    or None if it may be.  Cheap: runs nothing.  A kernel that refuses the loop mount itself
    (a container without loop devices) is found only by :meth:`SizeLimitedMount.mount`."""
    if os.geteuid() != 0:
        return "a loop mount needs root"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def _run(cmd: list[str]) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MountError(f"{' '.join(cmd)}: {exc}") from None
    if r.returncode != 0:
        raise MountError(f"{' '.join(cmd)} exited with {r.returncode}: {(r.stderr or r.stdout).strip()}")


class SizeLimitedMount:
    """An ext4 of ``mib`` MiB loop-mounted onto the folder ``path`` (created if missing; it
    should be empty: what it holds is hidden while mounted).  The image is ``<path>.img``."""

    def __init__(self, path: str | os.PathLike, mib: int) -> None:
        if mib < 8:
            raise ValueError(f"a size-limited mount needs at least 8 MiB, not {mib}")
        self.path = Path(path)
        self.mib = mib
        self.image = self.path.with_name(self.path.name + ".img")
        self.mounted = False

    def available(self) -> bool:
        return why_not() is None

    def why_not(self) -> str | None:
        return why_not()

    def mount(self) -> None:
        """Make the image (sparse), format it and mount it onto ``path``.  Once.

        Raises:
            MountError: mkfs or mount failed (the message has its stderr); the image is removed.
            RuntimeError: already mounted.
        """
        if self.mounted:
            raise RuntimeError(f"{self.path} is already mounted")
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.image, "wb") as f:
                f.truncate(self.mib << 20)
            # -m 0: no blocks reserved for root (kvtier runs as root in the soak and would get them);
            # -b 4096: the block size of an NVMe filesystem (mkfs picks 1 KiB below 512 MiB)
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-b", "4096", str(self.image)])
            _run(["mount", "-o", "loop", str(self.image), str(self.path)])
        except BaseException:
            self.image.unlink(missing_ok=True)
            raise
        self.mounted = True

    def free_bytes(self) -> int:
        """Bytes a writer may still allocate on the mount (``f_bavail``)."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        """Unmount (lazily if busy) and remove the image.  Safe to call twice and after a
        failed :meth:`mount`.

        Raises:
            MountError: umount failed (the image is kept, so nothing mounted is pulled away).
        """
        if self.mounted:
            try:
                _run(["umount", str(self.path)])
            except MountError:
                _run(["umount", "-l", str(self.path)])   # a process still holds a file there
            self.mounted = False
        self.image.unlink(missing_ok=True)

    def __enter__(self) -> "SizeLimitedMount":
        self.mount()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
