"""Streaming multipart upload: the `file` part goes to a temporary file as it arrives.

The size limit is enforced while streaming (413 as soon as it is passed, the
partial file removed), so a large upload never sits in memory. Text fields
(`format`, `name`, `stream`, ...) are capped at a few KiB; a field the route does
not know is refused (422). A body that ends before the closing multipart boundary
(the client stopped or disconnected mid-upload) is refused with 400: its last
part would otherwise be stored cut short.

The spool. Uploads are spooled in `SERVETUNE_UPLOAD_DIR` (default: the system's
temp folder) as `servetune-upload-<host>-<pid>-*.part` files, and profile imports
unpack into `servetune-profile-<host>-<pid>-*` folders; <host> is a hash of the
host name, <pid> the owning server process. Every failure path removes its own
files. What a killed process left behind is removed by `clean_upload_spool` when
an app starts: entries of ours whose owner is gone (same host, no such process)
and entries of any owner untouched for `STALE_AFTER_S` (an hour; also the rule
for other hosts sharing the folder, for reused pids, and for older names without
an owner). Several server processes may therefore share one spool folder, on one
host or several; processes that share it from separate pid namespaces (containers)
under the same host name should each get their own folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from api.problems import ApiError
from optimizer.traces.errors import MAX_ECHO_ITEMS, clip

MAX_FIELD_BYTES = 4096
FILE_FIELD = "file"
TEXT_FIELDS = ("format", "name", "stream")
SPOOL_PREFIXES = ("servetune-upload-", "servetune-profile-")
STALE_AFTER_S = 3600.0
_OWNER = re.compile(r"servetune-(?:upload|profile)-([0-9a-f]{8})-([0-9]+)-")
log = logging.getLogger("servetune.api")


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def spool_prefix(kind: str) -> str:
    """`servetune-<kind>-<host>-<pid>-`: a spooled entry's name start, naming its owner."""
    return f"servetune-{kind}-{_host_tag()}-{os.getpid()}-"


def _process_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # no safe probe (os.kill would terminate it): rely on the age rule
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's
        return True
    return True


def _is_stale(name: str, mtime: float, now: float, max_age_s: float) -> bool:
    owner = _OWNER.match(name)
    if owner and owner[1] == _host_tag() and not _process_alive(int(owner[2])):
        return True
    return now - mtime > max_age_s


def clean_upload_spool(
    spool_dir: str | Path | None, *, max_age_s: float = STALE_AFTER_S, now: float | None = None
) -> int:
    """Remove stale spool entries (see the module docstring); return how many.

    Only names starting with `SPOOL_PREFIXES` and owned by this user are looked at;
    symbolic links are removed, never followed.
    """
    directory = Path(spool_dir) if spool_dir else Path(tempfile.gettempdir())
    now = time.time() if now is None else now
    uid = os.getuid() if hasattr(os, "getuid") else None
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(SPOOL_PREFIXES):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if uid is not None and st.st_uid != uid:
                continue
            if not _is_stale(entry.name, st.st_mtime, now, max_age_s):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue  # gone meanwhile, or not ours to remove
        removed += 1
    return removed


def clean_spool_at_start(spool_dir: str | None) -> None:
    """At startup, clean the upload spool of what killed server processes left."""
    removed = clean_upload_spool(spool_dir)
    if removed:
        log.info("removed %d stale upload file(s) from %s", removed, spool_dir or "the temp dir")


@dataclass(slots=True)
class Upload:
    path: Path
    filename: str
    num_bytes: int
    fields: dict[str, str] = field(default_factory=dict)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)

    def text(self, key: str, max_len: int = 200) -> str | None:
        """The text field `key` without surrounding blanks; None when absent or blank,
        a 422 when longer than `max_len` or holding control characters."""
        value = self.fields.get(key, "").strip()
        if not value:
            return None
        if len(value) > max_len or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ApiError(
                422,
                f"field {key!r}: expected 1 to {max_len} printable characters",
                kind="validation",
            )
        return value


class _TooLarge(Exception):
    pass


@dataclass(slots=True)
class _Part:
    name: str | None = None
    filename: str | None = None
    header_field: bytes = b""
    header_value: bytes = b""
    disposition: bytes = b""
    text: bytearray = field(default_factory=bytearray)


def _too_large(max_bytes: int, setting: str) -> ApiError:
    return ApiError(
        413,
        f"the uploaded file is larger than the limit of {max_bytes:,} bytes ({setting})",
        kind="too-large",
    )


