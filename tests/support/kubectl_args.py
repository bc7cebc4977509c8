"""What a `kubectl` command line in the docs names: kubectl's own argument grammar for the
verbs the docs use, so a test can hold every named object against what the install renders.

kubectl reads `delete secret a b` as two Secrets `a` and `b`, and `delete secret/a lease/b`
as one Secret and one Lease: the first spelling of "a Secret and a Lease" deletes a Secret
named `lease`. `--dry-run=client` cannot show it here (kubectl still asks the apiserver's
discovery for the kinds), so the grammar is applied directly (kubectl's
`ResourceBuilder.ResourceTypeOrNameArgs`): if any argument holds a `/`, every argument is
TYPE/NAME; otherwise the first is TYPE (or TYPE,TYPE) and the rest are names.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from . import docs

# kubectl's names for the kinds the docs touch: plural, singular and short names
# (`kubectl api-resources`), lower case.
KINDS: dict[str, str] = {}
for _kind, _names in {
    "Pod": ("pods", "pod", "po"), "Service": ("services", "service", "svc"),
    "Deployment": ("deployments", "deployment", "deploy"), "Secret": ("secrets", "secret"),
    "Lease": ("leases", "lease"), "Namespace": ("namespaces", "namespace", "ns"),
    "ServiceAccount": ("serviceaccounts", "serviceaccount", "sa"), "ConfigMap": ("configmaps", "configmap", "cm"),
    "MutatingWebhookConfiguration": ("mutatingwebhookconfigurations", "mutatingwebhookconfiguration"),
    "PodDisruptionBudget": ("poddisruptionbudgets", "poddisruptionbudget", "pdb"),
    "Role": ("roles", "role"), "RoleBinding": ("rolebindings", "rolebinding"),
    "ClusterRole": ("clusterroles", "clusterrole"), "ClusterRoleBinding": ("clusterrolebindings", "clusterrolebinding"),
    "Certificate": ("certificates", "certificate", "cert"), "Issuer": ("issuers", "issuer"),
}.items():
    for _name in _names:
        KINDS[_name] = _kind
CLUSTER_SCOPED = {"Namespace", "MutatingWebhookConfiguration", "ClusterRole", "ClusterRoleBinding"}

# Flags that take a value (as `-x V`, `--xx V` or `--xx=V`); every other flag takes none.
_VALUE_FLAGS = {"-n", "--namespace", "--context", "--kubeconfig", "-l", "--selector", "-o", "--output", "-c",
                "--container", "-L", "--label-columns", "-f", "--filename", "-k", "--kustomize", "--tail",
                "--field-selector", "--timeout", "--for", "--since", "--pod-selector"}
# Verbs whose positional arguments name objects, and how many words the verb has.
_VERBS = {"get": 1, "delete": 1, "describe": 1, "label": 1, "annotate": 1, "logs": 1, "port-forward": 1,
          "rollout": 2, "create": 1, "apply": 1, "wait": 1, "edit": 1, "patch": 1, "run": 1, "set": 2, "debug": 1,
          "drain": 1, "cordon": 1, "uncordon": 1}
# Verbs that name nodes of the reader's cluster, which no install has.
_NODE_VERBS = {"drain", "cordon", "uncordon"}

_PLUGINS = {"initshift", "plugin"}


class KubectlSyntaxError(ValueError):
    pass


@dataclass(frozen=True)
class Named:
    """One object a command names: its kind, name and namespace (None: the context's)."""

    verb: str
    kind: str
    name: str
    namespace: str | None


def commands(text: str) -> list[str]:
    """Every kubectl command of a page: lines of fenced shell blocks (continuations joined,
    comments dropped) and inline code spans that start with `kubectl `."""
    out, fenced, lang, pending = [], False, "", ""
    for line in text.splitlines():
        fence = docs.FENCE.match(line.lstrip())
        if fence:
            fenced, lang = not fenced, line.lstrip()[3:].strip()
            continue
        if fenced and lang in ("sh", "bash", "shell", "console"):
            line = pending + line.strip()
            if line.endswith("\\"):
                pending = line[:-1].rstrip() + " "
                continue
            pending = ""
            line = line.removeprefix("$ ")
            if line.startswith("kubectl "):
                out.append(line)
        elif not fenced:
            out += [span for span in re.findall(r"`([^`]+)`", line) if span.startswith("kubectl ")]
    return out


def named(command: str) -> list[Named]:
    """The objects a kubectl command line names (per kubectl's grammar, above)."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError as e:
        raise KubectlSyntaxError(f"{command}: {e}") from None
    words = [w for w in words[1:]]
    if "|" in words:
        words = words[:words.index("|")]
    for stop in ("&", "<<'YAML'", "<<YAML", "--"):  # (after `--`: the command a container runs)
        if stop in words:
            words = words[:words.index(stop)]
    namespace, positional, all_namespaces = None, [], False
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-"):
            flag, eq, value = w.partition("=")
            if flag in _VALUE_FLAGS and not eq:
                i += 1
                value = words[i] if i < len(words) else ""
            if flag in ("-n", "--namespace"):
                namespace = value
            if flag in ("-A", "--all-namespaces"):
                all_namespaces = True
            if flag in ("-f", "--filename", "-k", "--kustomize", "-l", "--selector"):
                positional.append(None)  # objects come from files or a selector, not names
        else:
            positional.append(w)
        i += 1
    args = [a for a in positional if a is not None]
    if args and args[0] in _PLUGINS:  # `kubectl initshift ...`, `kubectl plugin list`: no objects named
        return []
    if not args or args[0] not in _VERBS:
        raise KubectlSyntaxError(f"{command}: unknown verb {args[:1]}")
    verb = " ".join(args[:_VERBS[args[0]]])
    rest = args[_VERBS[args[0]]:]
    # files, a selector, a new pod (`run NAME`), a node, or a verb named in prose
    if verb in ("apply", "run") or verb in _NODE_VERBS or None in positional or not rest:
        return []
    if verb == "logs":
        rest = rest[:1] if "/" in rest[0] else ["pod", rest[0]]
    elif verb in ("port-forward", "debug"):
        rest = rest[:1] if "/" in rest[0] else ["pod", rest[0]]
    elif verb in ("label", "annotate", "set env"):
        rest = [a for a in rest if "=" not in a and not a.endswith("-")]
    if not rest:
        return []
    ns = None if all_namespaces else namespace
    out: list[Named] = []
    if any("/" in a for a in rest):
        for a in rest:
            kind, slash, name = a.partition("/")
            if not slash or not name:
                raise KubectlSyntaxError(f"{command}: {a!r} mixes TYPE/NAME with TYPE NAME (kubectl refuses it)")
            out.append(Named(verb, _kind(command, kind), name, ns))
        return out
    kinds, names = rest[0].split(","), rest[1:]
    for kind in kinds:
        out += [Named(verb, _kind(command, kind), name, ns) for name in names]
    return out


def _kind(command: str, word: str) -> str:
    kind = KINDS.get(word.lower().split(".")[0])
    if kind is None:
        raise KubectlSyntaxError(f"{command}: {word!r} is no resource type kubectl knows here")
    return kind
