"""The command line as a newcomer reads it: every option of the commands that start GPU work, record runs or
build the peer says what it does; gpu-check writes into a folder git ignores and reports skipped GPU tests as
skipped."""
import argparse
import subprocess

import pytest

from labkernels import cli, gpu_checks, gpu_cli
from labkernels.paths import REPO_ROOT


def _sub(parser, *path):
    for name in path:
        act = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = act.choices[name]
    return parser


@pytest.mark.parametrize("path", [("gpu-check",), ("import-runs",), ("sweep",), ("run",), ("peers", "build")],
                         ids=lambda p: " ".join(p))
def test_every_option_has_help(path):
    p = _sub(cli.build_parser(), *path)
    bare = [a.option_strings or [a.dest] for a in p._actions
            if not isinstance(a, argparse._HelpAction) and a.help in (None, "") and a.help != argparse.SUPPRESS]
    assert not bare, f"labkernels {' '.join(path)}: no help for {bare}"


def test_gpu_check_writes_into_an_ignored_folder_by_default(monkeypatch):
    monkeypatch.delenv("OUT", raising=False)
    args = cli.build_parser().parse_args(["gpu-check"])
    out = REPO_ROOT / args.out if not args.out.startswith("/") else __import__("pathlib").Path(args.out)
    assert out == gpu_cli.DEFAULT_OUT and REPO_ROOT in out.parents
    r = subprocess.run(["git", "check-ignore", "-q", str(out / "gpu-check.json")], cwd=REPO_ROOT)
    assert r.returncode == 0, f"{out} is not ignored by git"


def test_skipped_gpu_tests_read_as_skipped_not_ok(tmp_path):
    xml = tmp_path / "t.xml"
    xml.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="0" failures="0" skipped="3" '
                   'tests="3"><testcase name="a"><skipped/></testcase></testsuite></testsuites>')
    c = gpu_checks.junit_counts(xml)
    assert c == {"tests": 3, "failures": 0, "errors": 0, "skipped": 3, "skipped_all": True}
    assert gpu_checks._state({"ok": True, **c}).startswith("skipped (3 of 3 tests skipped")
    xml.write_text('<testsuite errors="0" failures="0" skipped="1" tests="3"></testsuite>')
    assert gpu_checks._state({"ok": True, **gpu_checks.junit_counts(xml)}) == "ok"
    assert gpu_checks._state({"ok": False}) == "FAILED" and gpu_checks.junit_counts(tmp_path / "none.xml") == {}


def _commands(parser, path=()):
    """Every leaf command of the tree: (path, parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, p in subs[0].choices.items():
        yield from _commands(p, path + (name,))


def test_the_tree_is_noun_verb_and_every_verb_is_its_old_command():
    ap = cli.build_parser()
    top = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    listed = [c.dest for c in top._choices_actions]          # what `labkernels --help` shows
    assert listed == [*cli.TREE, *cli.OWN_NOUNS]
    for noun, (_, verbs) in cli.TREE.items():
        for verb, old in verbs.items():
            new, flat = _sub(ap, noun, verb), _sub(ap, old)
            opts = lambda p: sorted((tuple(a.option_strings), a.dest, repr(a.default)) for a in p._actions)  # noqa: E731
            assert opts(new) == opts(flat), f"labkernels {noun} {verb} differs from labkernels {old}"
            assert new.get_default("func") is flat.get_default("func") is not None
    args = ap.parse_args(["data", "check", "--root", "/nonexistent"])
    assert (args.command, args.verb, args.root) == ("data", "check", "/nonexistent")


def test_every_option_of_every_command_has_help_and_shows_its_default():
    ap = cli.build_parser()
    bare = []
    for path, p in _commands(ap):
        bare += [(" ".join(path), a.option_strings or [a.dest]) for a in p._actions
                 if not isinstance(a, argparse._HelpAction) and a.help in (None, "") and a.option_strings]
    assert not bare, f"options without help: {bare}"
    text = _sub(ap, "gpu", "check").format_help()
    assert "timed launches per point of the benchmark steps (default: 20)" in " ".join(text.split())
    assert "(default: None)" not in text


def test_a_lab_error_names_the_noun_and_verb(capsys):
    rc = cli.main(["model", "layout", "--model", "/nonexistent/model.gguf"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("labkernels model layout: error: ModelError:"), err
    rc = cli.main(["layout", "--model", "/nonexistent/model.gguf"])      # the old flat name: the same check
    assert rc == 2 and capsys.readouterr().err.startswith("labkernels layout: error: ModelError:")
