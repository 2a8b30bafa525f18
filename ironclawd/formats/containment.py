"""The containment report of a red-team run: its JSON format, its text table, its verdict. No I/O.

Format ``ironclaw-containment-report/1`` (docs/containment-report.md)::

    {"format": "ironclaw-containment-report/1", "generated_at": "2026-11-30T14:00:00Z",
     "versions": {"runsc": ..., "systemd": ..., "kernel": ..., "platform": ..., ...},
     "attacks": [ATTACK, ...], "negative_control": [ATTACK, ...],
     "summary": {"attacks": SUMMARY, "negative_control": SUMMARY}}
    ATTACK  = {"id", "category", "stance", "title", "verdict", "evidence"}   (all strings)
    SUMMARY = {"total": n, "by_verdict": {verdict: n}, "by_category": {category: {verdict: n}}}

Evidence is whatever a probe saw, possibly chosen by the attacker: the table replaces control
characters so printing a report can never drive the operator's terminal.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any

from ironclawd import lazy_re
from ironclawd.errors import MalformedReport

FORMAT = "ironclaw-containment-report/1"
VERDICTS = ("contained", "escaped", "error")
STANCES = ("sandbox", "host-user")
CATEGORIES = (
    "network",
    "filesystem",
    "proc",
    "privileges",
    "kernel",
    "secrets",
    "queues",
    "sockets",
    "gateway",
    "exhaustion",
    "host-users",
)
REQUIRED_VERSIONS = ("runsc", "systemd", "kernel", "platform")
ID_RE = lazy_re.compile(r"[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+")
ELLIPSIS = "…"
TABLE_WIDTH = 120
_FIELDS = ("id", "category", "stance", "title", "verdict", "evidence")


class Outcome(IntEnum):
    """What a valid report says, worst last; ironctl maps these to exit codes."""

    CONTAINED = 0  # every attack contained, and the negative control saw an escape
    INCONCLUSIVE = 1  # an attack errored, or the negative control saw no escape
    ESCAPED = 2  # at least one attack escaped


@dataclass(frozen=True)
class AttackResult:
    """One attack's outcome. ``id`` is stable and dotted: ``net.tcp.host-loopback``."""

    id: str
    category: str
    stance: str
    title: str
    verdict: str
    evidence: str

    def __post_init__(self) -> None:
        where = f"attack {self.id!r}"
        if not isinstance(self.id, str) or not ID_RE.fullmatch(self.id):
            raise MalformedReport(f"{where}: id: expected dotted lower-case words (net.tcp.x)")
        _need_choice(f"{where}: category", self.category, CATEGORIES)
        _need_choice(f"{where}: stance", self.stance, STANCES)
        _need_choice(f"{where}: verdict", self.verdict, VERDICTS)
        for name in ("title", "evidence"):
            if not isinstance(getattr(self, name), str):
                raise MalformedReport(f"{where}: {name}: expected a string")


@dataclass(frozen=True)
class Report:
    generated_at: str
    versions: Mapping[str, str]
    attacks: tuple[AttackResult, ...]
    negative_control: tuple[AttackResult, ...]

    def outcome(self) -> Outcome:
        if any(a.verdict == "escaped" for a in self.attacks):
            return Outcome.ESCAPED
        if any(a.verdict == "error" for a in self.attacks) or not self.control_saw_escape:
            return Outcome.INCONCLUSIVE
        return Outcome.CONTAINED

    @property
    def control_saw_escape(self) -> bool:
        return any(a.verdict == "escaped" for a in self.negative_control)

    def verdict_line(self) -> str:
        """One line saying what the report proves, and why not if it does not."""
        counts = summarize(self.attacks)["by_verdict"]
        tally = ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
        control = summarize(self.negative_control)["by_verdict"]["escaped"]
        probes = f"negative control: {control} of {len(self.negative_control)} escaped" + (
            "" if self.control_saw_escape else " (the probes did not show they can see one)"
        )
        word = {
            Outcome.CONTAINED: "CONTAINED",
            Outcome.INCONCLUSIVE: "INCONCLUSIVE",
            Outcome.ESCAPED: "ESCAPED",
        }[self.outcome()]
        return f"{word}: {len(self.attacks)} attacks: {tally}; {probes}"


def order(results: Iterable[AttackResult]) -> tuple[AttackResult, ...]:
    """Report order: by category as listed in CATEGORIES, then by id (stable across runs)."""
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    return tuple(sorted(results, key=lambda a: (rank[a.category], a.id)))


def summarize(results: Sequence[AttackResult]) -> dict[str, Any]:
    """Counts per verdict, and per category and verdict (every verdict key present)."""
    by_category: dict[str, dict[str, int]] = {}
    for a in results:
        by_category.setdefault(a.category, dict.fromkeys(VERDICTS, 0))[a.verdict] += 1
    by_verdict = {v: sum(1 for a in results if a.verdict == v) for v in VERDICTS}
    ordered = {c: by_category[c] for c in CATEGORIES if c in by_category}
    return {"total": len(results), "by_verdict": by_verdict, "by_category": ordered}


