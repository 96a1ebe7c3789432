"""Bad input to the command line: one line on stderr, exit status 2, never a traceback, and nothing run
or allocated first. Each case runs the real command in a child process (the exit status and the stream
are the process's)."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from tests.cli.process import SMALL, kvledger

REFUSED = [
    # sizes beyond their stated bound: refused while parsing, the bound in the message
    (["simulate", "--kv-pool-tokens", "100000000000000"], "--kv-pool-tokens: must be <= 33,554,432"),
    (["simulate", "--gsp-num-groups", "99999999999999"], "--gsp-num-groups: must be <= 1,048,576"),
    (["simulate", "--req-pool-rows", "70000"], "--req-pool-rows: must be <= 65,536"),
    (["simulate", "--pd", "--pd-latency", "1000000000"], "--pd-latency: must be <= 65,536"),
    (["explore", "--depth", "1000"], "--depth: must be <= 64"),
    # sizes within their bounds whose product would be allocated up front
    (
        ["simulate", "--gsp-num-groups", "1048576", "--gsp-prompts-per-group", "1048576"],
        "would hold 140,737,488,355,328 tokens, above the bound of 268,435,456",
    ),
    (
        ["simulate", "--gsp-system-prompt-len", "1048576", "--kv-pool-tokens", "2000000"],
        "a request of 1,048,800 tokens",
    ),
    # combinations the engine refuses, named in the command's own options and refused before anything runs
    (
        ["simulate", "--pd", "--pd-decode-cache", "--page-size", "4"],
        "--pd-decode-cache with the Mamba pool needs --page-size 1 (got --page-size 4)",
    ),
    (["simulate", "--pd", "--abort-rate", "0.1"], "--abort-rate has no effect with --pd"),
    # an option that would have no effect under another
    (["simulate", "--plot", "x.svg", "--no-plot"], "--plot has no effect with --no-plot"),
    (["simulate", "--no-mamba", "--mamba-track-interval", "7"], "--mamba-track-interval has no effect with --no-mamba"),
    (["simulate", "--no-mamba", "--mamba-slots", "8"], "--mamba-slots has no effect with --no-mamba"),
    (
        ["simulate", "--no-radix-cache", "--mamba-chunk-size", "32"],
        "--mamba-chunk-size has no effect with --no-radix-cache",
    ),
    (
        ["simulate", "--mamba-strategy", "no_buffer", "--mamba-track-interval", "64"],
        "--mamba-track-interval has no effect with --mamba-strategy no_buffer",
    ),
    (["simulate", "--pd-latency", "3"], "--pd-latency applies to --pd runs only"),
    # the option the user set is blamed, the default they never typed is named as one
    (["simulate", "--page-size", "3"], "--page-size 3 does not divide the default --mamba-track-interval 256"),
    (
        ["simulate", "--page-size", "4", "--mamba-track-interval", "6"],
        "--mamba-track-interval 6 is not a multiple of --page-size 4",
    ),
    (["simulate", "--page-size", "3", "--no-mamba"], "--page-size 3 does not divide the default --kv-pool-tokens 5120"),
    (
        ["simulate", "--page-size", "96", "--mamba-track-interval", "192"],
        "--page-size 96 and the default --mamba-chunk-size 64: one must divide",
    ),
    (["simulate", "--record", "out.png", "--plot", "./out.png"], "--record and --plot both name out.png"),
    # exhibit names are checked against the museum's index, before the catalogue (and torch) loads
    (["hunt", "--exhibit", "B99"], "no exhibit 'B99'; known: B1, B2"),
    (["hunt", "--exhibit", "b3"], "B3 is out of the model's scope: "),
    (["explore", "--exhibit", "N5"], "N5: not scheduler or cache exhibits"),
    # hunt's output directory is checked before the first second of hunting
    (["hunt", "--out", "{a_file}"], "exists and is not a directory"),
    (["hunt", "--out", "{a_file}/repros"], "is not a directory"),
]


@pytest.mark.parametrize(("args", "message"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_refused_in_one_line_with_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory\n")
    done = kvledger(*[a.format(a_file=a_file) for a in args], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"kvledger {args[0]}: error: ") and message in done.stderr, done.stderr
    assert not done.imported_engine, "refused after the engine was imported: the check came too late"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing written or created


def _file_size_limit(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def test_an_event_log_that_cannot_be_written_mid_run_is_one_line(tmp_path: Path) -> None:
    """A disk that fills up mid-run (here: a 16 KiB file size limit; Python ignores SIGXFSZ, the write fails
    with EFBIG): one line, exit 2, and the cut-off log is not left behind."""
    done = kvledger(
        "simulate", *SMALL, "--no-plot", "--record", "run.jsonl",
        cwd=tmp_path, see_imports=False, preexec_fn=lambda: _file_size_limit(16384),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("kvledger simulate: error: --record run.jsonl: cannot be written (File too large)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full is a Linux device")
def test_an_event_log_to_dev_full_is_one_line() -> None:
    done = kvledger("simulate", *SMALL, "--no-plot", "--record", "/dev/full")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "kvledger simulate: error: --record /dev/full: cannot be written (No space left on device)\n"
    )
    assert Path("/dev/full").is_char_device()  # written in place, never renamed over
