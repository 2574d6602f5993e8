"""Fixes specproxy applies to the pinned llama.cpp source before building it.

Each is an exact edit of upstream text, checked before and after, so a change of the pinned
version that moves the code fails the build loudly instead of building without the fix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from proxy.provision.pypi import ProvisionError


@dataclass(frozen=True)
class SourceFix:
    """One exact edit: in `path` (relative to llama.cpp/), `old` becomes `new`."""

    name: str
    path: str
    old: str
    new: str


# b11434 checks whether a request's client has gone only after a whole second passes with no
# result for *any* request: every token of another stream, every /slots or /metrics answer,
# restarts the wait. On a busy server a prompt whose client left is therefore processed to the
# end (16 k tokens: about 6 minutes on 2 cores), holding its slot and the device. Waiting
# until a fixed deadline makes the check run every second whatever else the server answers.
CANCEL_WHEN_BUSY = SourceFix(
    name="check-disconnects-every-second",
    path="tools/server/server-queue.cpp",
    old=(
        "server_task_result_ptr server_response::recv_with_timeout("
        "const std::unordered_set<int> & id_tasks, int timeout) {\n"
        "    while (true) {\n"
    ),
    new=(
        "server_task_result_ptr server_response::recv_with_timeout("
        "const std::unordered_set<int> & id_tasks, int timeout) {\n"
        "    // specproxy: one deadline, so other tasks' results cannot postpone the caller's\n"
        "    // should_stop() check (a client that left) indefinitely.\n"
        "    const auto deadline = std::chrono::steady_clock::now() + "
        "std::chrono::seconds(timeout);\n"
        "    while (true) {\n"
    ),
)
CANCEL_WHEN_BUSY_WAIT = SourceFix(
    name="check-disconnects-every-second (wait)",
    path="tools/server/server-queue.cpp",
    old=(
        "        std::cv_status cr_res = condition_results.wait_for("
        "lock, std::chrono::seconds(timeout));\n"
    ),
    new="        std::cv_status cr_res = condition_results.wait_until(lock, deadline);\n",
)
FIXES: tuple[SourceFix, ...] = (CANCEL_WHEN_BUSY, CANCEL_WHEN_BUSY_WAIT)


def fixes_id() -> str:
    """A short hash of every fix, for the build stamp: new fixes rebuild the binary."""
    blob = "".join(f.path + f.old + f.new for f in FIXES)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def apply_fixes(source: Path) -> None:
    """Apply each fix to the llama.cpp tree at `source` once; raise if upstream text moved."""
    for fix in FIXES:
        path = source / fix.path
        text = path.read_text()
        if fix.new in text:
            continue
        if text.count(fix.old) != 1:
            raise ProvisionError(
                f"cannot apply specproxy's fix {fix.name!r} to {path}: the upstream code changed; "
                "update proxy/provision/source_fixes.py for the pinned llama.cpp version"
            )
        path.write_text(text.replace(fix.old, fix.new))
