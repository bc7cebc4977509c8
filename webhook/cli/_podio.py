"""Reading Pods, AdmissionReviews and workloads from YAML or JSON, for the command line:
one Pod for `review`, every object of a manifest for `mutate`; and writing what they print."""

from __future__ import annotations

import copy
import errno
import json
import math
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from .. import jsontext
from ..admission import API_V1, KIND, BadReview, parse_review
from ..errors import InitshiftError
from ..rewrite import MAX_DEPTH, depth_problem


class InputError(InitshiftError, ValueError):
    """The input is not a Pod or an AdmissionReview of a Pod; the message says why."""


# Workloads whose pod template `initshift mutate` rewrites in place: kind -> template path.
# A ReplicationController is core v1, still served, and its spec.template is a pod template
# as a ReplicaSet's is.
_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    **{kind: ("spec", "template") for kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job")},
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "ReplicationController": ("spec", "template"),
}

# The group/version each kind is read as, as kubectl decides by apiVersion, never by kind
# alone: a Volcano `Job` (batch.volcano.sh/v1alpha1) is not batch/v1's. Only what Kubernetes
# 1.28 (initshift's oldest) serves: batch/v1beta1 CronJobs (gone in 1.25) and the
# extensions/v1beta1, apps/v1beta1 and apps/v1beta2 workloads (gone in 1.16) would be
# refused by the apiserver anyway, so they pass through as other objects do. A document
# without apiVersion is taken as its kind's (a hand-written pod; kubectl would ask for one).
_API_VERSIONS: dict[str, tuple[str, ...]] = {
    "Pod": ("v1",), "ReplicationController": ("v1",),
    "AdmissionReview": ("admission.k8s.io/v1", "admission.k8s.io/v1beta1"),
    **{kind: ("apps/v1",) for kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet")},
    "Job": ("batch/v1",), "CronJob": ("batch/v1",),
}


@dataclass
class PodInput:
    pod: dict
    review: dict | None = None  # the AdmissionReview the pod came from, if any
    workload: dict | None = None  # the Deployment, Job... whose template `pod` is

    @property
    def document(self) -> dict:
        """What was read: the workload, else the pod."""
        return self.workload if self.workload is not None else self.pod

    def put(self, pod: dict, *, rewritten: bool = True) -> dict:
        """The document with `pod` in place of the one read. A workload's template that is
        not `rewritten` stays as it came: the note the rewrite leaves on a pod it does not
        rewrite (initshift.io/not-rewritten) goes on the pods the webhook admits, and on a
        template would only roll the workload out for nothing once applied."""
        if self.workload is None:
            return pod
        if not rewritten:
            return self.workload
        out = copy.deepcopy(self.workload)
        *parents, last = _TEMPLATE_PATHS[out["kind"]]
        node = out
        for key in parents:
            node = node[key]
        node[last] = pod
        return out

    @property
    def namespace(self) -> str:
        """The namespace the server would see the pod in: the review's, else the object's
        ("" when the manifest leaves it to `kubectl apply -n`)."""
        request = (self.review or {}).get("request")
        for source in ((request or {}).get("namespace") if isinstance(request, dict) else None,
                       (self.document.get("metadata") or {}).get("namespace")):
            if isinstance(source, str) and source:
                return source
        return ""

    @property
    def label(self) -> str:
        """`Kind/name` of what was read (the pod's, for a review), as kubectl names objects."""
        return label_of(self.workload if self.workload is not None else {**self.pod, "kind": "Pod"})


# Far above any object the apiserver stores (etcd's limit is 1.5 MiB) or a review the
# webhook accepts (INITSHIFT_MAX_BODY_BYTES, 4 MiB): a bigger input is the wrong file.
MAX_INPUT_BYTES = 8 * 1024 * 1024


def source_name(path: str) -> str:
    """How messages name a file: its path, or <stdin> for `-`."""
    return "<stdin>" if path == "-" else path


def read_text(path: str) -> str:
    """A file's (or stdin's) text; InputError naming the file when it cannot be read,
    is too large, binary, or not UTF-8."""
    where = source_name(path)
    try:
        if path == "-":
            if sys.stdin is None:  # started with stdin closed (`<&-`): Python has no stream for it
                raise InputError(f"cannot read {where}: standard input is closed")
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_INPUT_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read {where}: {(e.strerror or str(e)).lower()}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise InputError(f"{where}: larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB; not a manifest")
    if b"\0" in data:
        raise InputError(f"{where}: a binary file, not YAML or JSON")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


# The deepest a pod sits in what the reader accepts: a CronJob's spec.jobTemplate.spec.template,
# as one of a List's items.
_WRAPPER_DEPTH = 6
# A document may nest MAX_DEPTH (the server's rule, applied to the pod once read) plus the
# wrapper: past that, composing it would only overflow the stack.
_MAX_DOCUMENT_DEPTH = MAX_DEPTH + _WRAPPER_DEPTH
# Values a document may expand to through YAML aliases: no more than a file of
# MAX_INPUT_BYTES could hold written out (each value takes at least a byte), so only an
# alias bomb (`a: &a [x, x]`, `b: &b [*a, *a]`, ... doubling on every line) reaches it.
_MAX_VALUES = MAX_INPUT_BYTES


class _Unreadable(InitshiftError):
    """A document the reader refuses to compose (too deep, aliases that expand too far):
    what, where (`mark`), and why that is no manifest (`note`)."""

    def __init__(self, problem: str, mark: yaml.Mark, note: str) -> None:
        super().__init__(f"{problem} (line {mark.line + 1}, column {mark.column + 1}); {note}")


class _Rules(yaml.composer.Composer, yaml.constructor.SafeConstructor):
    """What both readers below hold a document to: the two bounds go-yaml (kubectl's YAML
    reader) keeps too, nesting depth and how far aliases expand (PyYAML composes
    recursively, a Python frame per level, and an alias is a shared reference that every
    later walk repeats), and values JSON holds, as kubectl reads them."""

    def _start(self) -> None:
        self._depth = 0
        self._values = 0  # values composed so far, each alias counted as what it expands to
        self._sizes: dict[str, int] = {}  # anchor -> values at and below it, once composed
        self._open: set[str] = set()  # anchors being composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise _Unreadable(f"the alias *{event.anchor} is inside the node it names", event.start_mark,
                                  "a loop JSON cannot hold")
            self._count(self._sizes.get(event.anchor, 0), event)  # an unknown alias: the composer says so
            return super().compose_node(parent, index)
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if collection and self._depth >= _MAX_DOCUMENT_DEPTH:
            raise _Unreadable(f"nests deeper than {_MAX_DOCUMENT_DEPTH} levels", event.start_mark,
                              "no Kubernetes object does")
        before, anchor = self._values, event.anchor
        self._count(1, event)
        self._depth += collection
        if anchor is not None:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= collection
            self._open.discard(anchor)
        if anchor is not None:
            self._sizes[anchor] = self._values - before
        return node

    def _count(self, values: int, event: yaml.Event) -> None:
        self._values += values
        if self._values > _MAX_VALUES:
            raise _Unreadable(f"its aliases expand to more than {_MAX_VALUES} values", event.start_mark,
                              "not a Kubernetes manifest")

    # What JSON, and so the API, can hold, as kubectl's reader (sigs.k8s.io/yaml) reads it.
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """A mapping; a key given twice is refused, as kubectl refuses it, not read as the last
        of its values (the others lost)."""
        first: dict[tuple[str, str], yaml.Mark] = {}  # (tag, text) -> where the key is first given
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in first:
                    raise _Unreadable(f"the key {key_node.value!r} is given again, first at line {first[key].line + 1}",
                                      key_node.start_mark, "kubectl refuses it too: one of its values would be lost")
                first[key] = key_node.start_mark
        return super().construct_mapping(node, deep)

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise _Unreadable(f"{node.value} is not a number JSON can hold", node.start_mark,
                              "the API takes none; quote it for a string")
        return value

    def construct_untyped(self, node: yaml.Node) -> Any:
        raise _Unreadable(f"{node.tag.replace('tag:yaml.org,2002:', '!!')} has no JSON form", node.start_mark,
                          "the API takes none")


