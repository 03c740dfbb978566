"""A Snapshot as proto JSON, byte for byte what `json_format.MessageToJson` prints
(snake_case names, every field, indent 2), at a fraction of its cost.

`json_format`'s printer builds a dict per message in pure Python and then
indents it with the pure-Python JSON encoder (`indent` turns off the C one):
1-2 ms for a snapshot of 8 nodes with nothing in flight, ~15 µs more per
in-flight entry. The controller writes one per finished snapshot, on the writer
thread, holding the GIL the event loop needs. Here the text is written directly,
following the printer's rules:

- the fields `ListFields` returns (the set ones, in field-number order) come
  first, then every field without presence still at its default, in declaration
  order; unset message fields are left out;
- int64/uint64 as quoted decimals, enums by name, doubles as `repr` (infinities
  and NaN as strings), strings through the JSON encoder's own ASCII escaper,
  bytes as standard base64 (an app's state: one C-level pass, where the printer
  builds a dict and runs the pure-Python encoder over it, ~5 s at 256 MiB),
  Timestamps as their `ToJsonString()`;
- `json.dumps(indent=2)`'s layout: one item per line, `[]`/`{}` when empty.

Channels, nodes and in-flight entries, the bulk of a snapshot, have shortcuts for
the shapes real snapshots have (every field set), made from their descriptors
(`_Flat`), so they print whatever scalar fields the messages have; anything else
goes through the general rules, and anything those do not cover (maps,
floats, other well-known types) raises `_Unsure` and the printer itself renders
the snapshot.
`tests/shells/test_controller_export.py` pins the text to the printer's.
"""

from __future__ import annotations

import base64
import binascii
import math
from functools import partial
from itertools import chain
from json.encoder import encode_basestring_ascii as _quote
from operator import attrgetter

from google.protobuf import descriptor, json_format

from snapmesh.checking import snapshot_file
from snapmesh.v1 import snapmesh_pb2 as pb

_FD = descriptor.FieldDescriptor
_B64 = partial(binascii.b2a_base64, newline=False)  # base64.b64encode's, called from C (`_list`)
_MESSAGE = _FD.CPPTYPE_MESSAGE
_INT64 = (_FD.CPPTYPE_INT64, _FD.CPPTYPE_UINT64)
_INT32 = (_FD.CPPTYPE_INT32, _FD.CPPTYPE_UINT32)
_TIMESTAMP = "google.protobuf.Timestamp"
_CHANNEL = pb.ChannelState.DESCRIPTOR
_NODE = pb.NodeBalance.DESCRIPTOR
_BULK = 4  # entries from which the bulk path is cheaper (its fixed cost is ~2 entries' worth)
# What json.encoder escapes even in ASCII: control characters, quote, backslash, DEL.
_ESCAPED = bytes(range(0x20)) + b'"\\\x7f'
_PADS = tuple("\n" + "  " * level for level in range(16))


class _Unsure(Exception):
    """A field the rules here do not cover: the printer renders the snapshot."""


class _Flat:
    """The shortcut for a message whose fields without presence, and the optional
    ones named `present`, are strings and 64-bit integers, read from its descriptor:
    when every one of them is set (an optional one to a value other than its
    default) and no other field with presence is, the printer prints exactly those,
    in field-number order, so one %-template prints the message (`values` reads
    them in one call)."""

    def __init__(self, desc, present: tuple[str, ...] = ()) -> None:
        fields = sorted((f for f in desc.fields if not f.has_presence or f.name in present), key=lambda f: f.number)
        if len(fields) < 2:  # attrgetter of one name gives a value, not a tuple
            raise TypeError(f"{desc.full_name}: fewer than two fields without presence")
        for f in fields:
            if f.is_repeated or f.type == _FD.TYPE_BYTES or f.cpp_type not in (_FD.CPPTYPE_STRING, *_INT64):
                raise TypeError(f"{f.full_name}: not a string or a 64-bit integer")
        self.names = tuple(f.name for f in fields)
        self.strings = tuple(i for i, f in enumerate(fields) if f.cpp_type == _FD.CPPTYPE_STRING)
        self.optional = tuple(f.name for f in desc.fields if f.has_presence and f.name not in present)
        self.values = attrgetter(*self.names)
        self.width, self.indices = len(fields), range(len(fields))
        self._templates: dict[tuple[str, str, str], str] = {}

    def template(self, inner: str, close: str, string: str = "%s") -> str:
        """The message's text with a %-slot per field: `string` for a string (its
        value quoted, or "%s" between quotes for one known to need no escape), a
        quoted decimal for an integer. Made once per indent (a snapshot has a few)."""
        key = (inner, close, string)
        found = self._templates.get(key)
        if found is None:
            slots = [string if i in self.strings else '"%d"' for i in range(len(self.names))]
            fields = ",".join(f'{inner}"{name}": {slot}' for name, slot in zip(self.names, slots, strict=True))
            found = self._templates[key] = "{" + fields + close + "}"
        return found

    def text(self, message, level: int) -> str | None:
        """The message at `level` by the template, or None when it has another shape."""
        values = self.values(message)
        if not all(values) or any(map(message.HasField, self.optional)):
            return None
        quoted = list(values)
        for i in self.strings:
            quoted[i] = _quote(quoted[i])
        return self.template(_pad(level + 1), _pad(level)) % tuple(quoted)


