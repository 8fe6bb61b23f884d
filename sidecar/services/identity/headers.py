"""Trusted front-proxy headers (DESIGN §4): `X-Remote-User`, `X-Remote-Tenant` and
`X-Remote-Group` set by a front proxy, believed only when enabled and only from the
configured client addresses."""

from __future__ import annotations

import ipaddress

from aiohttp import web

from sidecar.config.settings import ConfigError, TrustedHeaders
from sidecar.core.identity import Identity
from sidecar.services.identity.names import TRUSTED, printable, reject, tenant_name


class TrustedHeaderAuthenticator:
    name = TRUSTED

    def __init__(self, cfg: TrustedHeaders) -> None:
        networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for i, client in enumerate(cfg.clients):
            try:
                networks.append(ipaddress.ip_network(client.strip(), strict=False))
            except ValueError:
                raise ConfigError(
                    f"identity.trustedHeaders.clients[{i}]: {client!r} is not an IP address or CIDR"
                ) from None
        self.networks = tuple(networks)

    def trusts(self, remote: str | None) -> bool:
        if not remote:
            return False
        try:
            address = ipaddress.ip_address(remote.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in net for net in self.networks)

    def authenticate(self, request: web.Request, bearer: str | None) -> Identity | None:
        headers = request.headers
        if "X-Remote-User" not in headers or not self.trusts(request.remote):
            return None
        users = headers.getall("X-Remote-User")
        if len(users) != 1 or not users[0].strip():
            raise reject("the front proxy must send exactly one non-empty X-Remote-User")
        user = users[0].strip()
        if not printable(user):
            raise reject("the X-Remote-User header is not a valid user name")
        tenants = headers.getall("X-Remote-Tenant", [])
        if len(tenants) != 1:
            raise reject("the front proxy must send exactly one X-Remote-Tenant")
        tenant = tenant_name(tenants[0].strip(), "the X-Remote-Tenant header")
        groups = tuple(g.strip() for g in headers.getall("X-Remote-Group", []) if g.strip())
        if not all(printable(g) for g in groups):
            raise reject("an X-Remote-Group header is not a valid group name")
        return Identity(user, tenant, groups, TRUSTED)