# A date or time stays the text it is written as (kubectl's reader keeps it a string), not a
# Python date that JSON cannot hold; a binary, a set or ordered pairs have no JSON form.
_Rules.add_constructor("tag:yaml.org,2002:timestamp", _Rules.construct_yaml_str)
_Rules.add_constructor("tag:yaml.org,2002:float", _Rules.construct_yaml_float)
for _tag in ("binary", "set", "omap", "pairs"):
    _Rules.add_constructor(f"tag:yaml.org,2002:{_tag}", _Rules.construct_untyped)


class _Loader(_Rules, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader under `_Rules`: the words of every message."""

    def __init__(self, stream: str) -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._start()


_CSafeLoader: type | None = getattr(yaml, "CSafeLoader", None)  # PyYAML built with libyaml


class _FastLoader(_Rules, _CSafeLoader or yaml.SafeLoader):
    """libyaml's scanner and parser (15 times PyYAML's, in C) under the same `_Rules`: `_Rules`'
    Composer comes before CParser's own composer, which no bound could reach (C recursion)."""

    def __init__(self, stream: str) -> None:
        (_CSafeLoader or yaml.SafeLoader).__init__(self, stream)
        yaml.composer.Composer.__init__(self)  # CParser does not set what the Python composer keeps
        self._start()


