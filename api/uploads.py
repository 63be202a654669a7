"""Streaming multipart upload: the `file` part goes to a temporary file as it arrives.

The size limit is enforced while streaming (413 as soon as it is passed, the
partial file removed), so a large upload never sits in memory. Text fields
(`format`, `name`, `stream`) are capped at a few KiB.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from api.problems import ApiError

MAX_FIELD_BYTES = 4096
FILE_FIELD = "file"
TEXT_FIELDS = ("format", "name", "stream")


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
    fd, name = tempfile.mkstemp(prefix="servetune-upload-", suffix=".part", dir=tmp_dir)
    out = os.fdopen(fd, "wb")
    upload = Upload(path=Path(name), filename="", num_bytes=0)
    part = _Part()
    seen_file = False

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

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if part.name == FILE_FIELD:
            upload.num_bytes += end - start
            if upload.num_bytes > max_bytes:
                raise _TooLarge
            out.write(data[start:end])
        elif part.name in text_fields:
            part.text += data[start:end]
            if len(part.text) > MAX_FIELD_BYTES:
                raise ApiError(422, f"field {part.name!r} is longer than {MAX_FIELD_BYTES} bytes")

    def on_part_end() -> None:
        if part.name in text_fields:
            try:
                upload.fields[part.name] = part.text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ApiError(422, f"field {part.name!r} is not UTF-8 text") from exc

    parser = MultipartParser(
        params[b"boundary"],
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
        },
    )
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except _TooLarge:
        out.close()
        upload.discard()
        raise _too_large(max_bytes, setting) from None
    except ApiError:
        out.close()
        upload.discard()
        raise
    except Exception as exc:  # malformed multipart body
        out.close()
        upload.discard()
        raise ApiError(422, f"malformed multipart body: {exc}", kind="validation") from exc
    out.close()
    if not seen_file:
        upload.discard()
        raise ApiError(
            422,
            "missing the `file` part: send it as multipart field `file` "
            f"(optional fields: {', '.join(text_fields)})",
            kind="validation",
        )
    return upload
