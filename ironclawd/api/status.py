"""ironclawd's errors as gRPC status codes: the table is ``errors.GRPC_STATUS`` (docs/style.md §6);
this adapter turns its status names into ``grpc.StatusCode``."""

from __future__ import annotations

import grpc

from ironclawd.errors import IronclawError, grpc_status


def code_for(exc: IronclawError) -> grpc.StatusCode:
    return grpc.StatusCode[grpc_status(exc)]