def _load_all(text: str) -> list[Any]:
    """Every document of `text`, read with libyaml where PyYAML has it. What libyaml refuses
    (or `_Rules` does) is read again by the pure-Python reader, whose messages (and line,
    column) are the ones given: libyaml's words differ, and only a bad file pays twice."""
    if _CSafeLoader is not None:
        try:
            return list(yaml.load_all(text, Loader=_FastLoader))
        except (yaml.YAMLError, _Unreadable):
            pass
    return list(yaml.load_all(text, Loader=_Loader))


def _expected(workloads: bool) -> str:
    """What a reader takes, for a message: `a Pod or an AdmissionReview of a Pod` (review),
    and a workload too (mutate)."""
    if not workloads:
        return "a Pod or an AdmissionReview of a Pod"
    return f"a Pod, an AdmissionReview of a Pod or a workload ({', '.join(_TEMPLATE_PATHS)})"


def _documents(text: str, where: str, expected: str) -> list[Any]:
    """Every non-empty YAML document (JSON is YAML); a syntax error with its line and column."""
    try:
        docs = [d for d in _load_all(text) if d is not None]  # YAML is a superset of JSON
    except _Unreadable as e:
        raise InputError(f"{where}: {e}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise InputError(f"{where}: not YAML or JSON: {at}{e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise InputError(f"{where}: not YAML or JSON: {' '.join(str(e).split())}") from None
    if not docs:
        raise InputError(f"{where}: empty; expected {expected}")
    return docs


def _kind(doc: Any) -> str:
    """What a document is, for a message: its kind, else its YAML type."""
    if isinstance(doc, dict):
        return str(doc.get("kind") or "object without a kind")
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(doc), type(doc).__name__)


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1].lower() in "aeiou" else f"a {kind}"


def label_of(doc: Any) -> str:
    """`Kind/name` (or the generateName), as kubectl names an object in its messages."""
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = (meta.get("name") or meta.get("generateName")) if isinstance(meta, dict) else None
    return f"{_kind(doc)}/{name if isinstance(name, str) and name else '(no name)'}"


def _objects(docs: list[Any]) -> list[Any]:
    """The documents, each List's items in its place (what `kubectl get -o yaml` prints for
    several objects). A typed list's items (a PodList's, from the API) carry no kind of
    their own: they get the list's."""
    out: list[Any] = []
    for doc in docs:
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if not (isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list)):
            out.append(doc)
            continue
        for item in doc["items"]:
            if kind != "List" and isinstance(item, dict) and "kind" not in item:
                item = {"apiVersion": doc.get("apiVersion"), "kind": kind[:-len("List")], **item}
            out.append(item)
    return out


def _objects_in(text: str, where: str, expected: str) -> list[Any]:
    """The objects of `text` (`_objects`); at least one, or InputError saying what was expected."""
    objs = _objects(_documents(text, where, expected))
    if not objs:
        raise InputError(f"{where}: an empty List; expected {expected}")
    return objs


def _wanted(workloads: bool) -> tuple[str, ...]:
    return ("Pod", "AdmissionReview", *(_TEMPLATE_PATHS if workloads else ()))