# Field 2 of each, the v1 figure an app's adapter fills (optional: absent for an app
# without one, snapmesh/protocol/controller/v1fields.py), is in the shape it has.
_NODES = _Flat(_NODE, present=(_NODE.fields_by_number[2].name,))
_ITEMS = _Flat(pb.InFlightTransfer.DESCRIPTOR, present=(pb.InFlightTransfer.DESCRIPTOR.fields_by_number[2].name,))


def printed(message) -> str:
    """The reference rendering: protobuf's own printer."""
    return json_format.MessageToJson(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def snapshot_json(snapshot: pb.Snapshot, checksum: str = "") -> str:
    """The export; with `checksum`, the top-level checksum field (when empty)
    shows it: what `snapshot_file.sealed_json` makes of the export, in one pass."""
    if checksum and snapshot.checksum:  # never the store's case (it seals unsealed copies)
        return snapshot_file.sealed_json(snapshot_json(snapshot), checksum)
    out: list[str] = []
    try:
        _message(snapshot, 0, out, checksum)
    except (_Unsure, ValueError):  # ValueError: a Timestamp out of range, the printer says so its way
        text = printed(snapshot)
        return snapshot_file.sealed_json(text, checksum) if checksum else text
    return "".join(out)


def _pad(level: int) -> str:
    """The line break and indent before an item at `level`."""
    return _PADS[level] if level < len(_PADS) else "\n" + "  " * level


def _message(message, level: int, out: list[str], checksum: str = "") -> None:
    """Append `message` at nesting `level` to `out`: its opening brace goes where
    `out` ends, its fields one level deeper. One list for the whole text, joined
    once: a large snapshot is megabytes, and each concatenation would copy it."""
    desc = message.DESCRIPTOR
    if desc.full_name == _TIMESTAMP:
        out.append(_quote(message.ToJsonString()))
        return
    if desc.file.package == "google.protobuf":  # other well-known types print their own way
        raise _Unsure(desc.full_name)
    inner = level + 1
    sep = _pad(inner)
    listed = set()
    first = True
    for field, value in message.ListFields():
        if field.is_extension:
            raise _Unsure(field.full_name)
        listed.add(field.number)
        out.append(f'{"{" if first else ","}{sep}"{field.name}": ')
        first = False
        cpp = field.cpp_type
        if field.is_repeated:
            _list(field, value, inner, out)
        elif cpp == _MESSAGE:
            _message(value, inner, out)
        else:
            out.append(_text(field, cpp, value))
    for number, name, default in _defaults(desc):
        if number in listed:
            continue
        out.append(f'{"{" if first else ","}{sep}"{name}": ')
        first = False
        out.append(f'"{checksum}"' if checksum and level == 0 and name == "checksum" else default)  # as sealed_json has it
    out.append("{}" if first else _pad(level) + "}")


_DEFAULTS: dict = {}


def _defaults(desc) -> tuple[tuple[int, str, str], ...]:
    """(number, name, default value as printed) of each field without presence
    (the ones printed even when unset), in declaration order; once per type."""
    found = _DEFAULTS.get(desc)
    if found is None:
        found = _DEFAULTS[desc] = tuple(
            (f.number, f.name, "[]" if _repeated(f) else _text(f, f.cpp_type, f.default_value))
            for f in desc.fields if not f.has_presence
        )
    return found


def _repeated(field) -> bool:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        raise _Unsure(field.full_name)
    return field.is_repeated


def _list(field, value, level: int, out: list[str]) -> None:
    _repeated(field)  # a map: not covered
    if not value:  # (ListFields lists no empty one)
        out.append("[]")
        return
    if field.message_type is _CHANNEL:
        _channels(value, level, out)
        return
    inner = level + 1
    sep = "," + _pad(inner)
    cpp = field.cpp_type
    if cpp == _FD.CPPTYPE_STRING and field.type == _FD.TYPE_BYTES:  # as `_text` prints each, joined in C:
        joint = ('"' + sep + '"').encode("ascii")  # a manifest is 8192 hashes for 64 MiB
        out.append("[" + _pad(inner) + '"' + joint.join(map(_B64, value)).decode("ascii") + '"' + _pad(level) + "]")
        return
    out.append("[" + _pad(inner))
    for i, v in enumerate(value):
        if i:
            out.append(sep)
        if field.message_type is _NODE:
            _node(v, inner, out)
        elif cpp == _MESSAGE:
            _message(v, inner, out)
        else:
            out.append(_text(field, cpp, v))
    out.append(_pad(level) + "]")


def _text(field, cpp: int, value) -> str:
    if cpp == _FD.CPPTYPE_STRING:
        if field.type == _FD.TYPE_BYTES:  # the printer's way: standard base64, padded (never escaped)
            return '"' + base64.b64encode(value).decode("ascii") + '"'
        return _quote(value)
    if cpp in _INT64:
        return f'"{value}"'
    if cpp == _FD.CPPTYPE_BOOL:
        return "true" if value else "false"
    if cpp in _INT32:
        return str(int(value))
    if cpp == _FD.CPPTYPE_ENUM:
        enum = field.enum_type
        if enum.full_name == "google.protobuf.NullValue":
            raise _Unsure(field.full_name)
        named = enum.values_by_number.get(value)
        if named is not None and not named.has_options:
            return _quote(named.name)
        if named is None and not enum.is_closed:
            return str(int(value))
        raise _Unsure(field.full_name)
    if cpp == _FD.CPPTYPE_DOUBLE:
        if math.isinf(value):
            return '"-Infinity"' if value < 0 else '"Infinity"'
        return '"NaN"' if math.isnan(value) else float.__repr__(value)
    raise _Unsure(field.full_name)  # float (its shortest form), or a type added later


def _node(node: pb.NodeBalance, level: int, out: list[str]) -> None:
    # A field at its default would print after the set ones (an app's state, bytes, among them).
    text = _NODES.text(node, level)
    if text is None:
        _message(node, level, out)
    else:
        out.append(text)


def _channels(channels, level: int, out: list[str]) -> None:
    """A list of channels at `level`, each on its own lines at `level + 1`."""
    item, field, entry = _pad(level + 1), _pad(level + 2), _pad(level + 3)
    close = item + "}"
    for i, channel in enumerate(channels):
        out.append(("," if i else "[") + item)
        src, dst = channel.src, channel.dst
        if not (src and dst):  # a channel with an empty src or dst prints its fields in another order
            _message(channel, level + 1, out)
            continue
        head = f'{{{field}"src": {_quote(src)},{field}"dst": {_quote(dst)},{field}"in_flight": '
        entries = channel.in_flight
        if entries:
            out.append(head)
            out.append(_in_flight(entries, field, entry))
            out.append(close)
        else:
            out.append(head + "[]" + close)
    out.append(_pad(level) + "]")


def _in_flight(entries, pad: str, item: str) -> str:
    """A channel's in-flight entries (the list's closing bracket on `pad`, each entry
    opening on `item`). From _BULK entries on, when they are the usual ones (every
    field set, plain ASCII msg_ids), their columns are read in one C-level pass and
    formatted by one %-format over the whole channel; otherwise entry by entry."""
    if len(entries) >= _BULK:
        # An entry with another field with presence (an app's payload) is not this shape.
        flat = tuple(chain.from_iterable(map(_ITEMS.values, entries)))
        columns = [flat[k::_ITEMS.width] for k in _ITEMS.indices]
        if (all(map(all, columns)) and all(_plain("".join(columns[k])) for k in _ITEMS.strings)
                and not any(t.HasField(name) for t in entries for name in _ITEMS.optional)):
            template = _ITEMS.template(item + "  ", item, string='"%s"')
            return "[" + item + ("," + item).join([template] * len(entries)) % flat + pad + "]"
    level = (len(item) - 1) // 2  # item is "\n" and two spaces a level
    return "[" + item + ("," + item).join([_entry(t, level) for t in entries]) + pad + "]"


def _plain(text: str) -> bool:
    """Whether the JSON encoder would print `text` as it is between the quotes:
    ASCII (an O(1) flag of the string), with none of the bytes it escapes."""
    if not text.isascii():
        return False
    data = text.encode("ascii")
    return len(data.translate(None, _ESCAPED)) == len(data)


def _entry(t: pb.InFlightTransfer, level: int) -> str:
    text = _ITEMS.text(t, level)
    if text is None:  # fields at their default print after the others
        out: list[str] = []
        _message(t, level, out)
        return "".join(out)
    return text