def build(
    attacks: Iterable[AttackResult],
    negative_control: Iterable[AttackResult],
    versions: Mapping[str, str],
    generated_at: datetime,
) -> dict[str, Any]:
    """The report document, ready for ``json.dumps``."""
    main, control = order(attacks), order(negative_control)
    _check_unique("attacks", main)
    _check_unique("negative_control", control)
    return {
        "format": FORMAT,
        "generated_at": generated_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": {k: str(versions[k]) for k in sorted(versions)},
        "attacks": [asdict(a) for a in main],
        "negative_control": [asdict(a) for a in control],
        "summary": {"attacks": summarize(main), "negative_control": summarize(control)},
    }


def parse(doc: Any) -> Report:
    """A report from its decoded JSON, checked field by field (MalformedReport names the field)."""
    if not isinstance(doc, dict):
        raise MalformedReport(f"report: expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise MalformedReport(f"report: format {doc.get('format')!r}: expected {FORMAT!r}")
    missing = {"generated_at", "versions", "attacks", "negative_control", "summary"} - set(doc)
    if missing:
        raise MalformedReport(f"report: missing {', '.join(sorted(missing))}")
    generated_at = doc["generated_at"]
    try:
        datetime.strptime(generated_at, "%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        raise MalformedReport(
            f"report: generated_at {generated_at!r}: expected YYYY-MM-DDTHH:MM:SSZ"
        ) from None
    versions = doc["versions"]
    if not isinstance(versions, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in versions.items()
    ):
        raise MalformedReport("report: versions: expected an object of strings")
    absent = [k for k in REQUIRED_VERSIONS if k not in versions]
    if absent:
        raise MalformedReport(f"report: versions: missing {', '.join(absent)}")
    attacks = _attacks("attacks", doc["attacks"])
    control = _attacks("negative_control", doc["negative_control"])
    expected = {"attacks": summarize(attacks), "negative_control": summarize(control)}
    if doc["summary"] != expected:
        raise MalformedReport("report: summary does not match the attacks listed")
    return Report(generated_at, dict(versions), attacks, control)


def render(report: Report, width: int = TABLE_WIDTH) -> str:
    """The text form: versions header, one table per list, the verdict line."""
    lines = [f"IronClaw containment report ({FORMAT}), generated {report.generated_at}"]
    lines += [f"  {k:<10} {clean(v)}" for k, v in report.versions.items()]
    for title, results in (
        ("attacks", report.attacks),
        (
            "negative control (deliberately weakened sandbox: escapes expected)",
            report.negative_control,
        ),
    ):
        lines += ["", f"{title}: {len(results)}", *table(results, width)]
    lines += ["", report.verdict_line()]
    return "\n".join(lines) + "\n"


def table(results: Sequence[AttackResult], width: int = TABLE_WIDTH) -> list[str]:
    """Rows of id, category, stance, verdict, evidence. Every column but evidence is as wide as
    its widest cell (never split); evidence fills the rest and is cut with an ellipsis."""
    if not results:
        return ["(none)"]
    header = ("ATTACK", "CATEGORY", "STANCE", "VERDICT")
    rows = [(a.id, a.category, a.stance, a.verdict.upper()) for a in results]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    room = max(width - sum(widths) - 2 * len(widths), 20)
    out = ["  ".join([*(h.ljust(w) for h, w in zip(header, widths, strict=True)), "EVIDENCE"])]
    for row, attack in zip(rows, results, strict=True):
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        out.append("  ".join([*cells, cut(clean(attack.evidence), room)]).rstrip())
    return out


def clean(text: str) -> str:
    """One line of printable text: whitespace runs become one space, control and format
    characters (escape sequences, bidi overrides) become U+FFFD."""
    text = " ".join(text.split())
    return "".join("\ufffd" if unicodedata.category(c) in ("Cc", "Cf", "Cs") else c for c in text)


def cut(text: str, room: int) -> str:
    """``text`` in at most ``room`` characters, cut at a word boundary with an ellipsis."""
    if len(text) <= room:
        return text
    head = text[: room - len(ELLIPSIS)]
    space = head.rfind(" ")
    if space >= room // 2:
        head = head[:space]
    return head.rstrip() + ELLIPSIS


def _attacks(where: str, value: Any) -> tuple[AttackResult, ...]:
    if not isinstance(value, list):
        raise MalformedReport(f"report: {where}: expected a list")
    results = []
    for index, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != set(_FIELDS):
            raise MalformedReport(
                f"report: {where}[{index}]: expected an object with exactly {', '.join(_FIELDS)}"
            )
        try:
            results.append(AttackResult(**item))
        except MalformedReport as exc:
            raise MalformedReport(f"report: {where}[{index}]: {exc}") from None
    _check_unique(where, results)
    return tuple(results)


def _check_unique(where: str, results: Sequence[AttackResult]) -> None:
    seen: set[str] = set()
    for a in results:
        if a.id in seen:
            raise MalformedReport(f"report: {where}: attack id {a.id!r} appears twice")
        seen.add(a.id)


def _need_choice(where: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise MalformedReport(f"{where} {value!r}: expected one of {', '.join(choices)}")