def _is_ours(doc: Any, workloads: bool) -> bool:
    """`doc` is what the reader rewrites: a kind it takes, of the group/version it reads
    (`_API_VERSIONS`; none given: the kind's)."""
    if not isinstance(doc, dict) or doc.get("kind") not in _wanted(workloads):
        return False
    version = doc.get("apiVersion")
    return version is None or version in _API_VERSIONS[doc["kind"]]


def _of_another_group(doc: Any) -> bool:
    """A kind initshift rewrites, named by an object of another group/version (a Volcano Job)."""
    return isinstance(doc, dict) and doc.get("kind") in _API_VERSIONS and not _is_ours(doc, True)


def passed_through_note(doc: Any) -> str | None:
    """The note for a document `mutate` prints as it came though its kind is one it
    rewrites (a Volcano or Kueue `Job`, a batch/v1beta1 CronJob): no one should take its
    unchanged template for initshift's choice. None for every other document."""
    if not _of_another_group(doc):
        return None
    own = " or ".join(_API_VERSIONS[doc["kind"]])
    return (f"{label_of(doc)} ({doc.get('apiVersion')}) is not a Pod or a workload initshift rewrites (its "
            f"{doc['kind']} is {own}'s): printed as it came")


def _described(doc: Any) -> str:
    """`a Job`, or `a Job of batch.volcano.sh/v1alpha1` when the kind is one initshift
    rewrites but the group is another: what a message says the reader got."""
    return f"{_a(_kind(doc))} of {doc.get('apiVersion')}" if _of_another_group(doc) else _a(_kind(doc))


def _missing(doc: Any) -> str | None:
    """`kind` or `apiVersion` when a document lacks it, as kubectl names what it refuses
    (Object 'Kind' is missing); None when it has both."""
    if isinstance(doc, dict):
        for field, said in (("kind", "Kind"), ("apiVersion", "apiVersion")):
            if not doc.get(field):
                return said
    return None


def _several(objs: list[Any]) -> str:
    return f"{len(objs)} objects ({', '.join(_a(_kind(d)) for d in objs)})"


def parse_pod(text: str, where: str = "<stdin>", *, workloads: bool = True) -> PodInput:
    """The one Pod in `text`: a Pod, an AdmissionReview's request.object, or (with
    `workloads`) a workload's pod template. Several objects must hold exactly one of
    those. The pod is held to the server's depth rule (`MAX_DEPTH`)."""
    expected = _expected(workloads)
    objs = _objects_in(text, where, expected)
    if len(objs) > 1:
        found = [d for d in objs if _is_ours(d, workloads)]
        if len(found) != 1:
            raise InputError(f"{where}: {_several(objs)}; expected exactly one of them to be {expected}")
        objs = found
    return _pod_input(objs[0], where, workloads)


def parse_manifests(text: str, where: str = "<stdin>") -> list[PodInput | dict]:
    """Every object in `text`, in order, a List's items one by one: a Pod, an
    AdmissionReview of a Pod or a workload as the `PodInput` to rewrite, any other object
    (a Service, a ConfigMap) as it is, as `istioctl kube-inject` passes them. A lone
    object must be one to rewrite (another kind is the wrong file), and so must one of
    several."""
    expected = _expected(True)
    objs = _objects_in(text, where, expected)
    if len(objs) == 1:
        return [_pod_input(objs[0], where, True)]
    out: list[PodInput | dict] = []
    for at, doc in enumerate(objs, 1):
        if not isinstance(doc, dict):
            raise InputError(f"{where}: {_several(objs)}; {_a(_kind(doc))} is no Kubernetes object")
        field = _missing(doc)
        if field:  # what goes on to `kubectl apply` must be whole: refused, not passed on half-known
            raise InputError(f"{where}: object {at} of {len(objs)} ({label_of(doc)}) has no {field.lower()}; "
                             f"kubectl refuses it too (Object '{field}' is missing)")
        out.append(_pod_input(doc, f"{where}, {label_of(doc)}", True) if _is_ours(doc, True) else doc)
    if not any(isinstance(o, PodInput) for o in out):
        raise InputError(f"{where}: {_several(objs)}; expected at least one of them to be {expected}")
    return out