async def receive_upload(
    request: Request,
    *,
    max_bytes: int,
    tmp_dir: str | None,
    text_fields: tuple[str, ...] = TEXT_FIELDS,
    setting: str = "SERVETUNE_MAX_UPLOAD_BYTES",
) -> Upload:
    """Spool the `file` part to a temporary file and read the text fields.

    On any failure (an ApiError, a client that disconnects, a cancelled task)
    nothing is left in the spool; on success the caller must `discard()` it.
    """
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise ApiError(
            415,
            f"expected a multipart/form-data upload with a `file` field, got content type "
            f"{request.headers.get('content-type', '(none)')!r}",
            kind="unsupported-media-type",
        )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes + 64 * 1024:
        raise _too_large(max_bytes, setting)
    fd, name = tempfile.mkstemp(prefix=spool_prefix("upload"), suffix=".part", dir=tmp_dir)
    upload = Upload(path=Path(name), filename="", num_bytes=0)
    try:
        with os.fdopen(fd, "wb") as out:
            await _receive(request, params[b"boundary"], out, upload, max_bytes, text_fields)
    except _TooLarge:
        upload.discard()
        raise _too_large(max_bytes, setting) from None
    except ClientDisconnect:
        upload.discard()
        raise _truncated("the client disconnected before the upload ended") from None
    except ApiError:
        upload.discard()
        raise
    except Exception as exc:  # malformed multipart body
        upload.discard()
        raise ApiError(422, f"malformed multipart body: {exc}", kind="validation") from exc
    except BaseException:  # cancelled: no one to answer, but nothing may stay behind
        upload.discard()
        raise
    return upload


def _truncated(why: str) -> ApiError:
    return ApiError(
        400,
        f"{why}: the multipart body has no closing boundary, so the upload is incomplete; "
        "nothing was stored (send the whole file again)",
        kind="truncated-upload",
    )


async def _receive(
    request: Request,
    boundary: bytes,
    out: BinaryIO,
    upload: Upload,
    max_bytes: int,
    text_fields: tuple[str, ...],
) -> None:
    part = _Part()
    seen_file = False
    ended = False
    unknown: list[str] = []
    num_unknown_bytes = 0

    def on_part_begin() -> None:
        nonlocal part
        part = _Part()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        part.header_field += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        part.header_value += data[start:end]

    def on_header_end() -> None:
        if part.header_field.strip().lower() == b"content-disposition":
            part.disposition = part.header_value
        part.header_field, part.header_value = b"", b""

    def on_headers_finished() -> None:
        nonlocal seen_file
        _, opts = parse_options_header(part.disposition)
        part.name = opts.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" in opts:
            part.filename = opts[b"filename"].decode("utf-8", "replace")
        if part.name == FILE_FIELD:
            if seen_file:
                raise ApiError(422, "more than one `file` part; upload one file per request")
            seen_file = True
            upload.filename = Path(part.filename or "upload").name or "upload"
        elif part.name not in text_fields and part.name not in unknown:
            unknown.append(part.name)

    def on_part_data(data: bytes, start: int, end: int) -> None:
        nonlocal num_unknown_bytes
        if part.name == FILE_FIELD:
            upload.num_bytes += end - start
            if upload.num_bytes > max_bytes:
                raise _TooLarge
            out.write(data[start:end])
        elif part.name in text_fields:
            part.text += data[start:end]
            if len(part.text) > MAX_FIELD_BYTES:
                raise ApiError(422, f"field {part.name!r} is longer than {MAX_FIELD_BYTES} bytes")
        else:  # an unknown part is refused below; a large one at once
            num_unknown_bytes += end - start
            if num_unknown_bytes > MAX_FIELD_BYTES:
                raise _unknown_fields(unknown, text_fields)

    def on_part_end() -> None:
        if part.name in text_fields:
            try:
                upload.fields[part.name] = part.text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ApiError(422, f"field {part.name!r} is not UTF-8 text") from exc

    def on_end() -> None:
        nonlocal ended
        ended = True

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
            "on_end": on_end,
        },
    )
    async for chunk in request.stream():
        parser.write(chunk)
    parser.finalize()  # checks nothing (python-multipart 0.0.x): `ended` is the check
    if not ended:
        raise _truncated("the upload ended early")
    if not seen_file:
        raise ApiError(
            422,
            "missing the `file` part: send it as multipart field `file` "
            f"(optional fields: {', '.join(text_fields)})",
            kind="validation",
        )
    if unknown:
        raise _unknown_fields(unknown, text_fields)


def _unknown_fields(names: list[str], text_fields: tuple[str, ...]) -> ApiError:
    shown = ", ".join(repr(clip(name, 64)) for name in names[:MAX_ECHO_ITEMS])
    return ApiError(
        422,
        f"unknown multipart field(s) {shown}; expected `file` and optionally "
        f"{', '.join(text_fields)}",
        kind="validation",
    )
