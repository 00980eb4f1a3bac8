"""Read the structure of a PDF written by Chromium: pages, outline, named destinations, images.

A small reader for what ``tools/build_pdf.py`` and ``tests/test_pdf.py`` need to know
about the book's PDF, without a PDF library (the book's environment has none): it
parses the PDF's objects (indirect objects, dictionaries, arrays, names, strings,
numbers, references), including objects packed in object streams, and answers

* ``pages()``: the page objects in reading order;
* ``outline()``: the bookmarks, as (level, title, page number);
* ``destinations()``: the named destinations (HTML ids) and the page each is on;
* ``image_count()``: the distinct image XObjects (figures, rendered once each);
* ``text_strings()``: the strings of the outline and the document info.

It is not a general PDF parser (no encryption, no incremental updates beyond the last
object definition winning, no content-stream text extraction).
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

_WS = b" \t\r\n\x0c\x00"
_DELIM = b"()<>[]{}/%"
_OBJ = re.compile(rb"(\d+)\s+(\d+)\s+obj\b")


@dataclass(frozen=True)
class Ref:
    num: int
    gen: int = 0


class Name(str):
    """A PDF name (``/Type`` -> ``Name('Type')``)."""


class PDFSyntaxError(ValueError):
    pass


class _Lexer:
    def __init__(self, data: bytes, pos: int = 0):
        self.data, self.pos = data, pos

    def _skip(self) -> None:
        d = self.data
        while self.pos < len(d):
            c = d[self.pos:self.pos + 1]
            if c in (b" ", b"\t", b"\r", b"\n", b"\x0c", b"\x00"):
                self.pos += 1
            elif c == b"%":
                while self.pos < len(d) and d[self.pos:self.pos + 1] not in (b"\r", b"\n"):
                    self.pos += 1
            else:
                return

    def value(self):
        self._skip()
        d, p = self.data, self.pos
        if p >= len(d):
            raise PDFSyntaxError("unexpected end of data")
        c = d[p:p + 1]
        if d.startswith(b"<<", p):
            self.pos += 2
            out = {}
            while True:
                self._skip()
                if self.data.startswith(b">>", self.pos):
                    self.pos += 2
                    return out
                key = self.value()
                if not isinstance(key, Name):
                    raise PDFSyntaxError(f"dictionary key is not a name at {self.pos}")
                out[str(key)] = self.value()
        if c == b"[":
            self.pos += 1
            out = []
            while True:
                self._skip()
                if self.data[self.pos:self.pos + 1] == b"]":
                    self.pos += 1
                    return out
                out.append(self.value())
        if c == b"/":
            end = p + 1
            while end < len(d) and d[end:end + 1] not in _WS and d[end:end + 1] not in _DELIM:
                end += 1
            self.pos = end
            raw = d[p + 1:end]
            raw = re.sub(rb"#([0-9A-Fa-f]{2})", lambda m: bytes([int(m.group(1), 16)]), raw)
            return Name(raw.decode("latin-1"))
        if c == b"(":
            return self._literal_string()
        if c == b"<":
            end = d.index(b">", p)
            self.pos = end + 1
            hexdigits = re.sub(rb"\s+", b"", d[p + 1:end])
            if len(hexdigits) % 2:
                hexdigits += b"0"
            return bytes.fromhex(hexdigits.decode("ascii"))
        m = re.compile(rb"[+-]?(\d+\.?\d*|\.\d+)").match(d, p)
        if m:
            self.pos = m.end()
            # an indirect reference: "12 0 R"
            r = re.compile(rb"\s+(\d+)\s+R\b").match(d, self.pos)
            if r and b"." not in m.group(0):
                self.pos = r.end()
                return Ref(int(m.group(0)), int(r.group(1)))
            text = m.group(0)
            return float(text) if b"." in text else int(text)
        for word, val in ((b"true", True), (b"false", False), (b"null", None)):
            if d.startswith(word, p):
                self.pos += len(word)
                return val
        raise PDFSyntaxError(f"cannot parse {d[p:p + 20]!r} at {p}")

    def _literal_string(self) -> bytes:
        d = self.data
        p = self.pos + 1
        depth, out = 1, bytearray()
        escapes = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f",
                   b"(": b"(", b")": b")", b"\\": b"\\"}
        while p < len(d):
            c = d[p:p + 1]
            if c == b"\\":
                nxt = d[p + 1:p + 2]
                if nxt in escapes:
                    out += escapes[nxt]
                    p += 2
                elif nxt.isdigit():
                    m = re.compile(rb"[0-7]{1,3}").match(d, p + 1)
                    out.append(int(m.group(0), 8) & 0xFF)
                    p = m.end()
                elif nxt in (b"\r", b"\n"):
                    p += 2 if d[p + 1:p + 3] == b"\r\n" else 1
                    p += 1 if nxt == b"\n" or d[p:p + 1] != b"\n" else 0
                else:
                    p += 1
                continue
            if c == b"(":
                depth += 1
            elif c == b")":
                depth -= 1
                if depth == 0:
                    self.pos = p + 1
                    return bytes(out)
            out += c
            p += 1
        raise PDFSyntaxError("unterminated string")


def decode_text(value) -> str:
    """A PDF text string (PDFDocEncoding or UTF-16 with a byte-order mark) as str."""
    if isinstance(value, str):
        return value
    if value.startswith(b"\xfe\xff"):
        return value[2:].decode("utf-16-be", errors="replace")
    if value.startswith(b"\xff\xfe"):
        return value[2:].decode("utf-16-le", errors="replace")
    return value.decode("latin-1")


@dataclass
class Stream:
    dict: dict
    raw: bytes

    def decoded(self) -> bytes:
        filters = self.dict.get("Filter")
        filters = filters if isinstance(filters, list) else [filters] if filters else []
        data = self.raw
        for f in filters:
            if f == "FlateDecode":
                data = zlib.decompress(data)
            else:
                raise PDFSyntaxError(f"unsupported filter {f}")
        return data


class PDF:
    """The objects of one PDF file, looked up by number."""

    def __init__(self, source: bytes | str | Path):
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        if not data.startswith(b"%PDF-"):
            raise PDFSyntaxError("not a PDF file (no %PDF- header)")
        self.data = data
        self.objects: dict[int, object] = {}
        self._scan()
        self.trailer = self._trailer()

    # -------------------------------------------------------------- object table
    def _scan(self) -> None:
        for m in _OBJ.finditer(self.data):
            lex = _Lexer(self.data, m.end())
            try:
                value = lex.value()
            except (PDFSyntaxError, ValueError, IndexError):
                continue
            lex._skip()
            if isinstance(value, dict) and self.data.startswith(b"stream", lex.pos):
                start = lex.pos + len(b"stream")
                if self.data[start:start + 2] == b"\r\n":
                    start += 2
                elif self.data[start:start + 1] in (b"\n", b"\r"):
                    start += 1
                length = value.get("Length")
                if isinstance(length, Ref):
                    length = None  # resolved below, once every object is known
                if isinstance(length, int):
                    raw = self.data[start:start + length]
                else:
                    end = self.data.index(b"endstream", start)
                    raw = self.data[start:end].rstrip(b"\r\n")
                value = Stream(value, raw)
            self.objects[int(m.group(1))] = value
        # objects packed in object streams
        for obj in list(self.objects.values()):
            if isinstance(obj, Stream) and obj.dict.get("Type") == "ObjStm":
                body = obj.decoded()
                n, first = obj.dict["N"], obj.dict["First"]
                header = [int(x) for x in body[:first].split()]
                for i in range(n):
                    num, off = header[2 * i], header[2 * i + 1]
                    self.objects.setdefault(num, _Lexer(body, first + off).value())

    def _trailer(self) -> dict:
        idx = self.data.rfind(b"trailer")
        if idx >= 0:
            return _Lexer(self.data, idx + len(b"trailer")).value()
        for obj in self.objects.values():  # cross-reference stream
            if isinstance(obj, Stream) and obj.dict.get("Type") == "XRef":
                return obj.dict
        raise PDFSyntaxError("no trailer")

    def resolve(self, value):
        seen = 0
        while isinstance(value, Ref):
            value = self.objects.get(value.num)
            seen += 1
            if seen > 32:
                raise PDFSyntaxError("reference loop")
        return value

    # ---------------------------------------------------------------- structure
    @property
    def catalog(self) -> dict:
        return self.resolve(self.trailer["Root"])

    def pages(self) -> list[int]:
        """Object numbers of the pages, in reading order."""
        out: list[int] = []

        def walk(ref, depth=0):
            node = self.resolve(ref)
            node = node.dict if isinstance(node, Stream) else node
            if node.get("Type") == "Pages" or "Kids" in node:
                for kid in node.get("Kids", []):
                    walk(kid, depth + 1)
            else:
                out.append(ref.num)

        walk(self.catalog["Pages"])
        return out

    def page_number(self, ref) -> int | None:
        """1-based page number of a page reference (None if it is not a page)."""
        if not hasattr(self, "_page_index"):
            self._page_index = {num: i + 1 for i, num in enumerate(self.pages())}
        return self._page_index.get(ref.num) if isinstance(ref, Ref) else None

    def _dest_page(self, dest) -> int | None:
        dest = self.resolve(dest)
        if isinstance(dest, dict):
            dest = self.resolve(dest.get("D"))
        if isinstance(dest, list) and dest:
            return self.page_number(dest[0])
        return None

    def destinations(self) -> dict[str, int]:
        """Named destinations (Chromium writes one per HTML id) -> 1-based page number."""
        out: dict[str, int] = {}
        dests = self.resolve(self.catalog.get("Dests"))
        if isinstance(dests, dict):
            for name, dest in dests.items():
                page = self._dest_page(dest)
                if page is not None:
                    out[name] = page
        names = self.resolve(self.catalog.get("Names"))
        tree = self.resolve(names.get("Dests")) if isinstance(names, dict) else None

        def walk(node):
            node = self.resolve(node)
            pairs = node.get("Names", [])
            for i in range(0, len(pairs) - 1, 2):
                page = self._dest_page(pairs[i + 1])
                if page is not None:
                    out[decode_text(pairs[i])] = page
            for kid in node.get("Kids", []):
                walk(kid)

        if isinstance(tree, dict):
            walk(tree)
        return out

    def outline_items(self) -> list[tuple[int, int, dict]]:
        """The bookmark objects in order: (level, object number, dictionary)."""
        out: list[tuple[int, int, dict]] = []
        root = self.resolve(self.catalog.get("Outlines"))

        def walk(ref, level):
            guard = 0
            while isinstance(ref, Ref) and guard < 100000:
                item = self.resolve(ref)
                out.append((level, ref.num, item))
                if "First" in item:
                    walk(item["First"], level + 1)
                ref = item.get("Next")
                guard += 1

        if isinstance(root, dict) and "First" in root:
            walk(root["First"], 1)
        return out

    def outline(self) -> list[tuple[int, str, int | None]]:
        """The bookmarks in order: (level, title, 1-based page number or None)."""
        out = []
        for level, _, item in self.outline_items():
            page = self._dest_page(item["Dest"]) if "Dest" in item else None
            if page is None and isinstance(self.resolve(item.get("A")), dict):
                page = self._dest_page(self.resolve(item["A"]).get("D"))
            out.append((level, decode_text(item.get("Title", b"")), page))
        return out

    def image_count(self) -> int:
        """Distinct colour images (a picture used twice is stored once).

        Grey-scale images are left out: Chromium stores the transparency of a picture and
        the blur of a shadow as grey soft masks, which are not pictures of their own.
        """
        images = {num: obj for num, obj in self.objects.items()
                  if isinstance(obj, Stream) and obj.dict.get("Subtype") == "Image"}
        masks = {obj.dict["SMask"].num for obj in images.values() if isinstance(obj.dict.get("SMask"), Ref)}
        return sum(1 for num, obj in images.items() if num not in masks
                   and self.resolve(obj.dict.get("ColorSpace")) != "DeviceGray"
                   and obj.dict.get("Width", 0) > 1 and obj.dict.get("Height", 0) > 1)

    def info(self) -> dict[str, str]:
        info = self.resolve(self.trailer.get("Info"))
        return {k: decode_text(v) for k, v in info.items()} if isinstance(info, dict) else {}


# ---------------------------------------------------------------- writing (an update)
def _serialise(value) -> bytes:
    if isinstance(value, Name):
        return b"/" + re.sub(rb"[^!-~]|[#()<>\[\]{}/%]", lambda m: b"#%02X" % m.group(0)[0],
                             str(value).encode("latin-1"))
    if isinstance(value, Ref):
        return b"%d %d R" % (value.num, value.gen)
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if value is None:
        return b"null"
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, float):
        return (b"%.6f" % value).rstrip(b"0").rstrip(b".")
    if isinstance(value, (bytes, bytearray)):
        return b"<" + bytes(value).hex().upper().encode("ascii") + b">"
    if isinstance(value, str):
        return _serialise(encode_text(value))
    if isinstance(value, list):
        return b"[" + b" ".join(_serialise(v) for v in value) + b"]"
    if isinstance(value, dict):
        return b"<<" + b"".join(_serialise(Name(k)) + b" " + _serialise(v) + b"\n" for k, v in value.items()) + b">>"
    raise TypeError(f"cannot write {type(value).__name__} into a PDF")


def encode_text(text: str) -> bytes:
    """A Python string as a PDF text string (UTF-16 with a byte-order mark)."""
    return b"\xfe\xff" + text.encode("utf-16-be")


def update_objects(data: bytes, changed: dict[int, dict]) -> bytes:
    """``data`` with new versions of some dictionary objects, appended as an incremental update.

    The original bytes stay as they are; a new cross-reference section names the new
    objects and points back at the old one (``/Prev``), as PDF readers expect.
    """
    if not changed:
        return data
    pdf = PDF(data)
    m = list(re.finditer(rb"startxref\s+(\d+)", data))
    if not m:
        raise PDFSyntaxError("no startxref")
    prev = int(m[-1].group(1))
    out = bytearray(data)
    if not out.endswith(b"\n"):
        out += b"\n"
    offsets = {}
    for num in sorted(changed):
        offsets[num] = len(out)
        out += b"%d 0 obj\n" % num + _serialise(changed[num]) + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n"
    for num in sorted(offsets):
        out += b"%d 1\n%010d 00000 n\r\n" % (num, offsets[num])
    trailer = {k: v for k, v in pdf.trailer.items() if k in ("Root", "Info", "ID")}
    trailer["Size"] = max(int(pdf.trailer.get("Size", 0)), max(offsets) + 1)
    trailer["Prev"] = prev
    out += b"trailer\n" + _serialise(trailer) + b"\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


if __name__ == "__main__":  # pragma: no cover - a small command-line summary
    import sys

    pdf = PDF(sys.argv[1])
    print(f"pages: {len(pdf.pages())}, images: {pdf.image_count()}, "
          f"destinations: {len(pdf.destinations())}")
    for level, title, page in pdf.outline():
        if level <= 2:
            print(f"{'  ' * (level - 1)}{title} .... {page}")