def _pod_input(doc: Any, where: str, workloads: bool) -> PodInput:
    """`doc` as the pod to rewrite, held to the server's depth rule."""
    found = _find_pod(doc, where, workloads)
    problem = depth_problem(found.pod)
    if problem:
        raise InputError(f"{where}: {problem}; no Kubernetes object does")
    return found


def _find_pod(doc: Any, where: str, workloads: bool) -> PodInput:
    if isinstance(doc, dict) and not doc.get("kind"):
        raise InputError(f"{where}: the object has no kind; expected {_expected(workloads)} (kubectl refuses it "
                         f"too: Object 'Kind' is missing)")
    if not _is_ours(doc, workloads):
        hint = "; `initshift mutate` reads a workload's pod template" if \
            not workloads and _is_ours(doc, True) else ""
        raise InputError(f"{where}: expected {_expected(workloads)}, got {_described(doc)}{hint}")
    if doc.get("kind") == "AdmissionReview":
        request = doc.get("request")
        if not isinstance(request, dict) or not isinstance(request.get("object"), dict):
            raise InputError(f"{where}: the AdmissionReview has no request.object")
        pod = request["object"]
        if pod.get("kind", "Pod") != "Pod":
            raise InputError(f"{where}: the AdmissionReview holds {_a(_kind(pod))}, not a Pod")
        other = _not_pod_create(request, where)
        if other:
            raise InputError(f"{where}: the AdmissionReview is {other}; the webhook rewrites a Pod CREATE only "
                             f"(it lets this one pass unchanged)")
        return PodInput(pod=pod, review=doc)
    if doc.get("kind") in _TEMPLATE_PATHS:
        node: Any = doc
        for key in _TEMPLATE_PATHS[doc["kind"]]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(node.get("spec"), dict):
            raise InputError(f"{where}: the {doc['kind']} has no pod template")
        return PodInput(pod=node, workload=doc)
    if not isinstance(doc.get("spec"), dict):
        raise InputError(f"{where}: the Pod has no spec")
    return PodInput(pod=doc)


def _not_pod_create(request: dict, where: str) -> str | None:
    """What the review's request is when the server would not rewrite it, by the server's
    own reading (`parse_review`, `Review.is_pod_create`), as `an UPDATE of v1 Pod`; None
    for a Pod CREATE. A field the request leaves out is taken as a Pod CREATE's, as a
    hand-written review means (`initshift review` writes them all); one the server would
    refuse is InputError with the server's words."""
    defaults = {"uid": "", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "resource": {"resource": "pods"},
                "operation": "CREATE"}
    body = jsontext.dumps({"apiVersion": API_V1, "kind": KIND, "request": {**defaults, **request}})
    try:
        review = parse_review(body)
    except BadReview as e:
        raise InputError(f"{where}: the AdmissionReview is one the webhook refuses (HTTP 400): {e}") from None
    if review.is_pod_create:
        return None
    version = f"{review.group}/{review.version}" if review.group else review.version
    resource = "/".join(r for r in (review.resource, review.sub_resource) if r)
    on = f" ({resource})" if resource not in ("", "pods") else ""
    return _a(" ".join(w for w in (review.operation, "of", version, review.kind + on) if w))


def read_pod(path: str, *, workloads: bool = True) -> PodInput:
    """`parse_pod` of a file or `-`: `review`'s input."""
    return parse_pod(read_text(path), source_name(path), workloads=workloads)


def read_manifests(path: str) -> list[PodInput | dict]:
    """`parse_manifests` of a file or `-`: `mutate`'s input."""
    return parse_manifests(read_text(path), source_name(path))


def read_objects(path: str, kind: str, problem: Callable[[dict], str | None] = lambda _: None) -> list[dict]:
    """The objects of `kind` (LimitRange, ResourceQuota, Namespace) in a file or `-`: such documents,
    or a List of them (what `kubectl get limitranges -n NS -o yaml` prints). `problem`: what is
    wrong with one of them (fields of the wrong type), said naming the file and the object."""
    where = source_name(path)
    out: list[dict] = []
    for item in _objects(_documents(read_text(path), where, f"a {kind} or a List of them")):
        if not isinstance(item, dict) or item.get("kind") != kind:
            raise InputError(f"{where}: expected {kind}s, got {_a(_kind(item))}")
        said = problem(item)
        if said:
            raise InputError(f"{where}: {label_of(item)}: {said}")
        out.append(item)
    return out


