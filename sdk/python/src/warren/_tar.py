"""Directories as tar streams, for ``files.upload_dir`` and ``files.download_dir``."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import List, Union

from .errors import ArgumentTypeError, InvalidArgument, ProtocolError

LocalPath = Union[str, "os.PathLike[str]"]


def _local(p: LocalPath, what: str) -> Path:
    if not isinstance(p, (str, os.PathLike)):
        raise ArgumentTypeError(f"{what} must be a str or a path, not {type(p).__name__}")
    return Path(p)


def pack_dir(local_dir: LocalPath) -> bytes:
    """A tar of the directory's contents (names relative to it; owners not kept: the server
    makes everything belong to the acting user)."""
    root = _local(local_dir, "local_dir")
    if not root.is_dir():
        raise InvalidArgument(f"{root} is not a local directory")
    buf = io.BytesIO()

    def anonymous(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for child in sorted(root.iterdir()):
            tar.add(str(child), arcname=child.name, recursive=True, filter=anonymous)
    return buf.getvalue()


def _safe_members(tar: tarfile.TarFile, dest: Path) -> List[tarfile.TarInfo]:
    """The members, refusing any that would land outside ``dest`` (for Pythons without
    ``tarfile``'s extraction filters)."""
    out = []
    base = os.path.realpath(dest)
    for m in tar.getmembers():
        name = m.name
        while name.startswith("./"):
            name = name[2:]
        if name in ("", "."):
            continue
        target = os.path.realpath(os.path.join(base, name))
        if os.path.isabs(m.name) or not (target == base or target.startswith(base + os.sep)):
            raise ProtocolError(
                f"the tar from Warren has an entry outside its directory: {m.name!r}"
            )
        if m.issym() or m.islnk():
            link = os.path.realpath(os.path.join(os.path.dirname(target), m.linkname))
            if m.islnk():
                link = os.path.realpath(os.path.join(base, m.linkname))
            if os.path.isabs(m.linkname) or not link.startswith(base + os.sep):
                raise ProtocolError(
                    f"the tar from Warren has a link pointing outside its directory: {m.name!r}"
                )
        if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            continue  # devices and fifos are not downloaded
        m.mode &= 0o777
        out.append(m)
    return out


def unpack(data: bytes, local_dir: LocalPath) -> Path:
    """Extracts a tar stream into ``local_dir`` (made if missing)."""
    dest = _local(local_dir, "local_dir")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(str(dest), filter="data")
            else:  # Python without extraction filters (before 3.9.17 / 3.10.12 / 3.11.4)
                tar.extractall(str(dest), members=_safe_members(tar, dest))
    except tarfile.TarError as e:  # includes the filters' refusals of unsafe entries
        raise ProtocolError(f"could not read the tar stream from Warren: {e}") from None
    return dest
