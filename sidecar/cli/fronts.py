"""`sidecar config envoy|nginx`: a complete, runnable front config for the decision
service (DESIGN §13, docs/decision-service.md).

    sidecar config envoy --listen H:P --upstream URL --authz H:P --proxy URL [--grpc]
    sidecar config nginx --listen H:P --upstream URL --authz H:P --proxy URL [--prefix DIR]

Envoy runs it as `envoy -c FILE --concurrency N`; nginx as `nginx -p DIR -c FILE -g
'daemon off;'` (every path relative to the prefix, so a non-root user can run it).
`--config` reads the sidecar's config for `identity.stripHeaders`, which the decider
must see (a request carrying one goes the `proxy` way).
"""

from __future__ import annotations

import argparse
import json
import sys
from urllib.parse import urlsplit

from sidecar.config.settings import ConfigError, load_config

_T = "type.googleapis.com/envoy.extensions."
_STATUS_503 = (
    '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
    '"message":"the authorization service is unavailable",'
    '"reason":"ServiceUnavailable","code":503}'
)
# What the decider must see of the client's request (Envoy passes only these).
ENVOY_ASKS = (
    "authorization",
    "content-type",
    "content-encoding",
    "accept",
    "x-request-id",
    "x-forwarded-for",
)
ENVOY_ASKS_PREFIXES = ("x-remote-", "impersonate-", "x-sidecar-")
# What an allow sets on the forwarded request (replacing the client's values).
ENVOY_SETS = ("x-sidecar-route", "x-sidecar-decided", "x-remote-user", "x-remote-tenant")
# The identity headers the proxy's trusted-header authenticator reads.
IDENTITY_HEADERS = ("x-remote-user", "x-remote-tenant", "x-remote-group")
# What a refusal passes to the client besides its status and body.
REFUSAL_HEADERS = (
    "content-type",
    "www-authenticate",
    "retry-after",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "allow",
    "x-request-id",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for front in ("envoy", "nginx"):
        p = sub.add_parser(front, help=f"print a runnable {front} config for the decision service")
        p.add_argument("--listen", required=True, help="HOST:PORT the front listens on")
        p.add_argument("--upstream", required=True, help="the API server (direct route)")
        p.add_argument("--authz", required=True, help="HOST:PORT of the sidecar's authz.listen")
        p.add_argument("--proxy", required=True, help="the sidecar's full proxy (listen)")
        p.add_argument("--prefix", default=".", help="nginx: the prefix directory (-p)")
        p.add_argument("--config", default=None, help="the sidecar's config (stripHeaders)")
        if front == "envoy":
            p.add_argument(
                "--grpc", default=None, metavar="H:P", help="ask authz.grpcListen over gRPC"
            )
        p.set_defaults(front=front)


def run(args: argparse.Namespace) -> int:
    try:
        strip: tuple[str, ...] = ()
        forward_authorization = True
        if args.config:
            identity = load_config(args.config).identity
            strip = tuple(h.lower() for h in identity.strip_headers)
            forward_authorization = identity.forward_authorization
        listen = _host_port(args.listen, "--listen")
        authz = _host_port(args.authz, "--authz")
        upstream = _url(args.upstream, "--upstream")
        proxy = _url(args.proxy, "--proxy")
        grpc = _host_port(args.grpc, "--grpc") if getattr(args, "grpc", None) else None
    except (ConfigError, ValueError) as exc:
        print(f"sidecar config: {exc}", file=sys.stderr)
        return 2
    if args.front == "envoy":
        print(
            envoy_config(
                listen,
                upstream,
                authz,
                proxy,
                strip,
                grpc,
                forward_authorization=forward_authorization,
            )
        )
    else:
        print(
            nginx_config(
                listen,
                upstream,
                authz,
                proxy,
                strip,
                args.prefix,
                forward_authorization=forward_authorization,
            )
        )
    return 0


def _host_port(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} must be HOST:PORT, not {value!r}")
    return host.strip("[]"), int(port)


def _url(value: str, flag: str) -> tuple[str, int]:
    parts = urlsplit(value)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{flag} must be an http://HOST:PORT URL, not {value!r}")
    return parts.hostname, parts.port or 80


def _cluster(name: str, host: str, port: int, http2: bool = False) -> dict[str, object]:
    cluster: dict[str, object] = {
        "name": name,
        "type": "STATIC" if host.replace(".", "").isdigit() else "STRICT_DNS",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": host, "port_value": port}}
                            }
                        }
                    ]
                }
            ],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _T + "upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _patterns(exact: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> list[dict[str, str]]:
    return [{"exact": h} for h in exact] + [{"prefix": p} for p in prefixes]