_CSafeDumper: type | None = getattr(yaml, "CSafeDumper", None)  # PyYAML built with libyaml
_WIDTH = 1000  # columns before a long scalar is folded

# Where libyaml's emitter writes other bytes than PyYAML's own for the same document (found by
# comparing the two on generated strings; tests/cli/test_golden_mutate.py holds them to it):
# - a mapping key that is empty, holds a \r (a line break to libyaml, not to PyYAML) or nears
#   128 characters (they measure a simple key differently: characters or UTF-8 bytes, below
#   126 or up to 128) is written as a complex key (`? key`) by one of them only;
# - a double-quoted scalar (one with a character outside printable ASCII, or a space beside
#   a line break) is folded at other places once its line passes the width.
# A document with neither is written by libyaml (about 5 times faster on a large manifest);
# one with either by PyYAML, so the bytes never depend on how PyYAML was built.
_DOUBLE_QUOTED = re.compile(r"[^\n\x20-\x7e]| \n|\n ")
_ESCAPED_ASCII = re.compile(r'[\x00-\x1f\x7f"\\]')  # one character written as up to four (\x01)
_SIMPLE_KEY = 100  # characters; printable ASCII only, so bytes too
# A line is at most this deep an indent (2 columns a level, past any document the reader takes)
# plus a simple key (_SIMPLE_KEY and its quotes) plus the scalar: one within the width is
# never folded by either emitter.
_MAX_LEVELS = 150
_UNFOLDED = _WIDTH - 2 * _MAX_LEVELS - (_SIMPLE_KEY + 4)


def _written_length(text: str) -> int:
    """At most the columns `text` takes double-quoted: Python's escapes of non-ASCII are
    as long as YAML's or longer, and an ASCII one takes up to 4 where Python counted 1."""
    return len(text.encode("ascii", "backslashreplace")) + 3 * len(_ESCAPED_ASCII.findall(text)) + 2


def _libyaml_writes_alike(obj: Any) -> bool:
    """Whether libyaml's emitter writes `obj` byte for byte as PyYAML's does (see above)."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        node, level = stack.pop()
        if level > _MAX_LEVELS:
            return False
        if isinstance(node, dict):
            for key, value in node.items():
                if not (isinstance(key, str) and 0 < len(key) < _SIMPLE_KEY and key.isascii() and key.isprintable()):
                    return False
                stack.append((value, level + 1))
        elif isinstance(node, list):
            stack.extend((item, level + 1) for item in node)
        elif isinstance(node, str) and len(node) * 10 + 2 > _UNFOLDED and _DOUBLE_QUOTED.search(node) \
                and _written_length(node) > _UNFOLDED:
            return False
    return True


def dumper_for(obj: Any) -> type:
    """libyaml's safe dumper where PyYAML has it and it writes `obj` as PyYAML's own does."""
    return _CSafeDumper if _CSafeDumper is not None and _libyaml_writes_alike(obj) else yaml.SafeDumper


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2) + "\n"
    return yaml.dump(obj, Dumper=dumper_for(obj), sort_keys=False, width=_WIDTH)


def write_stdout(text: str) -> None:
    """`text` on standard output, all of it, or the error that stopped it (BrokenPipeError
    for `| head -1`, which webhook/cli/_main.py's guard turns into exit 141). One large
    `sys.stdout.write` loses that error: the BufferedWriter beneath answers a pipe closed
    part-way with a short count, which TextIOWrapper drops (the rest gone, exit 0). Here
    the count is followed, so the next write raises, and the flush happens in the call."""
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a text-only stream (a test's StringIO): nothing beneath to fall short
        out.write(text)
        out.flush()
        return
    out.flush()  # what was written as text before goes first
    data = memoryview(text.encode(out.encoding or "utf-8", out.errors or "strict"))
    while data:
        written = buffer.write(data)
        if not written:  # None or 0 from a blocking stream: no progress, never a loop
            raise OSError(errno.EIO, "the output took nothing")
        data = data[written:]
    buffer.flush()
