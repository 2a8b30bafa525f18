"""``packages``: named and validated, refused until packages can be installed (docs/packages.md)."""

from __future__ import annotations

from ironclawd.domain.kinds.base import RefusedKind

KIND = RefusedKind(
    "packages",
    why=(
        "packages are not installed into agent images yet; the design (host-side apt download "
        "and signature check, unpacked into a per-agent read-only layer) is in docs/packages.md"
    ),
)