def envoy_config(
    listen: tuple[str, int],
    upstream: tuple[str, int],
    authz: tuple[str, int],
    proxy: tuple[str, int],
    strip: tuple[str, ...] = (),
    grpc: tuple[str, int] | None = None,
    *,
    forward_authorization: bool = True,
) -> str:
    """Envoy's bootstrap (JSON, which Envoy reads as YAML): ext_authz on every route but
    `/healthz`, the route picked by the decider's `x-sidecar-route`."""
    ext_authz: dict[str, object] = {
        "@type": _T + "filters.http.ext_authz.v3.ExtAuthz",
        "transport_api_version": "V3",
        # The decider unreachable or failing: the request is refused, never forwarded.
        "failure_mode_allow": False,
        "status_on_error": {"code": "ServiceUnavailable"},
        # The route is chosen again after the check, on the decider's x-sidecar-route.
        "clear_route_cache": True,
        # What the decider sees of the client's request.
        "allowed_headers": {"patterns": _patterns(ENVOY_ASKS + strip, ENVOY_ASKS_PREFIXES)},
    }
    if grpc is None:
        ext_authz["http_service"] = {
            "server_uri": {
                "uri": f"http://{authz[0]}:{authz[1]}",
                "cluster": "sidecar_authz",
                "timeout": "1s",
            },
            "path_prefix": "/envoy",
            "authorization_response": {
                "allowed_upstream_headers": {"patterns": _patterns(ENVOY_SETS)},
                "allowed_upstream_headers_to_append": {"patterns": _patterns(("x-remote-group",))},
                "allowed_client_headers": {"patterns": _patterns(REFUSAL_HEADERS, ("ratelimit-",))},
            },
        }
    else:
        ext_authz["grpc_service"] = {
            "envoy_grpc": {"cluster_name": "sidecar_authz_grpc"},
            "timeout": "1s",
        }
    never_upstream = ["x-sidecar-route", "x-sidecar-decided"]
    if not forward_authorization:  # as the proxy does (identity.forwardAuthorization)
        never_upstream.append("authorization")
    healthz = {
        "match": {"path": "/healthz"},
        "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
        "typed_per_filter_config": {
            "envoy.filters.http.ext_authz": {
                "@type": _T + "filters.http.ext_authz.v3.ExtAuthzPerRoute",
                "disabled": True,
            }
        },
    }
    direct = {
        "match": {
            "prefix": "/",
            "headers": [{"name": "x-sidecar-route", "string_match": {"exact": "direct"}}],
        },
        "route": {"cluster": "upstream", "timeout": "0s"},
        "request_headers_to_remove": never_upstream,
    }
    to_proxy = {
        "match": {"prefix": "/"},
        "route": {"cluster": "sidecar_proxy", "timeout": "0s"},
        # The client's own identity headers never reach the proxy either (its trusted
        # header authenticator, when enabled for loopback, would read them).
        "request_headers_to_remove": ["x-sidecar-route", *IDENTITY_HEADERS],
    }
    hcm = {
        "@type": _T + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "front",
        # The client's address is the peer's (appended to X-Forwarded-For).
        "use_remote_address": True,
        # The decider reads the :path Envoy forwards: no rewriting.
        "normalize_path": False,
        "merge_slashes": False,
        "path_with_escaped_slashes_action": "KEEP_UNCHANGED",
        # X_Remote_User and the like never reach anyone.
        "common_http_protocol_options": {"headers_with_underscores_action": "DROP_HEADER"},
        "stream_idle_timeout": "0s",
        "route_config": {
            "name": "front",
            "virtual_hosts": [
                {"name": "all", "domains": ["*"], "routes": [healthz, direct, to_proxy]}
            ],
        },
        "http_filters": [
            {"name": "envoy.filters.http.ext_authz", "typed_config": ext_authz},
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _T + "filters.http.router.v3.Router"},
            },
        ],
    }
    listener = {
        "name": "front",
        "address": {"socket_address": {"address": listen[0], "port_value": listen[1]}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }
    config = {
        "static_resources": {
            "listeners": [listener],
            "clusters": [
                _cluster("upstream", *upstream),
                _cluster("sidecar_proxy", *proxy),
                _cluster("sidecar_authz", *authz)
                if grpc is None
                else _cluster("sidecar_authz_grpc", *grpc, http2=True),
            ],
        }
    }
    return json.dumps(config, indent=2)


NGINX = """\
# nginx in front of the API, deciding every request with the sidecar's decision
# service (docs/decision-service.md). Every path is relative to the prefix; run as any
# user:  nginx -p {prefix} -c nginx.conf -g 'daemon off;'
worker_processes 1;
pid nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path body_temp;
    proxy_temp_path proxy_temp;
    fastcgi_temp_path fastcgi_temp;
    uwsgi_temp_path uwsgi_temp;
    scgi_temp_path scgi_temp;
    # Header names with "_" (X_Remote_User) are dropped, never passed on.
    underscores_in_headers off;
    ignore_invalid_headers on;
    client_max_body_size 0;
    # Request lines and headers as long as the sidecar takes (limits.maxHeaderBytes).
    large_client_header_buffers 4 32k;

    upstream api_direct {{ server {upstream}; keepalive 32; }}
    upstream sidecar_proxy {{ server {proxy}; keepalive 32; }}
    upstream sidecar_authz {{ server {authz}; keepalive 32; }}
    # The decider's route picks the upstream group; anything but "direct" is the proxy.
    map $sidecar_route $sidecar_backend {{ direct api_direct; default sidecar_proxy; }}
    # What reaches the upstream as Authorization on the direct route (the proxy's own
    # rule, identity.forwardAuthorization); the proxy route always gets the client's.
    map $sidecar_route $sidecar_authorization {{
        direct {direct_authorization};
        default $http_authorization;
    }}

    server {{
        listen {listen};

        location = /healthz {{ default_type text/plain; return 200 "ok"; }}

        location / {{
            auth_request /_sidecar_check;
            auth_request_set $sidecar_route $upstream_http_x_sidecar_route;
            auth_request_set $sidecar_decided $upstream_http_x_sidecar_decided;
            auth_request_set $sidecar_user $upstream_http_x_remote_user;
            auth_request_set $sidecar_tenant $upstream_http_x_remote_tenant;
            auth_request_set $sidecar_group $upstream_http_x_remote_group;
            auth_request_set $sidecar_decision $upstream_http_x_decision;
            error_page 401 403 = @denied;
            error_page 500 = @unavailable;

            proxy_pass http://$sidecar_backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            # The decider's values replace the client's; empty removes the header.
            proxy_set_header X-Remote-User $sidecar_user;
            proxy_set_header X-Remote-Tenant $sidecar_tenant;
            proxy_set_header X-Remote-Group $sidecar_group;
            proxy_set_header X-Sidecar-Decided $sidecar_decided;
            proxy_set_header Authorization $sidecar_authorization;
            proxy_set_header X-Sidecar-Route "";
            proxy_set_header X-Decision "";
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
        }}

        location = /_sidecar_check {{
            internal;
            proxy_pass http://sidecar_authz/nginx;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header Connection "";
            proxy_http_version 1.1;
            proxy_set_header X-Original-Method $request_method;
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-Remote-Addr $remote_addr;
            # A refusal's x-decision carries its Status body.
            proxy_buffer_size 32k;
            proxy_buffers 4 32k;
            proxy_busy_buffers_size 64k;
            proxy_connect_timeout 1s;
            proxy_read_timeout 1s;
        }}

        # The proxy's exact refusal (status, headers, Status body), replayed by the
        # decider from what it answered the check; never decided again.
        location @denied {{
            rewrite ^ /nginx/denied break;
            proxy_pass http://sidecar_authz;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header Connection "";
            proxy_http_version 1.1;
            proxy_set_header X-Decision $sidecar_decision;
            proxy_method GET;
        }}

        # The decider unreachable or failing: refused, never forwarded undecided.
        location @unavailable {{
            default_type application/json;
            return 503 '{unavailable}';
        }}
    }}
}}
"""


def nginx_config(
    listen: tuple[str, int],
    upstream: tuple[str, int],
    authz: tuple[str, int],
    proxy: tuple[str, int],
    strip: tuple[str, ...] = (),
    prefix: str = ".",
    *,
    forward_authorization: bool = True,
) -> str:
    """nginx's config. Every header name in `strip` is seen by the decider (nginx passes
    all of them to `auth_request`), which routes such a request to the proxy."""
    del strip  # nginx passes every header to the check: nothing to list
    return NGINX.format(
        listen=f"{listen[0]}:{listen[1]}",
        upstream=f"{upstream[0]}:{upstream[1]}",
        proxy=f"{proxy[0]}:{proxy[1]}",
        authz=f"{authz[0]}:{authz[1]}",
        unavailable=_STATUS_503,
        prefix=prefix,
        direct_authorization="$http_authorization" if forward_authorization else '""',
    )
