"""Request bodies read with bounded memory: a size limit, and commits streamed to disk.

A commit arrives as NDJSON, one operation per line, each file's content inline as one JSON string
(base64) that can be as large as the file. Holding the body whole, splitting it into lines and
decoding each costs several times the upload in memory. Here the body is read from the socket in
chunks and lexed as it comes: strings up to `SMALL_STRING` bytes stay in the line, longer ones
(file contents) are written unescaped to a file in a per-request staging folder and replaced in
the line by a placeholder, so memory stays within a few chunks whatever the file size. A file's
content is then base64-decoded from its spill file to another file in chunks (storage moves it
into the blob store without reading it into memory).

Limits: the whole body at most `max_bytes` (413 Payload Too Large, before anything is stored);
the part of a line outside long strings at most `SMALL_LINE` bytes (an operation's header is
small); a body cut short (truncated chunked encoding, client gone) is a 400, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from werkzeug.exceptions import HTTPException

from .errors import BadRequest, HubError

CHUNK = 1 << 20
SMALL_STRING = 64 << 10  # longer JSON strings are spilled to disk
SMALL_LINE = 1 << 20  # bytes of a line outside spilled strings
JSON_BODY_LIMIT = 1 << 20  # bodies of the JSON routes (create, settings, paths-info, ...)

_OUTSIDE = re.compile(rb'["\n]')
_INSIDE = re.compile(rb'["\\]')
_ESCAPES = {
    ord('"'): b'"',
    ord("\\"): b"\\",
    ord("/"): b"/",
    ord("b"): b"\b",
    ord("f"): b"\f",
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
}


class PayloadTooLarge(HubError):
    """The request body exceeds the hub's upload limit."""

    status = 413


def read_body(req: Any, limit: int) -> Iterator[bytes]:
    """The request body in chunks of at most CHUNK bytes.

    Raises PayloadTooLarge when it is (or announces itself as) larger than `limit`, BadRequest
    when it ends early or its transfer encoding is broken.
    """
    declared = req.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(
            f"Request body of {declared} bytes exceeds this hub's limit of {limit} bytes"
        )
    total = 0
    stream: IO[bytes] = req.stream
    while True:
        try:
            chunk = stream.read(CHUNK)
        except HTTPException as e:  # werkzeug: ClientDisconnected, RequestEntityTooLarge
            if e.code == 413:
                raise PayloadTooLarge(
                    f"Request body exceeds this hub's limit of {limit} bytes"
                ) from None
            raise BadRequest(
                "Request body is incomplete (the client sent less than announced)"
            ) from None
        except (OSError, ValueError):
            raise BadRequest(
                "Request body is incomplete or its transfer encoding is malformed"
            ) from None
        if not chunk:
            return
        total += len(chunk)
        if total > limit:
            raise PayloadTooLarge(f"Request body exceeds this hub's limit of {limit} bytes")
        yield chunk


def read_small_body(req: Any, limit: int = JSON_BODY_LIMIT) -> bytes:
    """The whole body of a route that takes a small JSON document (413 beyond `limit`)."""
    return b"".join(read_body(req, limit))


