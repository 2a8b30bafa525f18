"""``ironctl api ...``: the admin API itself, found through gRPC server reflection.

Debian has no grpcurl; this is its path on the admin socket. The daemon describes its services
(grpc_reflection's ProtoReflectionDescriptorDatabase feeds a DescriptorPool), requests are built
from JSON and replies printed as JSON (protobuf's json_format). Nothing is checked here that the
daemon does not check again: every call, reflection included, passes the daemon's
kernel-derived identity check (docs/admin-identity.md) like any other ironctl command.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pb2, json_format, message_factory
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    MethodDescriptor,
    ServiceDescriptor,
)
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import Message
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from ironclawd.ctl import exitcodes, wire
from ironclawd.ctl.common import CtlError, read_stdin

if TYPE_CHECKING:
    from ironclawd.ctl.common import Stub

_SCALARS = {
    FieldDescriptor.TYPE_DOUBLE: "double", FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_INT64: "int64", FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_INT32: "int32", FieldDescriptor.TYPE_FIXED64: "fixed64",
    FieldDescriptor.TYPE_FIXED32: "fixed32", FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_STRING: "string", FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_UINT32: "uint32", FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    FieldDescriptor.TYPE_SFIXED64: "sfixed64", FieldDescriptor.TYPE_SINT32: "sint32",
    FieldDescriptor.TYPE_SINT64: "sint64",
}  # fmt: skip


@dataclass
class Reflected:
    """What the daemon says it serves, looked up lazily over one channel."""

    channel: grpc.Channel
    database: Any  # ProtoReflectionDescriptorDatabase (grpc_reflection ships no types)
    pool: DescriptorPool
    pinned: int  # the socket file's O_PATH descriptor, which the channel connects through

    def services(self) -> list[ServiceDescriptor]:
        return [self.pool.FindServiceByName(name) for name in sorted(self.database.get_services())]

    def methods(self) -> list[MethodDescriptor]:
        return [m for s in self.services() for m in s.methods]

    def close(self) -> None:
        self.channel.close()
        os.close(self.pinned)  # after the channel: no connect of its own names a closed fd


def open_reflection(socket_path: str, timeout: float | None = None) -> Reflected:
    # grpcio takes no connected socket: it connects by name, at the first call and again after
    # a connection ends. Checking who holds the socket on a connection of ironctl's own and then
    # handing grpcio the name let whoever controls the name (a symlink in sticky /tmp, the very
    # --socket the check is for) point it at ironclawd's socket for the check and at theirs for
    # grpcio. So the socket file is pinned first: an O_PATH descriptor (open(2)), held for the
    # channel's life. The check (wire.open_admin_socket: root or you) and every connect of
    # grpcio's go through /proc/self/fd/N, which reaches that inode whatever the name says by
    # then (proc(5)). The inode is one listener's for good (bind(2) makes a new one, and fails
    # on a name that exists), and SO_PEERCRED reports who listened (unix(7)): checked once, it
    # holds for every later connect. A subchannel pool of the channel's own: no connection
    # that another channel of this process made to the same /proc/self/fd/N (another inode,
    # the number reused) is shared with this one.
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        pinned = os.open(socket_path, os.O_PATH | os.O_CLOEXEC)
    except OSError as err:
        raise wire.RpcError(
            wire.StatusCode.UNAVAILABLE,
            f"connect to unix:{socket_path}: {err.strerror or err}",
            transport=True,
        ) from None
    try:
        through = f"/proc/self/fd/{pinned}"  # 24 bytes at most: well within sun_path's 108
        wire.open_admin_socket(through, deadline, shown=socket_path).close()
        options = [("grpc.use_local_subchannel_pool", 1)]
        channel = grpc.insecure_channel(f"unix:{through}", options=options)
    except BaseException:
        os.close(pinned)
        raise
    database = ProtoReflectionDescriptorDatabase(channel)
    return Reflected(channel, database, DescriptorPool(database), pinned)


def method_matches(method_full_name: str, wanted: str) -> bool:
    """Whether ``wanted`` names the method ``pkg.Service.Method``: in full, as a gRPC path
    (``/pkg.Service/Method``), as ``Service.Method``, or as the bare method name."""
    name = wanted.strip().lstrip("/").replace("/", ".")
    return bool(name) and (method_full_name == name or method_full_name.endswith("." + name))


def find_method(methods: list[MethodDescriptor], wanted: str) -> MethodDescriptor:
    found = [m for m in methods if method_matches(m.full_name, wanted)]
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(m.full_name for m in found)
        message = f"'{wanted}' names more than one method: {names}; give the full name"
        raise CtlError("AMBIGUOUS_METHOD", exitcodes.USAGE, message)
    raise _unknown("method", wanted, [m.full_name for m in methods])


def _unknown(what: str, wanted: str, known: list[str]) -> CtlError:
    short = {n.rsplit(".", 1)[-1]: n for n in known}
    near = difflib.get_close_matches(wanted, [*known, *short], n=1)
    hint = f"; did you mean {short.get(near[0], near[0])}?" if near else ""
    return CtlError("UNKNOWN_METHOD" if what == "method" else "UNKNOWN_SYMBOL", exitcodes.NOT_FOUND,
                    f"unknown {what} '{wanted}'{hint} (ironctl api list shows what the daemon "
                    "serves)")  # fmt: skip


def request_from_json(method: MethodDescriptor, text: str) -> Message:
    """The request message for ``method`` from JSON text; a bad document names the field."""
    if method.client_streaming:
        kind = "bidirectional" if method.server_streaming else "client-streaming"
        raise CtlError(
            "UNSUPPORTED_METHOD",
            exitcodes.USAGE,
            f"{method.full_name} is {kind} (it reads a stream of requests); ironctl api call "
            "sends exactly one request, so only unary and server-streaming methods can be called",
        )
    request = message_factory.GetMessageClass(method.input_type)()
    try:
        json_format.Parse(text, request)
    except json_format.ParseError as exc:
        detail = " ".join(str(exc).split())
        raise CtlError("INVALID_INPUT", exitcodes.INVALID,
                       f"request JSON for {method.name} ({method.input_type.full_name}): "
                       f"{detail}") from None  # fmt: skip
    return request


def reply_to_dict(message: Message) -> dict[str, Any]:
    """A reply as protobuf's canonical JSON, with the .proto's field names and every field."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def field_line(field: FieldDescriptor) -> str:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return f"map<{_type_name(key)}, {_type_name(value)}> {field.name} = {field.number};"
    label = "repeated " if field.is_repeated else ""
    oneof = field.containing_oneof
    if oneof is not None and oneof.name.startswith("_") and len(oneof.fields) == 1:
        label = "optional "  # proto3 optional: a synthetic oneof of one field
    return f"{label}{_type_name(field)} {field.name} = {field.number};"


