"""The sanitizer's result types, shared by the CLI, the ledger and reports."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

# The words a time-limit verdict's error, and the check it stopped, begin with: slowness (a loaded machine, the
# interpreter) is no reason to reject, so such a candidate stays "not verified", to be judged again. A verdict
# says so by its kind (VerdictKind.TIME_LIMIT); the words remain what a ledger's check rows (which carry no
# kind) and a verdict written before verdicts had a kind are read by.
TIME_LIMIT_PREFIX = "not verified: time limit"


def is_time_limit(text: Optional[str]) -> bool:
    """Whether a check's recorded detail (or an older verdict's error) is the time limit's words, not a finding."""
    return (text or "").startswith(TIME_LIMIT_PREFIX)


class VerdictKind(str, Enum):
    """What a verdict is: a judgement of the candidate, or a judging the time limit ended (no finding: the
    candidate is not verified, and is judged again). The member is the string the JSON holds."""

    JUDGED = "judged"  # passed or failed on what the checks found (or the judge failing for another reason)
    TIME_LIMIT = "time limit"  # the time limit stopped the judging: neither passed nor a fault of the candidate

    def __str__(self) -> str:  # f-strings and str() give the word, not VerdictKind.JUDGED
        return self.value


class SanitizerMode(str, Enum):
    """Which checks a judge runs; the member is the string the command line, the ledger and the JSON hold."""

    QUICK = "quick"  # the CPU checks, each drawing fewer cases (what a run screens with)
    FULL = "full"  # every CPU check at full depth (what a promotion needs)
    GPU = "gpu"  # the checks that need the device (determinism, the device suite)

    def __str__(self) -> str:  # f-strings and str() give the word, not SanitizerMode.QUICK
        return self.value


