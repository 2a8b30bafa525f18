"""The credential values to mask in what returns to a session: its agent's own, and only those."""

from __future__ import annotations

from ironclawd.domain.agents import AgentSpec, own_credentials
from ironclawd.errors import IronclawError
from ironclawd.ports import Credentials


def own_secrets(credentials: Credentials, spec: AgentSpec, *, besides: str = "") -> list[str]:
    """The values of the credentials a session of ``spec`` may cause to be used
    (``own_credentials``), in name order; one not there or unreadable is left out (nothing of it
    can be used, or returned). Masking every credential on the host told an agent which of its
    guesses was another agent's: a reflected guess came back ``[REDACTED]``. ``besides``: a
    name whose value the caller holds already (not read again)."""
    values = []
    for name in sorted(own_credentials(spec) - {besides}):
        try:
            values.append(credentials.get(name))
        except IronclawError:
            continue
    return values
