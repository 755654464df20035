"""tfdist._pipes: standard streams that outlive their reader (`tfdist train | tee log` and Ctrl-C)."""

import io
import os
import sys

from tfdist._pipes import survive_a_closed_output


def test_a_write_to_a_closed_pipe_goes_to_devnull_and_the_stream_comes_back_after(monkeypatch):
    read, write = os.pipe()
    stream = os.fdopen(write, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        with survive_a_closed_output():
            assert sys.stdout is not stream and sys.stdout.fileno() == stream.fileno()
            print("read by tee")
            assert os.read(read, 100) == b"read by tee\n"
            os.close(read)  # tee is gone
            print("a progress bar's line")  # BrokenPipeError without the survivor
            sys.stdout.flush()
            print("and the next one")
        assert sys.stdout is stream
        print("after the block: the descriptor writes to /dev/null now")
        stream.flush()
    finally:
        stream.close()


def test_a_stream_without_a_descriptor_is_left_as_it_is(monkeypatch):
    notebook = io.StringIO()  # as a notebook's output stream: no fileno
    monkeypatch.setattr(sys, "stdout", notebook)
    with survive_a_closed_output():
        assert sys.stdout is notebook
        print("shown")
    assert notebook.getvalue() == "shown\n"