class CheckStatus(str, Enum):
    """How one check of a verdict ended; the member is the string stored in the ledger and the JSON."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"  # it could not run (no GPU, an earlier check failed, FpSan undecided): never a pass

    def __str__(self) -> str:  # f-strings and str() give the stored word, not CheckStatus.PASSED
        return self.value


_MARKDOWN_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|"}


def quote_untrusted(text: Any, limit: int = 400, markdown: bool = False) -> str:
    """Text a candidate controls (its exception messages and printed output, and the check details
    and summaries that carry them), made into data that is safe to place in a model prompt or a
    markdown line: one line (newlines, control and format characters become spaces), no backticks (so
    no code spans or fences), at most `limit` characters (then an ellipsis), and inside double quotes
    with `\\` and `"` backslash-escaped, so that it cannot close its own quote. With `markdown`, `&`,
    `<` and `>` become HTML entities, `|` is escaped and so is the `(` of `](` (no HTML, autolinks,
    table cells, links or images)."""
    s = "" if text is None else str(text)
    s = "".join(" " if unicodedata.category(ch)[0] in "CZ" and ch != " " else ch for ch in s)
    s = " ".join(s.split()).replace("`", "'")
    if len(s) > limit:
        s = s[: max(0, limit - 1)].rstrip() + "\u2026"
    s = s.replace("\\", "\\\\").replace('"', '\\"')
    if markdown:
        s = "".join(_MARKDOWN_ESCAPES.get(ch, ch) for ch in s).replace("](", "]\\(")
    return f'"{s}"'


def fence_for(text: str) -> str:
    """A markdown code fence longer than any run of backticks in `text` (a candidate's source shown as
    code in a prompt or report), so the text cannot close the block and continue as prose."""
    longest = max((len(r) for r in re.findall(r"`+", text or "")), default=0)
    return "`" * max(3, longest + 1)


@dataclass
class CheckOutcome:
    name: str
    status: CheckStatus  # (a stored word, as read back from JSON, is made a member)
    detail: str = ""
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        self.status = CheckStatus(self.status)

    @property
    def passed(self) -> Optional[bool]:
        """True / False, and None for a check that could not run (never reported as passed)."""
        return None if self.status == CheckStatus.SKIPPED else self.status == CheckStatus.PASSED

    @classmethod
    def from_json(cls, c: Dict[str, Any]) -> "CheckOutcome":
        """A check as a verdict document holds it (one written before checks had a status says `passed`)."""
        legacy: Dict[Any, CheckStatus] = {True: CheckStatus.PASSED, False: CheckStatus.FAILED}
        status = c.get("status") or legacy.get(c.get("passed"), CheckStatus.SKIPPED)
        return cls(c["name"], status, c.get("detail") or "", c.get("duration_s") or 0.0)

    def to_json(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "status": self.status,
            "detail": self.detail,
            "duration_s": round(self.duration_s, 3),
        }


@dataclass
class Verdict:
    """A sanitizer stage's verdict, and the stored verdict of a candidate (the ledger's `verdict`, read back with
    `from_json`): a verdict the loop writes itself (an unusable reply, a benchmark that cannot be judged) is
    one of these too, with `mode` naming its stage."""

    file: str
    op: str
    mode: str  # quick | full | gpu (a judge's); reply | bench (the loop's own)
    checks: List[CheckOutcome] = field(default_factory=list)
    fpsan_equivalent: Optional[bool] = None  # None: FpSan could not decide (skipped or not run)
    fpsan_detail: str = ""
    duration_s: float = 0.0
    error: str = ""  # the isolated run itself failed (crash, timeout)
    seed: Optional[int] = None  # the inputs' seed base (`sanitize --seed N` reproduces them); None: not known
    # the identity of the text judged (sanitizer/canonical.py: the hash of `judged_or_as_read` of the bytes the
    # judge read); '' when
    # the verdict does not say (an older ledger's): the loop holds it against the candidate's own hash
    source_hash: str = ""
    kind: VerdictKind = VerdictKind.JUDGED  # (a stored word, as read back from JSON, is made a member)

    def __post_init__(self) -> None:
        self.kind = VerdictKind(self.kind)

    @property
    def timed_out(self) -> bool:
        """The time limit ended the judging: the candidate is not verified, and not at fault."""
        return self.kind == VerdictKind.TIME_LIMIT

    def stop_for_time_limit(self, reason: str) -> None:
        """The time limit ended the judging: `reason` (the limit's words, then where it stopped) is the error."""
        self.error = f"{TIME_LIMIT_PREFIX} {reason}"
        self.kind = VerdictKind.TIME_LIMIT

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.checks) and all(c.status != CheckStatus.FAILED for c in self.checks)

    @property
    def first_failure(self) -> Optional[CheckOutcome]:
        return next((c for c in self.checks if c.status == CheckStatus.FAILED), None)

    def failure(self) -> str:
        """Why the verdict fails, in one line: the first failing check, else the error ('' when neither)."""
        f = self.first_failure
        return f"{f.name}: {f.detail}" if f else self.error

    def summary(self) -> str:
        if self.error:
            return self.error
        if self.first_failure:
            return self.failure()
        eq = {
            True: "FpSan-equivalent to the baseline",
            False: "not structurally equivalent (passed the extended numeric suite)",
            None: "FpSan equivalence undecided",
        }[self.fpsan_equivalent]
        return f"passed {sum(c.status == CheckStatus.PASSED for c in self.checks)} checks; {eq}"

    def to_json(self) -> Dict[str, Any]:
        return {
            "file": self.file,
            "op": self.op,
            "mode": self.mode,
            "passed": self.passed,
            "fpsan_equivalent": self.fpsan_equivalent,
            "fpsan_detail": self.fpsan_detail,
            "error": self.error or None,
            "duration_s": round(self.duration_s, 3),
            "checks": [c.to_json() for c in self.checks],
            "seed": self.seed,
            "source_hash": self.source_hash,
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Verdict":
        """A verdict document: a judge's, or one the ledger stores (whose older rows may lack any key; one
        written before verdicts had a kind says the time limit's by its error's words)."""
        kind = d.get("kind") or (VerdictKind.TIME_LIMIT if is_time_limit(d.get("error")) else VerdictKind.JUDGED)
        return cls(
            d.get("file") or "",
            d.get("op") or "",
            d.get("mode") or "full",
            [CheckOutcome.from_json(c) for c in d.get("checks") or []],
            d.get("fpsan_equivalent"),
            d.get("fpsan_detail") or "",
            d.get("duration_s") or 0.0,
            d.get("error") or "",
            d.get("seed"),
            d.get("source_hash") or "",
            kind,
        )
