"""``skills``: named and validated, refused until this ironclawd can apply it."""

from __future__ import annotations

from ironclawd.domain.kinds.base import RefusedKind

KIND = RefusedKind("skills")
