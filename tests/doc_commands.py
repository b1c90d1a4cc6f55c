"""The `fedauc` commands a document shows, and what the real command line says of each
(tests/test_docs_commands.py). Nothing is executed. A command is read from Markdown's fenced code blocks (line
continuations, `$ ` prompts, comments after `#`, pipes and `&&` lists, what runs the program: `fedauc`,
`.venv/bin/fedauc`, `python -m pipelines.cli`, after variable assignments or `time -v`), from its inline code
spans (across a paragraph's line breaks, `\\|` unescaped in tables, code spans quoted inside a longer one), and
from a Makefile's recipes (`$(VENV)/bin/fedauc`), a systemd unit's `Exec...=` lines and code spans in their
comments. Each is walked down the Click tree of the Typer app: every subcommand must exist, every option shown
must be one of that command's (or its group's), a flag takes no `=value`, a Choice option's value is one of its
choices, an int or float option's value parses, and no more arguments are given than the command takes.

What documentation writes for a reader and no shell would take is read as what it stands for: `...` or `…`
elides options and arguments, `[--kit KIT]` is optional, `sim|poc|prod` lists alternatives (each is checked),
and `<admin kit>`, `N`, `KIT`, `S_e` or `$VAR` are placeholders (a placeholder where a subcommand goes ends the
check)."""

from __future__ import annotations

import difflib
import enum
import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[\w+-]*)")
# Fenced blocks in these languages hold no shell commands: their lines are not read as commands.
_NOT_SHELL = {"python", "py", "yaml", "yml", "json", "toml", "ini", "sql", "dockerfile", "html", "csv"}
_SEPARATORS = {"|", "||", "&&", ";", "&"}
_ELISIONS = {"...", "…"}
_PROGRAM_PATH = re.compile(r"^(?:\S*/)?fedauc$")  # fedauc, .venv/bin/fedauc, $(VENV)/bin/fedauc
_PYTHON = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")
# A wrapper that runs the program after it: its options that take a value, and its own arguments before the program.
_WRAPPERS = {"time": ({"-f", "-o"}, 0), "sudo": ({"-u", "-g"}, 0), "env": (set(), 0), "nohup": (set(), 0),
             "exec": (set(), 0), "nice": ({"-n"}, 0), "timeout": ({"-s", "-k"}, 1), "flock": ({"-w", "-E"}, 1)}
# `<admin kit>`: a placeholder of several words, one word to the shell reading.
_SPACED_PLACEHOLDER = re.compile(r"<[^<>\n]*>")
_PLACEHOLDER = re.compile(r"^(?:<.*>|\{.*\}|\$.*|[A-Z][A-Z0-9_-]*|[A-Z]_[A-Za-z0-9]+|\d+)$")  # <yaml>, {x}, $VAR, KIT, S_e


@dataclass(frozen=True)
class DocCommand:
    """One `fedauc` command a document shows: where, as written, and its arguments after the program."""

    source: str
    line: int
    text: str
    args: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.text}"


def commands_in_markdown(markdown: str, source: str) -> list[DocCommand]:
    """Every `fedauc` command shown in ``markdown`` (named ``source`` in the results), in document order."""
    found: list[DocCommand] = []
    prose: list[tuple[int, str]] = []
    fence = None  # the open fence's marker, its language and its lines
    for number, line in enumerate(markdown.splitlines(), start=1):
        opened = _FENCE.match(line)
        if fence is None and opened:
            found += _commands_in_spans(prose, source)
            prose = []
            fence = (opened["fence"], opened["info"].lower(), [])
        elif fence is not None and line.strip().startswith(fence[0]) and not line.strip().strip(fence[0][0]):
            if fence[1] not in _NOT_SHELL:
                found += _commands_in_shell(fence[2], source)
            fence = None
        elif fence is not None:
            fence[2].append((number, line))
        else:
            prose.append((number, line))
    return sorted(found + _commands_in_spans(prose, source), key=lambda command: command.line)


def commands_in_config(text: str, source: str) -> list[DocCommand]:
    """The `fedauc` commands a Makefile's recipes (tab-indented lines) or a systemd unit's `Exec...=` lines
    run, and those its comments quote in code spans (a Makefile, a unit, a YAML file)."""
    shell, comments = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        executed = re.match(r"^Exec\w*=[-@+!:]*(?P<command>.*)", line)
        if line.startswith("\t") or executed:
            shell.append((number, executed["command"] if executed else line))
        elif line.lstrip().startswith("#"):
            comments.append((number, line.lstrip().lstrip("#")))
    found = _commands_in_shell(shell, source)
    for number, comment in comments:
        found += [c for span in re.findall(r"`([^`]+)`", comment)
                  for c in _commands_in_text(span, source, number, comments=False)]
    return sorted(found, key=lambda command: command.line)


