"""The command line as a newcomer reads it: every option of the commands that start GPU work, record runs or
build the peer says what it does; gpu-check writes into a folder git ignores and reports skipped GPU tests as
skipped."""
import argparse
import re
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


# ------------------------------------------------------------------ what the docs and pages tell the reader to run
def _reader_files() -> list:
    """The README, docs/*.md, the notebooks' sources and the templates and plans a reader opens."""
    return ([REPO_ROOT / "README.md"] + sorted((REPO_ROOT / "docs").glob("*.md"))
            + sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
            + sorted(p for p in (REPO_ROOT / "labkernels" / "templates").rglob("*") if p.is_file())
            + sorted((REPO_ROOT / "labkernels" / "plans").glob("*.yaml")))


#: the one sentence that names the old flat names, as the aliases they are (docs/developing.md)
ALIAS_SENTENCE = re.compile(r"The old flat names \([^)]*\)[^.]*\.", re.S)


def _old_flat_mentions(text: str) -> list:
    """Each place ``text`` tells the reader an old flat command: ``labkernels gpu-check ...``, ``labkernels run 03``,
    or a hyphenated one as a command line of its own (```gpu-check --steps X```, ```check-data```) -- the alias
    sentence left out."""
    old = sorted({o for _, verbs in cli.TREE.values() for o in verbs.values()}, key=len, reverse=True)
    text = ALIAS_SENTENCE.sub("", text)
    hits = re.findall(r"(?<![\w./-])labkernels\s+(?:%s)(?![\w-])" % "|".join(map(re.escape, old)), text)
    for noun, (_, verbs) in cli.TREE.items():
        for verb, o in verbs.items():
            if "-" in o:     # a verb of the same name (report results-table) is the tree's own
                keep = f"(?<!{noun} )" if verb == o else ""
                hits += re.findall(r"(?<![\w./-])(?<!labkernels )%s%s(?:\s+--\w[\w-]*|(?=`))" % (keep, re.escape(o)),
                                   text)
    return hits


def test_the_docs_and_pages_name_no_old_flat_command():
    bad = {f.relative_to(REPO_ROOT).as_posix(): _old_flat_mentions(f.read_text()) for f in _reader_files()}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"old flat command names told to the reader (say labkernels NOUN VERB): {bad}"
    assert ALIAS_SENTENCE.search((REPO_ROOT / "docs" / "developing.md").read_text()), "the alias sentence is gone"
    assert sorted(_old_flat_mentions("run `labkernels gpu-check --steps x`, `check-data`, import-runs --x, "
                                     "labkernels run 03; not labkernels report run 03, labkernels.prefill, "
                                     ".gpu/gpu-check/, <!-- /results-table -->, `labkernels report results-table "
                                     "--write`, The old flat names (`gpu-check`, ...) still parse.")) == [
        "check-data", "import-runs --x", "labkernels gpu-check", "labkernels run"]


def _noun_verb_lines(text: str, ap) -> list:
    """(noun, verb or None, the options that follow on its line) of every ``labkernels NOUN [VERB]`` in ``text``."""
    top = _sub(ap)
    nouns = "|".join(map(re.escape, [*cli.TREE, *cli.OWN_NOUNS]))
    out = []
    for m in re.finditer(r"(?<![\w./-])labkernels\s+(%s)(?![\w-])([^\n`)\"#]*)" % nouns, text):
        noun, rest = m.group(1), m.group(2)
        verbs = [a for a in _sub(ap, noun)._actions if isinstance(a, argparse._SubParsersAction)]
        verb = None
        if verbs:
            w = re.match(r"\s+([\w-]+)", rest)
            verb = w.group(1) if w else ""
            rest = rest[w.end():] if w else rest
        out.append((noun, verb, re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)))
    assert top is ap
    return out


def test_every_noun_verb_command_the_docs_and_pages_give_parses(capsys):
    """Every ``labkernels NOUN VERB`` line of the README, docs/, the notebooks, templates and plans names a command of
    the tree (its ``--help`` exits 0) and only options that command has."""
    ap = cli.build_parser()
    seen, bad = set(), []
    for f in _reader_files():
        for noun, verb, opts in _noun_verb_lines(f.read_text(), ap):
            path = (noun,) + ((verb,) if verb is not None else ())
            if path not in seen:
                seen.add(path)
                with pytest.raises(SystemExit) as e:
                    ap.parse_args([*path, "--help"])
                capsys.readouterr()
                if e.value.code != 0:
                    bad.append(f"{f.name}: labkernels {' '.join(path)} (--help exits {e.value.code})")
                    continue
            known = _sub(ap, *path)._option_string_actions
            bad += [f"{f.name}: labkernels {' '.join(path)} has no {o}" for o in opts if o not in known]
    assert not bad, bad
    assert {("gpu", "check"), ("data", "check"), ("report", "run"), ("model", "prefill"), ("kernels", "audit")} <= seen
