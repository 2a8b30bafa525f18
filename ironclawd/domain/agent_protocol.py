"""The version of what a session's agent and the daemon say to each other: the lines on its
control socket, the gRPC services it calls on its other sockets (proto/) and its queue files'
format. A sandbox runs the agent frozen into the package that started it, and the daemon may be
replaced under it (an upgrade or a downgrade with sessions running): the agent announces its
version in its hello, the fd store's name of its connection carries it over a restart
(api/control.py), and an agent of a version this daemon does not speak is refused and its
session failed, never run half-understood.

Version 1 is what agents said before versions were announced: its hello and its name in the fd
store carry no version word, so daemons on both sides of that change read them as they did.
"""

from __future__ import annotations

# What this daemon's agent (agent/loop.py PROTOCOL_VERSION, which a test pins to this) speaks.
# A change to the control lines, the gRPC services the agent calls or the queue format that an
# agent of the last version would misread is a new version; a daemon that still serves the last
# version's agents unchanged keeps it in KNOWN_PROTOCOLS.
PROTOCOL_VERSION = 1
KNOWN_PROTOCOLS: tuple[int, ...] = (PROTOCOL_VERSION,)
UNANNOUNCED = 1  # the version of an agent that names none (every agent before versions)
VERSION_DIGITS = 5


def version_word(version: int) -> str:
    """How a hello or an fd store name says ``version``: "v<version>", and nothing for
    version 1 (as every earlier agent and daemon said it)."""
    return "" if version == UNANNOUNCED else f"v{version}"


def is_version_word(word: str) -> bool:
    """Whether ``word`` stands where a version would (it may still be malformed)."""
    return word.startswith("v")


def parse_version_word(word: str) -> int | None:
    """The version "v<digits>" names (plain ASCII digits, at most VERSION_DIGITS); None for
    anything else."""
    digits = word[1:]
    if not (is_version_word(word) and 0 < len(digits) <= VERSION_DIGITS and digits.isascii()
            and digits.isdigit()):  # fmt: skip
        return None
    return int(digits)


def refusal(sid: str, found: int) -> str | None:
    """Why session ``sid``'s agent of protocol version ``found`` is refused (None: this daemon
    speaks it): the version found, those known, and the operator's way out."""
    if found in KNOWN_PROTOCOLS:
        return None
    known = ", ".join(str(version) for version in KNOWN_PROTOCOLS)
    versions = "version" if len(KNOWN_PROTOCOLS) == 1 else "versions"
    return (
        f"its agent speaks protocol version {found}, this ironclawd speaks {versions} {known} "
        "(the sandbox was started by another ironclawd version, before an upgrade or a "
        "downgrade): refused, its sandbox stopped and its data kept; start the session again "
        f"('ironctl session start {sid}') to run it with this version's agent"
    )
