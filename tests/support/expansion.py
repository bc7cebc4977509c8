"""The kubelet's `$(VAR)` expansion of a container's `command` and `args`, as Kubernetes'
third_party/forked/golang/expansion `Expand` does it: `$(NAME)` becomes the variable's value
when the container defines it and stays as written when it does not; `$$` becomes `$`; any
other `$` stays. The tests run what initshift writes into `args` through it, as the kubelet
would before the waiter sees it."""

from __future__ import annotations

from typing import Mapping, Sequence


def expand(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and (close := text.find(")", i + 2)) >= 0:
            name = text[i + 2:close]
            out.append(env[name] if name in env else f"$({name})")
            i = close + 1
        else:  # `$x`, or `$(` never closed: the operator and the next character as written
            out.append(text[i:i + 2])
            i += 2
    return "".join(out)


def expand_all(words: Sequence[str], env: Mapping[str, str]) -> list[str]:
    return [expand(w, env) for w in words]
