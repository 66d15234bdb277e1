"""Reading UTF-8 text for every data reader: invalid bytes are reported by file, line and column (never by a byte
offset inside a read chunk), and a leading byte-order mark (some official GLUE downloads have one) is dropped.
Writing it atomically for every file a run leaves (`write_text_atomic`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from dietpe.errors import DataError

BOM = "\ufeff"


def utf8_error(path: str | Path, data: bytes, e: UnicodeDecodeError, first_line: int = 1) -> DataError:
    """A DataError naming file:line and the column of the first invalid byte of `data` (which starts at
    `first_line`)."""
    line = first_line + data.count(b"\n", 0, e.start)
    column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
    return DataError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}: {e.reason}); "
                     f"convert the file to UTF-8")


def decode(data: bytes, path: str | Path) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise utf8_error(path, data, e) from None
    return text[1:] if text.startswith(BOM) else text


def read_bytes(path: str | Path) -> bytes:
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a file") from None


def read_text(path: str | Path) -> str:
    """The whole file as text, checked; without a leading byte-order mark."""
    return decode(read_bytes(path), path)


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of a file, decoded one at a time (for corpora too large to hold twice), ends kept as read
    (`\\n` or `\\r\\n`); a leading byte-order mark is dropped. Invalid UTF-8 raises DataError with file:line."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a file") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise utf8_error(path, raw, e, lineno) from None
            if lineno == 1 and line.startswith(BOM):
                line = line[1:]
            yield line


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write UTF-8 text to a temporary file beside `path` and rename it: a reader (or a rerun after a kill)
    sees the old file or the new one, never half of it. Creates the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
