"""Class 8, and the CLI as a whole: no labkernels command prints a Python traceback for bad input. Every command
is run as a user runs it (a subprocess) with bad arguments; each must exit non-zero with a message naming what was
wrong -- one of the lab's own errors or argparse's usage line -- and must not run anything."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from hostile_util import assert_clean_error, labkernels, tiny_gguf
from labkernels import cli


def _subcommands() -> list[str]:
    ap = cli.build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    return list(sub.choices)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf(tmp_path_factory.mktemp("cli") / "tiny.gguf")


def _cases(tmp, tiny):
    corrupt = tmp / "corrupt.json"
    corrupt.write_text("{")
    return [  # (argv, fragments of the message)
        (["layout", "--model", tiny, "--filter", "(("], ["not a regular expression"]),
        (["layout", "--model", tiny, "--filter", "zzz"], ["no q4_K / q6_K tensor", "matches the filter 'zzz'"]),
        (["layout", "--model", ""], ["model path is empty"]),
        (["layout", "--model", tmp / "none.gguf"], ["model file not found"]),
        (["layout", "--model", tmp], ["is a directory"]),
        (["layout", "--model", tiny, "--stride", "100"], ["one or more of 210 and 224"]),
        (["peers", "mmq", "--print-test-file", "--types", "q9_K"], ["unknown type q9_K"]),
        (["peers", "mmq", "--print-test-file", "--shapes", "4096x1000"], ["4096x1000 is not ODxID"]),
        (["peers", "mmq", "--print-test-file", "--nts", "0"], ["token counts must be >= 1"]),
        (["gpu-check", "--steps", "prefill_r7", "--gemma", "/nonexistent.gguf", "--out", tmp / "g"],
         ["--gemma '/nonexistent.gguf': no such file"]),
        (["gpu-check", "--steps", "env,nope", "--out", tmp / "g"], ["unknown step 'nope'"]),
        (["gpu-check", "--steps", "env", "--repeats", "0", "--out", tmp / "g"], ["--repeats 0: must be >= 1"]),
        (["audit", "--family", "nope"], ["unknown family nope", "q6k_expb"]),
        (["audit", "--kernels-dir", "/nonexistent"], ["kernels folder /nonexistent: no such folder"]),
        (["migrate-data", "--root", "/nonexistent"], ["/nonexistent: no such data folder"]),
        (["check-data", "--root", "/nonexistent"], ["no such data folder"]),
        (["import-runs", "/nonexistent"], ["no such folder"]),
        (["results-table", "--index", "/nonexistent.json"], ["does not exist"]),
        (["results-table", "--index", tmp], ["is not a regular file"]),
        (["results-table", "--index", corrupt], ["is corrupt"]),
        (["run", "99", "--out", tmp / "r"], ["notebook '99': no match"]),
        (["run", "03", "-p", "novalue", "--out", tmp / "r"], ["-p expects name=value"]),
        (["occupancy", "--device", "nope", "--threads", "256", "--regs", "64", "--smem", "0"], ["unknown device 'nope'"]),
        (["occupancy", "--device", "h200", "--threads", "0", "--regs", "64", "--smem", "0"], ["threads_per_block=0"]),
        (["occupancy", "--device", "h200", "--threads", "256", "--regs", "64", "--smem", "-1"], ["smem_per_block=-1"]),
        (["forensics", "--cases", "nope", "--out", tmp / "f"], ["unknown case 'nope'"]),
        (["forensics", "--shapes", "1x2", "--out", tmp / "f"], ["expected NTxODxID"]),
        (["sweep", "/nonexistent.yaml"], ["does not exist"]),
        (["prefill", "--model", "synthetic-7b", "--prompt-ids", "-1", "5"], ["prompt ids must be non-negative"]),
        (["decompose", "--model", "synthetic-7b", "--nt", "0"], ["--nt: 0 is less than 1"]),
    ]


def test_every_class8_case_is_a_clean_refusal(tmp_path, tiny):
    cases = _cases(tmp_path, tiny)
    with ThreadPoolExecutor(max_workers=3) as ex:
        results = list(ex.map(lambda c: labkernels(*c[0], timeout=180), cases))
    for (argv, fragments), r in zip(cases, results):
        assert_clean_error(r, *fragments)
    assert not (tmp_path / "g").exists() and not (tmp_path / "r").exists()   # refused before anything ran


def test_no_command_prints_a_traceback_for_an_unknown_option_or_a_missing_value(tmp_path):
    argvs = [[c, "--no-such-option"] for c in _subcommands()]
    argvs += [["run", "01", "-p"], ["peers", "nope"], ["nope"], []]
    with ThreadPoolExecutor(max_workers=3) as ex:
        results = list(ex.map(lambda a: labkernels(*a, timeout=180), argvs))
    for argv, r in zip(argvs, results):
        assert_clean_error(r)
        assert "usage:" in r.stderr, (argv, r.stderr)


def test_an_error_that_escaped_the_checks_is_named_as_one(capsys, monkeypatch):
    """The net under every command: an exception that is not one of the lab's still prints one line (no
    traceback), and says that a check is missing -- the line the tests above look for."""
    from labkernels import records_admin

    def boom(args):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(records_admin, "check_data_main", boom)
    assert cli.main(["check-data"]) == 2
    err = capsys.readouterr().err
    assert "TypeError: unsupported operand" in err and "an unexpected error" in err and "Traceback" not in err
