"""journald MESSAGE_IDs for the events an operator acts on.

Each is a fixed 128-bit id (``journalctl MESSAGE_ID=...`` finds every occurrence, whatever the
wording of the line) explained, with what to do, in ``units/ironclaw.catalog``, which the package
installs to /usr/lib/systemd/catalog/ (``journalctl -x`` then shows the text; see
systemd.journal-fields(7), MESSAGE_ID, and journalctl(1), --catalog). An id never changes once
released; a new event gets a new id. tests/unit/test_message_ids.py checks that each member has
a catalog entry and each entry a member, that ids are unique, and that each member is used.
"""

from __future__ import annotations

import enum


class MessageId(enum.Enum):
    DAEMON_READY = "7f7fe827402b411ea201417d51fad6b2"
    DAEMON_STOPPING = "f2835849f19e48e8b43f55f4670bd5e6"
    DAEMON_STOPPED = "be8b51ec2ec34d2cbb9f02c84a473919"
    DAEMON_FAILED = "4c0e2fabb3ef44b4ac790a20cb64b304"
    CONFIG_INVALID = "6c7806152f4f4146af485c8d4f35bafa"
    CONFIG_RELOADED = "a8f8b37aeae842a4943d8e1854f167cf"
    CONFIG_RELOAD_FAILED = "6b45f8545739414ebb4f9a8db8d671e4"
    SANDBOX_UNAVAILABLE = "ed8d3815bf8e4532b763abb6655a91fb"
    SESSION_STARTED = "a787ac22a33e44529f716a491a8a47a5"
    SESSION_STOPPED = "a78809da01d64cc28edad87ea7ffb4ac"
    SESSION_FAILED = "e61356c464fb41c487d58f869c6c90a2"
    SESSION_OOM = "10c0999835b049a981846e602e67934a"
    CHANGE_PENDING = "b5203252b1f24a8ebf139b7ea3c1bfce"
    CHANGE_APPLIED = "c92b063304804e8f9bd79d2a17fe99bb"
    CHANGE_REJECTED = "25d8cb33236f4eb99a8d03cd84fa3860"
    CHANGE_NOT_APPLIED = "6ecfa7fd29cf4367b52aaad4bb366cf7"
    AUDIT_RECORD_LOST = "f73f1b85c73d4a85bca80806169ae094"
    AUDIT_CHAIN_BROKEN = "f428909ae09445e2a5a13fe9d5bf23da"
    AUDIT_LOG_DAMAGED = "62b2020727404921be8c3f4cda318e9c"
    EGRESS_DENIED = "e401990272be4258b92a9658156d9e57"
    CHANNEL_FAILED = "91e91531744242669c5558b89bec8909"
    CHANNEL_MESSAGE_FAILED = "76bc4094078c4e0ea4e076babd491d0b"
    DISK_FULL = "0362baa196584da191eaf52d879d33b1"
    ADMIN_CALL_REFUSED = "a1da42e59e334a52b54089f2127fda16"
    MCP_SERVER_FAILED = "9c8a9dab1299457185fb55c668ee0a4d"
    REPLIES_HELD = "e0d1630d73b241cb975107678b71fb2e"
    REPLIES_NEAR_BOUND = "8b39f2c25e3b4e4ea014356aa0f38a0a"


def message_id(event: MessageId, **fields: object) -> dict[str, object]:
    """``extra=`` for a log call: the event's MESSAGE_ID (journald) beside other fields."""
    return {**fields, "MESSAGE_ID": event.value}


# The session events (a state a session entered, as audit_event names it) that carry an id.
SESSION_EVENTS = {
    "running": MessageId.SESSION_STARTED,
    "stopped": MessageId.SESSION_STOPPED,
    "failed": MessageId.SESSION_FAILED,
}
