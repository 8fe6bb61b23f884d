"""Policy trees for tests: an `admin` with every grant everywhere, tenant admins with
every grant in their own tenant, and the quota documents a test asks for."""

from __future__ import annotations

EVERYTHING = """\
kind: ClusterRole
metadata: {name: everything}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
- {nonResourceURLs: ["*"], verbs: ["*"]}
---
kind: ClusterRoleBinding
metadata: {name: admins}
roleRef: {kind: ClusterRole, name: everything}
subjects: [{kind: User, name: admin}]
"""

TENANT_ADMIN = """\
---
kind: TenantRoleBinding
metadata: {{name: {tenant}-admins, tenant: {tenant}}}
roleRef: {{kind: ClusterRole, name: everything}}
subjects: [{{kind: User, name: {user}}}]
"""


def admin_policy(hard: str, tenant_admins: dict[str, str] | None = None, extra: str = "") -> str:
    """`admin` may do everything; each `tenant → user` of `tenant_admins` (default: alice
    of acme) everything in its tenant; `QuotaDefaults` with the flow mapping `hard`
    (e.g. `"servers: 3, requests.cpu: '1'"`); `extra` YAML documents appended."""
    admins = tenant_admins if tenant_admins is not None else {"acme": "alice"}
    text = EVERYTHING
    for tenant, user in admins.items():
        text += TENANT_ADMIN.format(tenant=tenant, user=user)
    text += f"---\nkind: QuotaDefaults\nmetadata: {{name: defaults}}\nspec: {{hard: {{{hard}}}}}\n"
    if extra:
        text += "---\n" + extra.strip("\n-") + "\n"
    return text