def _type_name(field: FieldDescriptor) -> str:
    if field.message_type is not None:
        return str(field.message_type.full_name)
    if field.enum_type is not None:
        return str(field.enum_type.full_name)
    return _SCALARS[field.type]


def rpc_line(method: MethodDescriptor) -> str:
    inp = ("stream " if method.client_streaming else "") + method.input_type.full_name
    out = ("stream " if method.server_streaming else "") + method.output_type.full_name
    return f"rpc {method.name}({inp}) returns ({out});"


def describe_service(service: ServiceDescriptor) -> str:
    rows = "".join(f"  {rpc_line(m)}\n" for m in service.methods)
    return f"service {service.full_name} {{\n{rows}}}"


def describe_message(message: Descriptor) -> str:
    rows = "".join(f"  {field_line(f)}\n" for f in message.fields)
    return f"message {message.full_name} {{\n{rows}}}"


def describe_enum(enum: EnumDescriptor) -> str:
    rows = "".join(f"  {v.name} = {v.number};\n" for v in enum.values)
    return f"enum {enum.full_name} {{\n{rows}}}"


def describe_method(method: MethodDescriptor) -> str:
    template = json.dumps(reply_to_dict(message_factory.GetMessageClass(method.input_type)()))
    return "\n".join(
        (
            f"{method.containing_service.full_name}.{method.name}",
            rpc_line(method),
            "",
            describe_message(method.input_type),
            "",
            describe_message(method.output_type),
            "",
            f"request JSON (defaults): {template}",
        )
    )


