"""ironctl's JSON: one shape per resource whatever the command (docs/ironctl-json.md).

Every message becomes JSON here only (``to_dict``): every field present under its proto name,
enums spelled as people read them (``running``, never ``SESSION_STATE_RUNNING``), 64-bit
integers as numbers (protobuf's own JSON mapping makes them strings), timestamps as seconds
since the epoch, UTC (null when not set), maps with their keys sorted."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, cast

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

UNKNOWN = "unknown"


def to_dict(message: Message) -> dict[str, Any]:
    """A message as ironctl's JSON shows it."""
    fields = cast("Sequence[FieldDescriptor]", message.DESCRIPTOR.fields)
    return {f.name: _field(f, getattr(message, f.name)) for f in fields}


def print_json(message: Message, **extra: Any) -> None:
    doc = to_dict(message)
    doc.update(extra)
    print(json.dumps(doc, indent=2))


def enum_name(enum: EnumDescriptor, value: int) -> str:
    """An enum value as people read it: ``SESSION_STATE_RUNNING`` of ``SessionState`` is
    ``running``; a number this ironctl does not know is ``unknown``."""
    found = enum.values_by_number.get(value)
    if found is None:
        return UNKNOWN
    prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum.name).lstrip("_") + "_"
    return found.name.removeprefix(prefix).lower()


def is_timestamp(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_DOUBLE and (
        field.name.endswith("_at") or field.name == "timestamp"
    )


def _field(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        shown = field.message_type.fields_by_name["value"]
        return {str(k): _scalar(shown, value[k]) for k in sorted(value)}
    if field.is_repeated:
        return [_scalar(field, v) for v in value]
    return _scalar(field, value)


def _scalar(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return to_dict(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None  # an enum field has its type
        return enum_name(field.enum_type, value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if is_timestamp(field):
        return value or None
    return value