class _Lexer:
    """Splits an NDJSON byte stream into lines, spilling long JSON strings to files."""

    def __init__(self, area: Path):
        self.area = area
        self.token = secrets.token_hex(8)  # placeholders a client cannot forge
        self.line = bytearray()
        self.in_string = False
        self.escape = False
        self.string = bytearray()
        self.spill: IO[bytes] | None = None
        self.spills: list[Path] = []
        self.count = 0

    def placeholder(self, index: int) -> str:
        return f"\x00spill:{self.token}:{index}"

    def feed(self, chunk: bytes) -> Iterator[tuple[bytes, list[Path]]]:
        i, n = 0, len(chunk)
        while i < n:
            if not self.in_string:
                m = _OUTSIDE.search(chunk, i)
                j = n if m is None else m.start()
                self._add_line(chunk[i:j])
                if m is None:
                    return
                if chunk[j] == 0x0A:
                    yield self._end_line()
                else:
                    self.in_string, self.string = True, bytearray()
                i = j + 1
            elif self.escape:
                self._add_escaped(chunk[i])
                self.escape = False
                i += 1
            else:
                m = _INSIDE.search(chunk, i)
                j = n if m is None else m.start()
                self._add_string(chunk[i:j])
                if m is None:
                    return
                if chunk[j] == 0x5C:  # backslash
                    self.escape = True
                else:
                    self._end_string()
                i = j + 1

    def finish(self) -> Iterator[tuple[bytes, list[Path]]]:
        if self.in_string:
            raise BadRequest("Commit payload ends inside a JSON string")
        if self.line.strip():
            yield self._end_line()

    def _add_line(self, data: bytes) -> None:
        self.line += data
        if len(self.line) > SMALL_LINE:
            raise PayloadTooLarge(f"A commit payload line exceeds {SMALL_LINE} bytes")

    def _add_string(self, data: bytes) -> None:
        if self.spill is not None:
            self.spill.write(data)
            return
        self.string += data
        if len(self.string) > SMALL_STRING:
            path = self.area / f"spill-{self.count}"
            self.count += 1
            self.spill = open(path, "wb")  # noqa: SIM115 (closed in _end_string / close)
            self.spills.append(path)
            try:  # what was kept raw (escapes and all) is written out decoded
                self.spill.write(json.loads(b'"' + self.string + b'"').encode())
            except (ValueError, UnicodeError):
                raise BadRequest("Commit payload holds an invalid JSON string") from None
            self.string = bytearray()

    def _add_escaped(self, byte: int) -> None:
        if self.spill is None:
            self._add_string(b"\\" + bytes((byte,)))
            return
        out = _ESCAPES.get(byte)
        if out is None:  # \uXXXX in a long string: no client encodes file contents that way
            raise BadRequest("Commit payload: unsupported escape in a long JSON string")
        self.spill.write(out)

    def _end_string(self) -> None:
        self.in_string = False
        if self.spill is not None:
            self.spill.close()
            self.spill = None
            index = len(self.spills) - 1
            self._add_line(json.dumps(self.placeholder(index)).encode())
        else:
            self._add_line(b'"' + self.string + b'"')
        self.string = bytearray()

    def _end_line(self) -> tuple[bytes, list[Path]]:
        line, self.line = bytes(self.line), bytearray()
        spills, self.spills = self.spills, []
        return line, spills

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()
            self.spill = None


def ndjson_lines(chunks: Iterator[bytes], area: Path) -> Iterator[tuple[int, Any, dict[str, Path]]]:
    """(line number, parsed JSON, {placeholder: spill file}) for each non-blank line.

    Long strings in the parsed value are placeholders; `spilled_content` turns one back into a
    file. Raises BadRequest for a line that is not JSON.
    """
    lexer = _Lexer(area)
    lineno = 0

    def parsed(line: bytes, spills: list[Path]) -> tuple[int, Any, dict[str, Path]]:
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            raise BadRequest(f"Commit payload line {lineno} is not valid JSON") from None
        return lineno, value, {lexer.placeholder(i): p for i, p in enumerate(spills)}

    try:
        for chunk in chunks:
            for line, spills in lexer.feed(chunk):
                lineno += 1
                if line.strip():
                    yield parsed(line, spills)
        for line, spills in lexer.finish():
            lineno += 1
            yield parsed(line, spills)
    finally:
        lexer.close()


def decode_base64_file(source: Path, target: Path) -> None:
    """Base64-decode `source` into `target` in chunks. Raises BadRequest if it is not base64."""
    step = 4 * (CHUNK // 4)
    with open(source, "rb") as src, open(target, "wb") as dst:
        rest, padded = b"", False
        while True:
            data = src.read(step)
            if not data:
                break
            data = rest + data
            cut = len(data) - len(data) % 4
            rest = data[cut:]
            if padded and cut:  # '=' may only end the content
                raise BadRequest("File content is not valid base64 (padding before the end)")
            try:
                dst.write(base64.b64decode(data[:cut], validate=True))
            except (binascii.Error, ValueError):
                raise BadRequest("File content is not valid base64") from None
            padded = data[:cut].endswith(b"=")
        if rest:
            raise BadRequest("File content is not valid base64 (length not a multiple of 4)")
