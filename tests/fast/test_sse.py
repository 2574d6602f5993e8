"""The one SSE reader: pieces split wherever chunks happen to break, and `data:` JSON."""

from __future__ import annotations

from proxy.sse import EVENT, SseSplitter, data_of, is_done, iter_data

STREAM = b'data: {"a": 1}\n\nevent: x\ndata: {"b": [2, 3]}\n\ndata: [DONE]\n\n'


def test_lines_and_events_come_out_whole_however_the_chunks_break() -> None:
    for size in range(1, len(STREAM) + 1):
        chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
        lines, events = SseSplitter(), SseSplitter(EVENT)
        got_lines = [line for c in chunks for line in lines.feed(c)]
        got_events = [event for c in chunks for event in events.feed(c)]
        assert got_lines == STREAM.split(b"\n")[:-1]
        assert got_events == [b'data: {"a": 1}', b'event: x\ndata: {"b": [2, 3]}', b"data: [DONE]"]
        assert lines.flush() == b"" and events.flush() == b""
        assert list(iter_data(chunks)) == [{"a": 1}, {"b": [2, 3]}]


def test_data_of_reads_only_json_data_lines() -> None:
    assert data_of(b'data: {"x": 1}') == {"x": 1}
    assert data_of(b'data:{"x": 1}') == {"x": 1}
    assert data_of(b"data: [DONE]") is None and is_done(b"data: [DONE]")
    assert data_of(b"event: message_start") is None
    assert data_of(b"data: {not json") is None
    assert data_of(b": ping") is None


def test_an_unfinished_last_line_is_kept_for_flush() -> None:
    lines = SseSplitter()
    assert lines.feed(b"data: 1\ndata: 2") == [b"data: 1"]
    assert lines.flush() == b"data: 2"
    assert list(iter_data([b'data: {"tail": true}'])) == [{"tail": True}]
