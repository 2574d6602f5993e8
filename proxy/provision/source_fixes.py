"""Fixes specproxy applies to the pinned llama.cpp source before building it.

Each is an exact edit of upstream text, checked before and after, so a change of the pinned
version that moves the code fails the build loudly instead of building without the fix.
"""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path

from proxy.provision.pypi import ProvisionError


class StaleSourceError(ProvisionError):
    """The source tree was patched by another version of these fixes: it must be re-extracted."""


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
# b11434 compiles out every per-request speculative field ("to keep things simple"), so one
# process can offer only one speculation setting. These let a request lower its draft length
# (0: it does not speculate) and name which of the process's speculators may draft for it, so
# plain, n-gram and draft-model strategies share one copy of the weights, one batch and one
# prompt cache. Requests that set neither behave exactly as upstream.
PER_REQUEST_FIELDS = SourceFix(
    name="per-request-speculation (task fields)",
    path="tools/server/server-task.h",
    old="    struct common_params_speculative speculative;\n",
    new=(
        "    struct common_params_speculative speculative;\n"
        "    // specproxy: this request's cap on the draft length (-1: the server's, 0: no\n"
        "    // speculation) and the speculators allowed to draft for it (empty: all loaded)\n"
        "    int32_t spec_n_max = -1;\n"
        "    std::vector<enum common_speculative_type> spec_types;\n"
    ),
)
PER_REQUEST_SCHEMA = SourceFix(
    name="per-request-speculation (request fields)",
    path="tools/server/server-schema.cpp",
    old=(
        "    // TODO: to keep things simple, we disable speculative parameter adjustments for now\n"
        "#if 0\n"
    ),
    new=(
        "    // specproxy: per-request speculation; the upstream block below stays off\n"
        '    add((new field_num("speculative.n_max", params.spec_n_max))\n'
        "        ->set_hard_limits(-1, INT32_MAX)\n"
        "        ->set_desc(\"Cap on this request's draft length: 0 = no speculation, -1 = the "
        "server's\"));\n"
        "\n"
        '    add((new field_json("speculative.types"))\n'
        '        ->set_desc("Speculators that may draft for this request (default: all loaded; '
        'specproxy build)")\n'
        "        ->set_handler([&](field_eval_context & ctx, const json & data) {\n"
        '            const auto & value = data.at("speculative.types");\n'
        "            std::vector<std::string> names;\n"
        "            if (value.is_string()) {\n"
        "                names = string_split<std::string>(value.get<std::string>(), ',');\n"
        "            } else if (value.is_array()) {\n"
        "                for (const auto & name : value) {\n"
        "                    names.push_back(name.get<std::string>());\n"
        "                }\n"
        "            } else {\n"
        '                throw std::invalid_argument("speculative.types must be a list of '
        'speculator names or one comma-separated string");\n'
        "            }\n"
        "            ctx.params.spec_types = common_speculative_types_from_names(names);\n"
        "        }));\n"
        "\n"
        "    // TODO: to keep things simple, we disable speculative parameter adjustments for now\n"
        "#if 0\n"
    ),
)
PER_REQUEST_DRAFT_LENGTH = SourceFix(
    name="per-request-speculation (draft length)",
    path="tools/server/server-context.cpp",
    old=(
        "        if (n_remaining() > 0) {\n"
        "            n_draft_max = std::min(n_draft_max, n_remaining() - 1);\n"
        "        }\n"
    ),
    new=(
        "        if (n_remaining() > 0) {\n"
        "            n_draft_max = std::min(n_draft_max, n_remaining() - 1);\n"
        "        }\n"
        "\n"
        "        // specproxy: the request's own cap; 0 turns speculation off for it alone\n"
        "        if (task->params.spec_n_max >= 0) {\n"
        "            n_draft_max = std::min(n_draft_max, task->params.spec_n_max);\n"
        "        }\n"
    ),
)
PER_REQUEST_TYPES_PARAM = SourceFix(
    name="per-request-speculation (draft params)",
    path="common/speculative.h",
    old=("    float    temp = 1.0f;\n    uint32_t seed = LLAMA_DEFAULT_SEED;\n};\n"),
    new=(
        "    float    temp = 1.0f;\n"
        "    uint32_t seed = LLAMA_DEFAULT_SEED;\n"
        "\n"
        "    // specproxy: the speculators allowed to draft for this sequence (nullptr: all)\n"
        "    const std::vector<enum common_speculative_type> * types = nullptr;\n"
        "};\n"
    ),
)
PER_REQUEST_TYPES_SET = SourceFix(
    name="per-request-speculation (draft params set)",
    path="tools/server/server-context.cpp",
    old=(
        "                            /* .seed     = */ slot.task->params.sampling.seed,\n"
        "                        };\n"
    ),
    new=(
        "                            /* .seed     = */ slot.task->params.sampling.seed,\n"
        "                            /* .types    = */ slot.task->params.spec_types.empty()\n"
        "                                ? nullptr : &slot.task->params.spec_types,\n"
        "                        };\n"
    ),
)
PER_REQUEST_TYPES_CHAIN = SourceFix(
    name="per-request-speculation (speculator chain)",
    path="common/speculative.cpp",
    old=(
        "    for (auto & impl : spec->impls) {\n"
        "        {\n"
        "            common_time_meas tm(impl->t_draft_us, !impl->gen_perf);\n"
        "            impl->draft(dparams);\n"
        "            impl->n_call_draft++;\n"
        "        }\n"
    ),
    new=(
        "    for (auto & impl : spec->impls) {\n"
        "        // specproxy: a sequence whose request names its speculators sits out the others\n"
        "        std::vector<llama_seq_id> sitting_out;\n"
        "        for (llama_seq_id seq_id = 0; seq_id < (llama_seq_id) dparams.size(); ++seq_id)"
        " {\n"
        "            auto & dp = dparams[seq_id];\n"
        "            if (dp.drafting && dp.types != nullptr &&\n"
        "                std::find(dp.types->begin(), dp.types->end(), impl->type) == "
        "dp.types->end()) {\n"
        "                dp.drafting = false;\n"
        "                sitting_out.push_back(seq_id);\n"
        "            }\n"
        "        }\n"
        "        {\n"
        "            common_time_meas tm(impl->t_draft_us, !impl->gen_perf);\n"
        "            impl->draft(dparams);\n"
        "            impl->n_call_draft++;\n"
        "        }\n"
        "        for (llama_seq_id seq_id : sitting_out) {\n"
        "            dparams[seq_id].drafting = true;\n"
        "        }\n"
    ),
)
# b11434's streamed answers return false from the content provider after the last chunk, which
# cpp-httplib treats as a cancelled stream and closes the connection: every streamed request
# then pays a new TCP connection. done() has already ended the body, so the stream succeeded.
KEEP_ALIVE_AFTER_STREAM = SourceFix(
    name="keep-alive-after-stream",
    path="tools/server/server-http.cpp",
    old=(
        "            if (!has_next) {\n"
        "                sink.done();\n"
        '                SRV_DBG("%s", "http: stream ended\\n");\n'
        "            }\n"
        "            return has_next;\n"
    ),
    new=(
        "            if (!has_next) {\n"
        "                sink.done();\n"
        '                SRV_DBG("%s", "http: stream ended\\n");\n'
        "            }\n"
        "            // specproxy: done() ended the body; false would close the connection\n"
        "            return true;\n"
    ),
)
# b11434 moves a RAM-cached prompt into the slot that loads it (its data cleared, the entry
# erased). Sessions of one agent share their system prompt, so a new session's first turn loads
# another session's cached prompt and takes it away: that session's next turn then processes
# its whole prompt again (measured through specproxy, two edit-heavy sessions: a 4,049-token
# turn found 0 cached). Loading a copy and keeping the entry, moved to the newest end so the
# eviction of the oldest keeps it, lets every session that shares a prefix find it; the cache's
# own size limit still bounds what it holds.
KEEP_CACHED_PROMPT_ON_LOAD = SourceFix(
    name="keep-cached-prompt-on-load",
    path="tools/server/server-task.cpp",
    old=(
        "                return false;\n"
        "            }\n"
        "\n"
        "            data.clear();\n"
        "            data.shrink_to_fit();\n"
        "        }\n"
        "\n"
        "        {\n"
        "            auto & data = it_best->data.drft;\n"
        "\n"
        "            if (!data.empty()) {\n"
        "                GGML_ASSERT(ctx_dft);\n"
        "\n"
        "                const size_t size = data.size();\n"
        "                const size_t n = "
        "llama_state_seq_set_data_ext(ctx_dft, data.data(), size, id_slot, 0);\n"
        "                if (n != size) {\n"
        '                    SRV_WRN("failed to restore state with size %zu\\n", size);\n'
        "\n"
        "                    return false;\n"
        "                }\n"
        "\n"
        "                data.clear();\n"
        "                data.shrink_to_fit();\n"
        "            }\n"
        "        }\n"
        "\n"
        "        prompt = std::move(it_best->prompt);\n"
        "\n"
        "        states.erase(it_best);\n"
    ),
    new=(
        "                return false;\n"
        "            }\n"
        "        }\n"
        "\n"
        "        {\n"
        "            auto & data = it_best->data.drft;\n"
        "\n"
        "            if (!data.empty()) {\n"
        "                GGML_ASSERT(ctx_dft);\n"
        "\n"
        "                const size_t size = data.size();\n"
        "                const size_t n = "
        "llama_state_seq_set_data_ext(ctx_dft, data.data(), size, id_slot, 0);\n"
        "                if (n != size) {\n"
        '                    SRV_WRN("failed to restore state with size %zu\\n", size);\n'
        "\n"
        "                    return false;\n"
        "                }\n"
        "            }\n"
        "        }\n"
        "\n"
        "        // specproxy: load a copy and keep the entry (newest now), so another session\n"
        "        // sharing this prefix still finds it\n"
        "        prompt = it_best->prompt.clone();\n"
        "\n"
        "        states.splice(states.end(), states, it_best);\n"
    ),
)
# b11434 gives a new request the idle slot whose prompt it shares most, and saves that slot's
# prompt to the RAM cache first only when the request keeps less than half of it. Sessions of
# one agent share their system prompt, so a new session's turn takes another session's idle
# slot, keeps the shared 70-90 %, and overwrites the rest: the other session's history, which
# its next turn then processes again. And a session's next turn extends its slot in place, so
# while it runs, no other request can find the prompt they share. Saving the slot's prompt
# every time (a copy of its KV cache, tens of milliseconds) keeps both: with prompts loaded as
# copies (above), every request sharing a start finds it, whichever slot is busy.
SAVE_SLOT_BEFORE_REUSE = SourceFix(
    name="save-slot-before-reuse",
    path="tools/server/server-context.cpp",
    old=(
        "                // if we are about to lose a large portion of the existing context - "
        "save it in the prompt cache\n"
        "                if (f_keep < 0.5f) {\n"
    ),
    new=(
        "                // specproxy: always save it in the prompt cache: nothing of it is lost\n"
        "                // and a request sharing its start finds it while this slot is busy\n"
        "                if (f_keep <= 1.0f) {\n"
    ),
)
# Text only a binary built with these fixes holds (the request field's description above): how a
# llama-server is known to be specproxy's build, wherever it came from (the cache, the image).
BUILD_MARKER = b"default: all loaded; specproxy build"
FIXES: tuple[SourceFix, ...] = (
    CANCEL_WHEN_BUSY,
    CANCEL_WHEN_BUSY_WAIT,
    PER_REQUEST_FIELDS,
    PER_REQUEST_SCHEMA,
    PER_REQUEST_DRAFT_LENGTH,
    PER_REQUEST_TYPES_PARAM,
    PER_REQUEST_TYPES_SET,
    PER_REQUEST_TYPES_CHAIN,
    KEEP_CACHED_PROMPT_ON_LOAD,
    SAVE_SLOT_BEFORE_REUSE,
    KEEP_ALIVE_AFTER_STREAM,
)


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
        if text.count(fix.old) != 1 and "specproxy" in text:
            raise StaleSourceError(
                f"{path} carries another version of specproxy's fixes; extract it afresh"
            )
        if text.count(fix.old) != 1:
            raise ProvisionError(
                f"cannot apply specproxy's fix {fix.name!r} to {path}: the upstream code changed; "
                "update proxy/provision/source_fixes.py for the pinned llama.cpp version"
            )
        path.write_text(text.replace(fix.old, fix.new))


def is_specproxy_build(binary: Path) -> bool:
    """Whether a llama-server binary was built with these fixes (it holds BUILD_MARKER)."""
    try:
        with binary.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(BUILD_MARKER) >= 0
    except (OSError, ValueError):
        return False