def _commands_in_shell(lines: list[tuple[int, str]], source: str) -> list[DocCommand]:
    found = []
    start, pending = 0, ""
    for number, line in lines:
        if not pending:
            start = number
        stripped = line.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        if stripped.endswith("\\"):
            pending += stripped[:-1] + "\n"  # kept, so that a code span in a later line is named by its line
            continue
        found += _commands_in_text(pending + stripped, source, start, comments=True)
        pending = ""
    return found


def _commands_in_spans(lines: list[tuple[int, str]], source: str) -> list[DocCommand]:
    """The commands in the inline code spans of prose lines: a span may run over line breaks, never over a
    blank line (a paragraph's end)."""
    found = []
    paragraph: list[tuple[int, str]] = []
    for number, line in [*lines, (0, "")]:
        if line.strip():
            paragraph.append((number, line))
            continue
        if paragraph:
            text = "\n".join(line for _, line in paragraph)
            for span in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, re.DOTALL):
                number = paragraph[0][0] + text.count("\n", 0, span.start())
                code = span[2].replace("\\|", "|").strip()
                found += _commands_in_text(code, source, number, comments=False)
        paragraph = []
    return found


def _commands_in_text(text: str, source: str, line: int, comments: bool) -> list[DocCommand]:
    """The commands of one shell line or code span, and of the code spans it quotes (in a comment, or in a
    printed message: ``error: ... run `fedauc preprocess` ...``)."""
    found = []
    for span in re.finditer(r"`([^`]+)`", text):
        found += _commands_in_text(span[1], source, line + text.count("\n", 0, span.start()), comments=False)
    text = re.sub(r"`[^`]*`", " ", text).replace("\n", " ")
    text = _SPACED_PLACEHOLDER.sub(lambda m: re.sub(r"[\s'\"]+", "_", m[0]), text)
    try:
        tokens = shlex.split(text, comments=comments)
    except ValueError:  # an apostrophe in prose after the command: read it word by word
        tokens = (text.split(" #")[0] if comments else text).split()
    for segment in _segments(tokens):
        args = _after_program(segment)
        if args:
            found.append(DocCommand(source, line, " ".join(["fedauc", *args]), tuple(args)))
    return found


def _segments(tokens: list[str]) -> list[list[str]]:
    """A command list split at pipes, `&&`, `||` and `;`: each segment runs one program."""
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token in _SEPARATORS:
            segments.append([])
        elif token.endswith(";") and token != ";":
            segments[-1].append(token[:-1])
            segments.append([])
        else:
            segments[-1].append(token)
    return segments


def _after_program(segment: list[str]) -> list[str] | None:
    """The arguments after `fedauc` where the segment runs it (after variable assignments and a wrapper such
    as `time -v` or `sudo -u user`); None where it runs another program, or fedauc with no argument."""
    at = 0
    while at < len(segment) and re.match(r"^[A-Za-z_]\w*=", segment[at]):
        at += 1
    if at < len(segment) and segment[at].rsplit("/", 1)[-1] in _WRAPPERS:
        takes_value, positionals = _WRAPPERS[segment[at].rsplit("/", 1)[-1]]
        at += 1
        while at < len(segment) and segment[at].startswith("-"):
            at += 2 if segment[at] in takes_value else 1
        at += positionals
    program = segment[at:]
    if program and _PROGRAM_PATH.match(program[0]):
        return program[1:] or None
    if program and _PYTHON.match(program[0]) and program[1:3] == ["-m", "pipelines.cli"]:
        return program[3:] or None
    return None


def problems_of(command: DocCommand, cli) -> list[str]:
    """What ``cli`` (the root Click command: ``typer.main.get_command(app)``) does not accept in ``command``."""
    context = cli.context_class(cli, info_name="fedauc")
    node, path = cli, ["fedauc"]
    args = [_unbracket(arg) for arg in command.args]
    at = 0
    while hasattr(node, "list_commands"):  # a group: its own options, then one of its commands
        while at < len(args) and args[at].startswith("-"):
            problem, at = _read_option(args, at, node, context, path)
            if problem:
                return [problem]
        if at >= len(args) or args[at] in _ELISIONS or _PLACEHOLDER.match(args[at]):
            return []
        name = args[at]
        sub = node.get_command(context, name)
        if sub is None:
            return [f"`{' '.join(path)}` has no command '{name}' {_suggest(name, node.list_commands(context))}"]
        node, path, at = sub, [*path, name], at + 1
        context = node.context_class(node, parent=context, info_name=name)
    problems, positionals, unsure = [], 0, False
    while at < len(args):
        if args[at] in _ELISIONS:
            at += 1
        elif args[at] == "--":
            positionals += len([a for a in args[at + 1:] if a not in _ELISIONS])
            break
        elif args[at].startswith("-") and len(args[at]) > 1:
            problem, at = _read_option(args, at, node, context, path)
            if problem:
                problems.append(problem)
                unsure |= " has no option " in problem  # whether the word after it was its value is unknown
        else:
            positionals, at = positionals + 1, at + 1
    accepted = [p.nargs for p in node.get_params(context) if p.param_type_name == "argument"]
    if -1 not in accepted and positionals > sum(accepted) and not unsure and not set(args) & _ELISIONS:
        problems.append(f"`{' '.join(path)}` takes {sum(accepted)} argument(s), the docs give {positionals}")
    return problems


