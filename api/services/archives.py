"""Safe unpacking of an uploaded profile: a zip or tar(.gz) archive, or one CSV file.

The server never reads a folder named by the client. An upload is unpacked into a
fresh temporary folder, member by member, refusing anything that could escape it
or exhaust the disk: absolute paths, `..`, drive letters, links and device files,
more than `max_members` members, or more than `max_unpacked_bytes` in all (counted
while writing, so a lying header or a compression bomb stops at the limit).
"""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

CHUNK = 1 << 20


class ArchiveError(ValueError):
    """The upload is not a usable archive; the message is for the user."""


class ArchiveTooLarge(ArchiveError):
    """The archive unpacks to more than the limit."""


@dataclass(frozen=True, slots=True)
class UnpackLimits:
    max_unpacked_bytes: int
    max_members: int = 10_000


def _safe_relative(name: str) -> PurePosixPath | None:
    """The member's path inside the destination, None for the root entry; raises on escape."""
    text = name.replace("\\", "/")
    path = PurePosixPath(text)
    if text.startswith("/") or (len(text) > 1 and text[1] == ":"):
        raise ArchiveError(f"archive member {name!r}: absolute paths are not allowed")
    parts = [p for p in path.parts if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"archive member {name!r}: '..' is not allowed")
    if any("\x00" in p or len(p) > 255 for p in parts):
        raise ArchiveError(f"archive member {name!r}: invalid file name")
    return PurePosixPath(*parts) if parts else None


@dataclass(slots=True)
class _Writer:
    dest: Path
    limits: UnpackLimits
    num_bytes: int = 0
    num_members: int = 0

    def count_member(self) -> None:
        self.num_members += 1
        if self.num_members > self.limits.max_members:
            raise ArchiveError(f"the archive has more than {self.limits.max_members:,} members")

    def mkdir(self, rel: PurePosixPath) -> None:
        (self.dest / rel).mkdir(parents=True, exist_ok=True)

    def write(self, rel: PurePosixPath, source: BinaryIO) -> None:
        target = self.dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            raise ArchiveError(f"archive member {str(rel)!r} appears twice")
        with target.open("wb") as out:
            while chunk := source.read(CHUNK):
                self.num_bytes += len(chunk)
                if self.num_bytes > self.limits.max_unpacked_bytes:
                    raise ArchiveTooLarge(
                        f"the archive unpacks to more than {self.limits.max_unpacked_bytes:,} bytes"
                    )
                out.write(chunk)


def _unzip(archive: Path, writer: _Writer) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                writer.count_member()
                rel = _safe_relative(info.filename)
                mode = (info.external_attr >> 16) & 0o170000
                if mode == 0o120000:
                    raise ArchiveError(f"archive member {info.filename!r}: links are not allowed")
                if rel is None:
                    continue
                if info.is_dir():
                    writer.mkdir(rel)
                    continue
                with zf.open(info) as source:
                    writer.write(rel, source)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        EOFError,
        OSError,
    ) as exc:
        raise ArchiveError(f"unreadable zip archive: {exc}") from None
    except RuntimeError as exc:  # encrypted members
        raise ArchiveError(f"unreadable zip archive: {exc}") from None


def _untar(archive: Path, writer: _Writer) -> None:
    try:
        with tarfile.open(archive, "r:*") as tf:
            for member in tf:
                writer.count_member()
                rel = _safe_relative(member.name)
                if member.issym() or member.islnk():
                    raise ArchiveError(f"archive member {member.name!r}: links are not allowed")
                if not (member.isfile() or member.isdir()):
                    raise ArchiveError(f"archive member {member.name!r}: not a file or folder")
                if rel is None:
                    continue
                if member.isdir():
                    writer.mkdir(rel)
                    continue
                source = tf.extractfile(member)
                if source is None:
                    raise ArchiveError(f"archive member {member.name!r}: unreadable")
                with source:
                    writer.write(rel, source)
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, ArchiveError):
            raise
        raise ArchiveError(f"unreadable tar archive: {exc}") from None


def unpack_upload(upload: Path, filename: str, dest: Path, limits: UnpackLimits) -> Path:
    """Unpack `upload` (named `filename` by the client) into the empty folder `dest`.

    Returns the folder or file to import: a lone top-level folder (an archive of
    `h100_sxm/`), else `dest` itself; a plain `.csv` upload is copied as
    `dest/<filename>`. Raises ArchiveError (ArchiveTooLarge past the size limit).
    """
    writer = _Writer(dest, limits)
    lower = filename.lower()
    if zipfile.is_zipfile(upload):
        _unzip(upload, writer)
    elif lower.endswith(".csv"):
        name = _safe_relative(Path(filename).name)
        if name is None:
            raise ArchiveError(f"invalid file name {filename!r}")
        with upload.open("rb") as source:
            writer.write(name, source)
        return dest / name
    elif _is_tar(upload):
        _untar(upload, writer)
    else:
        raise ArchiveError(
            f"{filename!r} is neither a zip nor a tar(.gz) archive nor a .csv file; upload "
            "an AIConfigurator GPU folder or a Vidur folder as .zip or .tar.gz, or one Vidur CSV"
        )
    entries = list(dest.iterdir())
    if not entries:
        raise ArchiveError("the archive is empty")
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return dest


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except (OSError, tarfile.TarError, EOFError):
        return False


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
