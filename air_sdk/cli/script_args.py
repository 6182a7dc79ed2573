"""Where `air submit`'s own flags end and the script's arguments begin (torchrun's rule).

torchrun gives everything after the script to the script. `air submit` does the
same, with one allowance so `air submit train.py --nodes 2 --follow` keeps working:
flags `air submit` knows may still follow SCRIPT, up to the first token it does not
know (an unknown option such as `--epochs`, or a plain word); from there on every
token is the script's. `--` ends `air submit`'s flags at once (for a script option
that `air submit` also has, e.g. `-- --nodes 4`). Without `--`, a script argument that
is one of `air submit`'s flags or a near miss of one (`--node`, `--folow`) gets a
warning that says where to put it; an unknown flag before SCRIPT gets "did you mean". `-m MODULE` stands where SCRIPT
would (torchrun's `-m`).

    air submit train.py --nodes 2 --epochs 3 --lr 0.1   # args: --epochs 3 --lr 0.1
    air submit train.py --nodes 2 -- --nodes 4          # args: --nodes 4
    air submit -m pkg.train --epochs 3                  # args: --epochs 3

Example:
    >>> flags = {"--nodes": True, "-n": True, "--follow": False, "-m": True, "--module": True}
    >>> split_script_args(["train.py", "--nodes", "2", "--epochs", "3"], flags)
    (['train.py', '--nodes', '2'], ['--epochs', '3'])
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping, Sequence

# typer vendors click (typer._click); its commands take these, not the click package's
from typer._click.core import Context
from typer._click.exceptions import UsageError
from typer.core import TyperCommand

__all__ = ["ScriptCommand", "UnknownOption", "split_script_args", "stray_flags"]

#: flags that name the program instead of SCRIPT (their value stands where SCRIPT would)
MODULE_FLAGS = ("-m", "--module")


class UnknownOption(ValueError):
    """An option `air submit` does not know, before SCRIPT (so not the script's)."""


def _flag_and_value(token: str, takes_value: Mapping[str, bool]) -> tuple[str, bool]:
    """(the flag a token names, whether its value is inside it: `--nodes=2`, `-n2`)."""
    if token.startswith("--"):
        name, eq, _ = token.partition("=")
        return name, bool(eq)
    if len(token) > 2 and takes_value.get(token[:2], False):
        return token[:2], True  # -n2, -mpkg.train
    return token, False


def split_script_args(
    tokens: Sequence[str], takes_value: Mapping[str, bool]
) -> tuple[list[str], list[str]]:
    """(`air submit`'s own tokens, the script's arguments) by the module docstring's rule.

    `takes_value` maps each flag `air submit` knows to whether it takes a value. An
    unknown option before the program is an `UnknownOption`.

    Example:
        >>> flags = {"--nodes": True, "--follow": False, "-m": True}
        >>> split_script_args(["-m", "pkg.train", "data.csv", "--follow"], flags)
        (['-m', 'pkg.train'], ['data.csv', '--follow'])
        >>> split_script_args(["train.py", "--follow", "--", "--follow"], flags)
        (['train.py', '--follow'], ['--follow'])
    """
    own: list[str] = []
    program_seen = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "--":
            if program_seen:
                return own, list(tokens[i + 1 :])
            # `air submit [flags] -- SCRIPT ARGS...`: SCRIPT is the next token
            if i + 1 < len(tokens):
                own.append(tokens[i + 1])
            return own, list(tokens[i + 2 :])
        if token.startswith("-") and token != "-":
            flag, inline_value = _flag_and_value(token, takes_value)
            if flag not in takes_value:
                if program_seen:
                    return own, list(tokens[i:])
                near = _near_miss(flag, takes_value)
                if near:
                    raise UnknownOption(f"No such option: {flag} (did you mean {near}?)")
                raise UnknownOption(
                    f"No such option: {flag} (the script's own options go after SCRIPT:"
                    f" air submit [OPTIONS] SCRIPT {flag} ...)"
                )
            own.append(token)
            i += 1
            if takes_value[flag] and not inline_value and i < len(tokens):
                own.append(tokens[i])
                i += 1
            if flag in MODULE_FLAGS:
                program_seen = True
            continue
        if program_seen:
            return own, list(tokens[i:])
        own.append(token)  # SCRIPT
        program_seen = True
        i += 1
    return own, []


def _near_miss(flag: str, takes_value: Mapping[str, bool]) -> str | None:
    """The long flag `flag` was probably meant to be (`--node` -> `--nodes`), if any."""
    if not flag.startswith("--"):
        return None
    longs = [f for f in takes_value if f.startswith("--")]
    found = difflib.get_close_matches(flag, longs, n=1, cutoff=0.8)
    return found[0] if found else None


def stray_flags(script_args: Sequence[str], takes_value: Mapping[str, bool]) -> list[str]:
    """Warnings for the script's arguments that look like `air submit`'s own flags
    (the same, or a near miss such as `--node`): torchrun's rule gives them to the
    script, which is rarely what was meant after the script's first argument.

    Example:
        >>> flags = {"--nodes": True, "--follow": False}
        >>> for line in stray_flags(["--steps", "40", "--follow", "--node", "2"], flags):
        ...     print(line)
        --follow went to the script (what follows its first argument is the script's): for air's own, put it before SCRIPT; for the script's, after `--`
        --node went to the script (what follows its first argument is the script's): did you mean air's --nodes? Put it before SCRIPT; for the script's own, after `--`
    """
    said = []
    for token in script_args:
        if not token.startswith("--") or token == "--":
            continue
        flag = token.partition("=")[0]
        where = f"{flag} went to the script (what follows its first argument is the script's)"
        if flag in takes_value:
            said.append(
                f"{where}: for air's own, put it before SCRIPT; for the script's, after `--`"
            )
        elif near := _near_miss(flag, takes_value):
            said.append(
                f"{where}: did you mean air's {near}? Put it before SCRIPT; for the script's"
                " own, after `--`"
            )
    return said


class ScriptCommand(TyperCommand):
    """A typer command whose trailing tokens, by `split_script_args`, go to its `args`
    parameter untouched by click (so `--epochs 3` is not "No such option"); it needs
    its `script` argument or its `module` option."""

    #: the parameter that receives the script's arguments
    args_param = "args"
    #: the program: a script argument, or a module option standing in for it
    script_param = "script"
    module_param = "module"

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        takes_value: dict[str, bool] = {}
        for param in self.get_params(ctx):
            if param.param_type_name == "option":
                for flag in (*param.opts, *param.secondary_opts):
                    takes_value[flag] = not getattr(param, "is_flag", False) and not getattr(
                        param, "count", False
                    )
        try:
            own, script_args = split_script_args(args, takes_value)
        except UnknownOption as exc:
            raise UsageError(str(exc), ctx) from None
        rest = super().parse_args(ctx, own)
        boundary = len(args) - len(script_args) - 1
        if script_args and not (boundary >= 0 and args[boundary] == "--"):
            for line in stray_flags(script_args, takes_value):
                sys.stderr.write(f"warning: {line}\n")
        if ctx.params.get(self.script_param) is None and not ctx.params.get(self.module_param):
            raise UsageError("give SCRIPT, or -m MODULE to run `python -m MODULE`", ctx)
        ctx.params[self.args_param] = script_args
        return rest
