"""What the running server asks the API for, as RBAC attributes: one list, read by
`initshift check` (a SubjectAccessReview for each) and checked by the deploy tests against
the calls the code really makes and the grants every install renders."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import Settings

# When an access is needed (the server's settings decide; the optional ones are components).
ALWAYS = "always"
SELF_MANAGED_CERTS = "self-managed certificates"
NODE_VERSIONS = "native-sidecar detection by kubelet versions (optional)"
PULL_SECRETS = "registry lookups with pull secrets (optional)"

_COORDINATION, _ADMISSION = "coordination.k8s.io", "admissionregistration.k8s.io"


@dataclass(frozen=True)
class Access:
    verb: str
    group: str
    resource: str
    namespace: str = ""  # "" = every namespace, or a cluster-scoped resource
    name: str = ""  # "" = any name (list, watch and create never name one)
    why: str = ""
    needed: str = ALWAYS

    def covers(self, verb: str, group: str, resource: str, namespace: str, name: str) -> bool:
        """Whether a request with these attributes is one this entry describes."""
        return (self.verb, self.group, self.resource) == (verb, group, resource) \
            and self.namespace in ("", namespace) and self.name in ("", name)

    def attributes(self) -> dict:
        """A SubjectAccessReview's resourceAttributes."""
        out = {"verb": self.verb, "group": self.group, "resource": self.resource}
        out.update({k: v for k, v in (("namespace", self.namespace), ("name", self.name)) if v})
        return out

    def text(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.resource}{'.' + self.group if self.group else ''}{named}{where}"


def server_access(settings: Settings) -> list[Access]:
    """Every request `initshift serve --watch` makes, for the settings it runs with."""
    srv, ns, lease = settings.server, settings.server.namespace, settings.watcher.lease_name
    watcher = "the watcher follows managed pods and writes their annotations"
    out = [Access(verb, "", "pods", why=watcher) for verb in ("list", "watch", "get", "patch")]
    out.append(Access("create", "", "events", why="Events on the pods the watcher acts on"))
    out += [Access(verb, "", "events", why="the watcher's own Events: which actions still lack theirs")
            for verb in ("list", "watch")]
    out += [Access(verb, "", "limitranges", why="the rewrite keeps a pod within its namespace's LimitRanges")
            for verb in ("list", "watch")]
    out += [Access(verb, "", "resourcequotas", why="the rewrite keeps a pod within its namespace's quotas")
            for verb in ("list", "watch")]
    out += [Access(verb, "", "namespaces", why="the rewrite waits for a proxy a namespace's mesh label asks for")
            for verb in ("list", "watch")]
    out.append(Access("create", _COORDINATION, "leases", ns, why="leader election"))
    out += [Access(verb, _COORDINATION, "leases", ns, lease, why="leader election") for verb in ("get", "update")]
    certs = "the self-managed serving certificate"
    out.append(Access("create", "", "secrets", ns, why=certs, needed=SELF_MANAGED_CERTS))
    out += [Access(verb, "", "secrets", ns, srv.cert_secret, why=certs, needed=SELF_MANAGED_CERTS)
            for verb in ("get", "patch")]
    out += [Access(verb, _ADMISSION, "mutatingwebhookconfigurations", "", srv.webhook_config,
                   why="writes its CA into the caBundle", needed=SELF_MANAGED_CERTS) for verb in ("get", "update")]
    out.append(Access("list", "", "nodes", why="reads kubelet versions", needed=NODE_VERSIONS))
    out += [Access("get", "", resource, why="reads the pod's pull secrets", needed=PULL_SECRETS)
            for resource in ("secrets", "serviceaccounts")]
    return out
