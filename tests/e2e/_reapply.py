"""docs/install.md's `kubectl apply -k` as an operator runs it, after everything else (phase 5):
deploy/ applied, applied again unchanged, deleted. The second apply is what a GitOps loop or
an upgrade that changes nothing does every time."""

from __future__ import annotations

from tests.support.deploy_render import DEPLOY

from ._env import Env, Record, own_cluster, scenario
from ._kube import kubectl
from ._uninstall import left_in_cluster

# kubectl's client-side apply diffs a PodDisruptionBudget's `spec.selector` as a whole (its
# patch strategy is `replace`), so its patch is never empty and kubectl says "configured"
# while the object stays as it was (its generation unchanged). Every other object must
# say "unchanged": a manifest field the API drops (a `readOnly: false`) would be patched on
# every apply.
ALWAYS_PATCHED = {"poddisruptionbudget.policy/initshift"}


@scenario("reapply", phase=5, applies=own_cluster)
def reapply(env: Env, rec: Record) -> None:
    """`kubectl apply -k deploy/` twice: the second changes nothing and says so for every
    object but the PodDisruptionBudget (kubectl's own diff of its selector); then
    `kubectl delete -k deploy/`: nothing of initshift left."""
    assert not left_in_cluster(env), "an install is left from an earlier phase"
    try:
        kubectl(env.admin, "apply", "-k", str(DEPLOY))
        generations = _generations(env)
        said = dict(line.rsplit(" ", 1) for line in kubectl(env.admin, "apply", "-k", str(DEPLOY)).stdout.splitlines())
        changed = {name for name, verb in said.items() if verb != "unchanged"}
        assert changed == ALWAYS_PATCHED and said[next(iter(ALWAYS_PATCHED))] == "configured", said
        assert _generations(env) == generations, "the second apply changed an object's spec"
    finally:
        kubectl(env.admin, "delete", "-k", str(DEPLOY), "--ignore-not-found", "--wait=true", "--timeout=120s")
    leftovers = left_in_cluster(env)
    assert not leftovers, leftovers
    rec.note(f"second apply: {len(said) - len(changed)} of {len(said)} objects unchanged, "
             f"{', '.join(sorted(changed))} configured (kubectl's selector diff), no generation changed; "
             f"deleted, nothing left")


def _generations(env: Env) -> dict[str, str]:
    """Each of the install's objects by its generation (its spec's version; controllers
    write their status meanwhile, which moves the resourceVersion)."""
    out = kubectl(env.admin, "get", "-k", str(DEPLOY), "-o",
                  "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.generation}{\"\\n\"}{end}").stdout
    return dict(line.split("=", 1) for line in out.splitlines())