def _suggest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f"(did you mean {close[0]}?)" if close else f"(it has: {', '.join(known)})"


def _unbracket(arg: str) -> str:
    """`[--kit` and `KIT]` of a synopsis's optional part as the words they bracket."""
    return arg.lstrip("[").rstrip("]") or arg


def _read_option(args: list[str], at: int, node, context, path: list[str]) -> tuple[str | None, int]:
    """Reads the option at ``args[at]`` (with its value, if it takes one); returns a problem or None, and
    where the next word is."""
    word = args[at]
    name, _, inline = word.partition("=") if word.startswith("--") else (word, "", "")
    options = {opt: p for p in node.get_params(context) if p.param_type_name == "option"
               for opt in (*p.opts, *p.secondary_opts)}
    if name not in options and not word.startswith("--") and word[:2] in options and len(word) > 2:
        name, inline = word[:2], word[2:]  # `-I8`: a short option and its value in one word
    where = f"`{' '.join(path)}`"
    option = options.get(name)
    if option is None:
        return f"{where} has no option {name} {_suggest(name, sorted(options))}", at + 1
    if option.is_flag or option.count:
        if inline:
            return f"{where} option {name} is a flag and takes no value (the docs give '{word}')", at + 1
        return None, at + 1
    # A value-taking option shown alone (`fedauc prune --older-than-days`) names it; the next option is not
    # its value.
    values = [inline] if inline else [v for v in args[at + 1:at + 1 + option.nargs] if not v.startswith("--")]
    next_at = at + 1 if inline else at + 1 + len(values)
    choices, number = _choices(option), _number_type(option)
    for value in values:
        for alternative in value.split("|"):
            if value in _ELISIONS or _PLACEHOLDER.match(alternative):
                continue
            if choices is not None and not _is_choice(alternative, choices, option):
                return (f"{where} option {name} takes one of {', '.join(choices)}, "
                        f"not '{alternative}'"), next_at
            if number is not None and not _parses(number, alternative):
                return f"{where} option {name} takes {number.__name__} values, not '{alternative}'", next_at
    return None, next_at


def _number_type(option) -> type | None:
    """int or float where the option takes one (its annotation, or for a list option, its items')."""
    descriptor = getattr(option, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    annotation = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
    if annotation is None:  # plain Click: its ParamType names the Python type it converts to
        annotation = {"integer": int, "float": float}.get(getattr(getattr(option, "type", None), "name", ""))
    return annotation if annotation in (int, float) else None


def _parses(number: type, value: str) -> bool:
    try:
        number(value)
    except ValueError:
        return False
    return True


def _choices(option) -> list[str] | None:
    """The values a Choice option takes: Click's Choice type where the parameter has one, else the choices
    Typer derives from its annotation (an Enum or Literal): Typer 0.29 builds its parameters' types lazily, so
    its options carry a type descriptor and no Click type."""
    declared = getattr(getattr(option, "type", None), "choices", None)
    if declared is None:
        descriptor = getattr(option, "type_descriptor", None)
        declared = getattr(descriptor, "choices", None)
    if declared is None:
        return None
    return [str(c.value) if isinstance(c, enum.Enum) else str(c) for c in declared]


def _is_choice(value: str, choices: list[str], option) -> bool:
    case_sensitive = getattr(getattr(option, "type", None), "case_sensitive", None)
    if case_sensitive is None:
        case_sensitive = getattr(getattr(option, "type_descriptor", None), "case_sensitive", True)
    return value in choices or (not case_sensitive and value.lower() in {c.lower() for c in choices})


def documented_commands(root: Path, markdown_files: list[Path], config_files: list[Path]) -> list[DocCommand]:
    """The commands of the given Markdown and configuration files, named by their paths relative to root."""
    found = []
    for path in markdown_files:
        found += commands_in_markdown(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    for path in config_files:
        found += commands_in_config(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return found
