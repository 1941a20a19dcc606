"""The sanitizer's result types, shared by the CLI, the ledger and reports."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class CheckOutcome:
    name: str
    status: str  # passed | failed | skipped
    detail: str = ""
    duration_s: float = 0.0

    @property
    def passed(self) -> Optional[bool]:
        """True / False, and None for a check that could not run (never reported as passed)."""
        return None if self.status == SKIPPED else self.status == PASSED

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "status": self.status, "detail": self.detail,
                "duration_s": round(self.duration_s, 3)}


@dataclass
class Verdict:
    file: str
    op: str
    mode: str  # quick | full | gpu
    checks: List[CheckOutcome] = field(default_factory=list)
    fpsan_equivalent: Optional[bool] = None  # None: FpSan could not decide (skipped or not run)
    fpsan_detail: str = ""
    duration_s: float = 0.0
    error: str = ""  # the isolated run itself failed (crash, timeout)

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.checks) and all(c.status != FAILED for c in self.checks)

    @property
    def first_failure(self) -> Optional[CheckOutcome]:
        return next((c for c in self.checks if c.status == FAILED), None)

    def summary(self) -> str:
        if self.error:
            return self.error
        f = self.first_failure
        if f:
            return f"{f.name}: {f.detail}"
        eq = {True: "FpSan-equivalent to the baseline", False: "not structurally equivalent (passed the extended "
              "numeric suite)", None: "FpSan equivalence undecided"}[self.fpsan_equivalent]
        return f"passed {sum(c.status == PASSED for c in self.checks)} checks; {eq}"

    def to_json(self) -> Dict[str, Any]:
        return {"file": self.file, "op": self.op, "mode": self.mode, "passed": self.passed,
                "fpsan_equivalent": self.fpsan_equivalent, "fpsan_detail": self.fpsan_detail,
                "error": self.error or None, "duration_s": round(self.duration_s, 3),
                "checks": [c.to_json() for c in self.checks]}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Verdict":
        v = cls(d["file"], d["op"], d.get("mode", "full"),
                [CheckOutcome(c["name"], c["status"], c.get("detail", ""), c.get("duration_s", 0.0))
                 for c in d.get("checks", [])],
                d.get("fpsan_equivalent"), d.get("fpsan_detail", ""), d.get("duration_s", 0.0), d.get("error") or "")
        return v