def _lookup(reflected: Reflected, symbol: str) -> tuple[str, Any]:
    """(kind, descriptor) for a service, method, message or enum name."""
    name = symbol.strip().lstrip("/").replace("/", ".")
    finders = (
        ("service", reflected.pool.FindServiceByName),
        ("message", reflected.pool.FindMessageTypeByName),
        ("enum", reflected.pool.FindEnumTypeByName),
    )
    for kind, finder in finders:
        try:
            return kind, finder(name)
        except KeyError:
            continue
    services = reflected.services()
    by_short = [s for s in services if s.name == name]
    if len(by_short) == 1:
        return "service", by_short[0]
    methods = [m for s in services for m in s.methods]
    if any(method_matches(m.full_name, name) for m in methods):
        return "method", find_method(methods, name)
    known = [s.full_name for s in services] + [m.full_name for m in methods]
    raise _unknown("service, method or type", symbol, known)


def _descriptor_dict(kind: str, desc: Any) -> dict[str, Any]:
    protos: dict[str, type[Message]] = {
        "service": descriptor_pb2.ServiceDescriptorProto,
        "method": descriptor_pb2.MethodDescriptorProto,
        "message": descriptor_pb2.DescriptorProto,
        "enum": descriptor_pb2.EnumDescriptorProto,
    }
    proto = protos[kind]()
    desc.CopyToProto(proto)
    return {"kind": kind, "full_name": desc.full_name, "descriptor": reply_to_dict(proto)}


def cmd_list(args: argparse.Namespace, _stub: Stub) -> int:
    reflected = open_reflection(args.socket, args.timeout)
    try:
        if not args.service:
            names = sorted(reflected.database.get_services())
            doc: dict[str, Any] = {"services": names}
        else:
            services = reflected.services()
            match = [s for s in services if args.service in (s.full_name, s.name)]
            if not match:
                raise _unknown("service", args.service, [s.full_name for s in services])
            names = [m.full_name for m in match[0].methods]
            doc = {"service": match[0].full_name, "methods": names}
    finally:
        reflected.close()
    print(json.dumps(doc, indent=2) if args.json else "\n".join(names))
    return exitcodes.OK


def cmd_describe(args: argparse.Namespace, _stub: Stub) -> int:
    reflected = open_reflection(args.socket, args.timeout)
    try:
        kind, desc = _lookup(reflected, args.symbol)
        if args.json:
            print(json.dumps(_descriptor_dict(kind, desc), indent=2))
            return exitcodes.OK
        describers: dict[str, Callable[[Any], str]] = {
            "service": describe_service,
            "method": describe_method,
            "message": describe_message,
            "enum": describe_enum,
        }
        text = describers[kind](desc)
    finally:
        reflected.close()
    print(text)
    return exitcodes.OK


def cmd_call(args: argparse.Namespace, _stub: Stub) -> int:
    reflected = open_reflection(args.socket, args.timeout)
    try:
        method = find_method(reflected.methods(), args.method)
        text = read_stdin() if args.request == "-" else args.request
        request = request_from_json(method, text)
        path = f"/{method.containing_service.full_name}/{method.name}"
        reply_class = message_factory.GetMessageClass(method.output_type)
        kwargs: dict[str, Any] = {
            "request_serializer": type(request).SerializeToString,
            "response_deserializer": reply_class.FromString,
        }
        if not method.server_streaming:
            reply = reflected.channel.unary_unary(path, **kwargs)(request, timeout=args.timeout)
            print(json.dumps(reply_to_dict(reply), indent=2))
            return exitcodes.OK
        # A stream that follows (session logs, replies) runs until Ctrl-C, as ironctl's own
        # --follow commands do; any other stream is bounded by --timeout.
        follows = any(f.name == "follow" and v is True for f, v in request.ListFields())
        timeout = None if follows else args.timeout
        for reply in reflected.channel.unary_stream(path, **kwargs)(request, timeout=timeout):
            print(json.dumps(reply_to_dict(reply)), flush=True)
        return exitcodes.OK
    finally:
        reflected.close()
