"""``ironclaw.admin.v1.AdminService``: the operator's API."""

from __future__ import annotations

import os
import time
from typing import Any

import grpc

from ironclaw.admin.v1 import admin_pb2, admin_pb2_grpc
from ironclawd import __version__
from ironclawd.api.auth import current_caller
from ironclawd.domain.checks import CheckResult, Status
from ironclawd.services.doctor import Doctor

_STATUS = {
    Status.PASS: admin_pb2.CHECK_STATUS_PASS,
    Status.WARN: admin_pb2.CHECK_STATUS_WARN,
    Status.FAIL: admin_pb2.CHECK_STATUS_FAIL,
    Status.SKIP: admin_pb2.CHECK_STATUS_SKIP,
}


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, doctor: Doctor, config_source: str, started: float) -> None:
        self._doctor = doctor
        self._config_source = config_source
        self._started = started
        self.state = "running"

    async def GetStatus(
        self,
        request: admin_pb2.GetStatusRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_pb2.GetStatusResponse:
        caller = current_caller()
        return admin_pb2.GetStatusResponse(
            version=__version__,
            uptime_seconds=time.monotonic() - self._started,
            caller=admin_pb2.Caller(
                uid=caller.uid, gid=caller.gid, pid=caller.pid, user_name=caller.user_name
            ),
            config_path=self._config_source,
            pid=os.getpid(),
            state=self.state,
        )

    async def Doctor(
        self,
        request: admin_pb2.DoctorRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> admin_pb2.DoctorResponse:
        results = await self._doctor.run()
        return admin_pb2.DoctorResponse(checks=[_to_proto(r) for r in results])


def _to_proto(result: CheckResult) -> admin_pb2.Check:
    return admin_pb2.Check(
        name=result.name,
        status=_STATUS[result.status],
        detail=result.detail,
        fix_hint=result.fix_hint,
        required=result.required,
        duration_seconds=result.duration_seconds,
    )
