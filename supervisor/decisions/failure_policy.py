"""Failure-aware restarts: the `policy:` section of a job file, per failure kind.

    policy:
      oom:                      # a failure kind (see classify.Kind) or `diverged`
        max_restarts: 2         # restarts after this kind before giving up (default: no own budget)
        env: {PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True"}
        args: [--batch-size, "{batch_size / 2}"]

After an attempt of that kind, `env` is merged into the environment of every later attempt and
`args` into its argv: an option (`--x V`, `--x=V`) that the argv already has gets its value
replaced in place, a flag or plain argument the argv already has is not added twice, anything
else is appended. Changes accumulate (a second OOM halves the batch size again).

Templates in `args` values: `{name}` or `{name OP NUMBER}` with OP one of + - * / //. `name` is the
current value of the option `--name` (dashes as underscores) in the attempt's argv, read as a
number. On whole numbers `/` is floor division and the result of a division is at least 1 (so a
batch size halves 8, 4, 2, 1, 1). No other syntax: no names outside the argv, no eval.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, Mapping, Optional, Sequence

from .classify import Kind
from ..errors import ConfigError

__all__ = ["KindRule", "parse_policy", "render_args", "apply_rule", "option_values", "check_templates", "POLICY_KINDS"]

POLICY_KINDS = tuple(k.value for k in Kind if k is not Kind.SUCCESS)
_RULE_KEYS = ("max_restarts", "env", "args")
_TEMPLATE = re.compile(r"\{([^{}]*)\}")
_EXPR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:(//|[-+*/])\s*(\d+(?:\.\d+)?)\s*)?$")


@dataclasses.dataclass(frozen=True)
class KindRule:
    kind: str
    max_restarts: Optional[int] = None
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    hint = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else f"; known: {', '.join(choices)}"


def parse_policy(value: Any) -> tuple[KindRule, ...]:
    """The YAML `policy:` mapping -> rules; every problem is a one-line ConfigError."""
    if not isinstance(value, Mapping):
        raise ConfigError("policy: expected a mapping of failure kind to {max_restarts, env, args}")
    rules = []
    for kind, body in value.items():
        kind = str(kind)
        if kind not in POLICY_KINDS:
            raise ConfigError(f"policy: unknown failure kind {kind!r}{_did_you_mean(kind, POLICY_KINDS)}")
        where = f"policy.{kind}"
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise ConfigError(f"{where}: expected a mapping with keys {', '.join(_RULE_KEYS)}")
        for key in body:
            if key not in _RULE_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r}{_did_you_mean(str(key), _RULE_KEYS)}")
        budget = body.get("max_restarts")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ConfigError(f"{where}.max_restarts: expected a whole number >= 0, got {budget!r}")
        env = body.get("env") or {}
        if not isinstance(env, Mapping):
            raise ConfigError(f"{where}.env: expected a mapping of NAME: value, got {env!r}")
        args = body.get("args") or []
        if isinstance(args, str) or not isinstance(args, (list, tuple)) or not all(isinstance(a, (str, int, float)) for a in args):
            raise ConfigError(f"{where}.args: expected a list of strings, got {args!r}")
        args = tuple(str(a) for a in args)
        for a in args:
            for expr in _TEMPLATE.findall(a):
                if not _EXPR.match(expr):
                    raise ConfigError(f"{where}.args: template {{{expr}}} is not `{{name}}` or `{{name OP NUMBER}}` "
                                      "with OP one of + - * / //")
        rules.append(KindRule(kind, budget, tuple(sorted((str(k), str(v)) for k, v in env.items())), args))
    return tuple(rules)


def option_values(argv: Sequence[str]) -> dict[str, str]:
    """`--batch-size 8` / `--batch-size=8` -> {"batch_size": "8"} (the last occurrence wins, as argparse)."""
    out: dict[str, str] = {}
    for i, tok in enumerate(argv):
        if not tok.startswith("--") or len(tok) < 3:
            continue
        if "=" in tok:
            name, val = tok[2:].split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            name, val = tok[2:], argv[i + 1]
        else:
            continue
        out[name.replace("-", "_")] = val
    return out


def _number(text: str) -> int | float:
    return int(text) if re.fullmatch(r"-?\d+", text) else float(text)


def _evaluate(expr: str, values: Mapping[str, str], where: str) -> str:
    m = _EXPR.match(expr)
    assert m is not None  # checked by parse_policy
    name, op, operand = m.groups()
    if name not in values:
        raise ConfigError(f"{where}: template {{{expr}}} names --{name.replace('_', '-')}, which the job's argv does not have")
    try:
        x = _number(values[name])
    except ValueError:
        raise ConfigError(f"{where}: --{name.replace('_', '-')} is {values[name]!r}, not a number for {{{expr}}}") from None
    if op is None:
        return str(x)
    y = _number(operand)
    whole = isinstance(x, int) and isinstance(y, int)
    if op in ("/", "//"):
        if y == 0:
            raise ConfigError(f"{where}: template {{{expr}}} divides by zero")
        r = x // y if (whole or op == "//") else x / y
        r = max(r, 1) if whole else r
    else:
        r = x + y if op == "+" else x - y if op == "-" else x * y
    if isinstance(r, float) and r.is_integer() and whole:
        r = int(r)
    return str(r)


def render_args(args: Sequence[str], argv: Sequence[str], where: str = "policy") -> list[str]:
    values = option_values(argv)
    return [_TEMPLATE.sub(lambda m: _evaluate(m.group(1), values, where), a) for a in args]


def _merge_args(argv: Sequence[str], extra: Sequence[str]) -> tuple[str, ...]:
    """Replace the value of options argv already has; append the rest."""
    out = list(argv)
    i = 0
    while i < len(extra):
        tok = extra[i]
        has_value = tok.startswith("--") and "=" not in tok and i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if tok.startswith("--"):
            name = tok.split("=", 1)[0]
            for j, cur in enumerate(out):
                if cur == name and has_value and j + 1 < len(out):
                    out[j + 1] = extra[i + 1]
                    break
                if "=" in tok and cur.startswith(name + "="):
                    out[j] = tok
                    break
            else:
                if has_value or tok not in out:
                    out.extend(extra[i:i + 2] if has_value else [tok])
        elif tok not in out:
            out.append(tok)
        i += 2 if has_value else 1
    return tuple(out)


def apply_rule(rule: KindRule, argv: Sequence[str], env: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, str], list[str]]:
    """(new argv, new env overrides, rendered args) after a failure of rule.kind."""
    rendered = render_args(rule.args, argv, f"policy.{rule.kind}.args")
    return _merge_args(argv, rendered), {**env, **dict(rule.env)}, rendered


def check_templates(rules: Sequence[KindRule], argv: Sequence[str]) -> None:
    """Fail at start-up, not at the first OOM, when a template names an option the job lacks."""
    for rule in rules:
        render_args(rule.args, argv, f"policy.{rule.kind}.args")
