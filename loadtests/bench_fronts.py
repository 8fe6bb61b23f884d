"""The decision service benchmark (DESIGN §11, §13), one run, one store, `wrk`:

  direct            wrk → store
  envoy alone       Envoy (1 worker) → store, no ext_authz (the anchor)
  proxy             the sidecar's full proxy, cached reads (1 worker)
  envoy+decider     Envoy (1 worker) + HTTP ext_authz to the sidecar's decider → store
  envoy-grpc+dec.   the same over gRPC ext_authz
  nginx alone       nginx (1 worker) → store
  nginx+decider     nginx auth_request to the decider → store
  decider alone     wrk → the decider's `/envoy` (cached decisions), its CPU measured

Each at `--concurrency` connections and, for latency, at one connection. Figures are
medians of `--rounds` interleaved rounds. Targets: envoy+decider ≥ 2x proxy reads,
its unloaded p50 within 1.5x of Envoy alone's; decider alone ≥ 15,000 decisions per
second per core (decisions/s divided by the sidecar's CPU use in cores).

    python loadtests/bench.py fronts [--seconds 5] [--rounds 3] [--out DIR] [--check]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from loadtests.bench import bench_policies, cpu_seconds, run_wrk, sidecar_config
from loadtests.stack import Proc, Stack, free_port, seed_server, seed_tenant
from sidecar.cli.fronts import envoy_config
from sidecar.cli.fronts_launch import envoy_binary, nginx_binary

TENANT, NAMESPACE, TOKEN = "acme", "dev", "bench-alice"
PATH = f"/apis/compute/v1/tenants/{TENANT}/namespaces/{NAMESPACE}/servers/web-0"
HOST = "127.0.0.1"

NGINX_ALONE = """\
worker_processes 1;
pid nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path body_temp; proxy_temp_path proxy_temp;
    fastcgi_temp_path fastcgi_temp; uwsgi_temp_path uwsgi_temp; scgi_temp_path scgi_temp;
    upstream store {{ server {store}; keepalive 32; }}
    server {{
        listen {listen};
        location = /healthz {{ return 200 "ok"; }}
        location / {{
            proxy_pass http://store;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


STATIC = """\
worker_processes 1;
pid nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path body_temp; proxy_temp_path proxy_temp;
    fastcgi_temp_path fastcgi_temp; uwsgi_temp_path uwsgi_temp; scgi_temp_path scgi_temp;
    server {{
        listen {listen};
        default_type application/json;
        location / {{ return 200 '{body}'; }}
    }}
}}
"""


STATIC_BODY = (
    '{"kind":"Server","apiVersion":"compute/v1","metadata":{"name":"web-0",'
    '"tenant":"acme","namespace":"dev"},"spec":{"flavor":"m1.small"}}'
)


def envoy_alone(listen: int, store: int) -> str:
    """The generated config with the ext_authz filter taken out and every route to the
    store: Envoy's own cost, the anchor."""
    config = json.loads(envoy_config((HOST, listen), (HOST, store), (HOST, 1), (HOST, store)))
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"
    ]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if "ext_authz" not in f["name"]]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    routes[:] = [routes[0], {"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}]
    routes[0].pop("typed_per_filter_config", None)
    config["static_resources"]["clusters"] = [
        c for c in config["static_resources"]["clusters"] if c["name"] == "upstream"
    ]
    return json.dumps(config)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="loadtests/bench.py fronts")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--out", default="loadtests/results")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    p.add_argument(
        "--static-upstream",
        action="store_true",
        help="an nginx answering a fixed object instead of the store (the store's own "
        "ceiling out of the way: what the fronts and the sidecar cost)",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: dict[tuple[str, str], list[tuple[float, float, float, int, float]]] = {}
    started = time.monotonic()
    with Stack(out / "work-fronts") as stack:
        store = stack.start_store()
        seed_tenant(store.url, TENANT, NAMESPACE)
        seed_server(store.url, TENANT, "web-0", NAMESPACE)
        if args.static_upstream:
            sport = free_port()
            prefix = stack.work / "static"
            prefix.mkdir(exist_ok=True)
            (prefix / "nginx.conf").write_text(
                STATIC.format(listen=f"{HOST}:{sport}", body=STATIC_BODY)
            )
            store = stack.start_command(
                "static",
                [
                    nginx_binary(),
                    "-p",
                    str(prefix),
                    "-c",
                    "nginx.conf",
                    "-e",
                    "stderr",
                    "-g",
                    "daemon off;",
                ],
                sport,
            )
        policies = bench_policies(stack)
        tokens = stack.write_tokens(
            [{"token": TOKEN, "user": "alice", "tenant": TENANT, "groups": ["developers"]}]
        )
        authz_port, grpc_port = free_port(), free_port()
        config: dict[str, Any] = sidecar_config(stack, store, policies, tokens)
        config["authz"] = {"listen": f"{HOST}:{authz_port}", "grpcListen": f"{HOST}:{grpc_port}"}
        sidecar = stack.start_sidecar(config)
        authz_url = f"http://{HOST}:{authz_port}"
        envoy_bin = envoy_binary()

        def start_envoy(name: str, text_for: Any) -> Proc:
            port = free_port()
            path = stack.work / f"{name}.json"
            path.write_text(text_for(port))
            return stack.start_command(
                name,
                [
                    envoy_bin,
                    "-c",
                    str(path),
                    "--concurrency",
                    "1",
                    "--use-dynamic-base-id",
                    "-l",
                    "error",
                ],
                port,
            )

        def start_nginx(name: str, text: str, port: int) -> Proc:
            prefix = stack.work / name
            prefix.mkdir(exist_ok=True)
            (prefix / "nginx.conf").write_text(text)
            return stack.start_command(
                name,
                [
                    nginx_binary(),
                    "-p",
                    str(prefix),
                    "-c",
                    "nginx.conf",
                    "-e",
                    "stderr",
                    "-g",
                    "daemon off;",
                ],
                port,
            )

        from sidecar.cli.fronts import nginx_config

        alone = start_envoy("envoy-alone", lambda port: envoy_alone(port, store.port))
        with_decider = start_envoy(
            "envoy-decider",
            lambda port: envoy_config(
                (HOST, port), (HOST, store.port), (HOST, authz_port), (HOST, sidecar.port)
            ),
        )
        with_grpc = start_envoy(
            "envoy-grpc-decider",
            lambda port: envoy_config(
                (HOST, port),
                (HOST, store.port),
                (HOST, authz_port),
                (HOST, sidecar.port),
                (),
                (HOST, grpc_port),
            ),
        )
        nport, nport2 = free_port(), free_port()
        nginx_alone = start_nginx(
            "nginx-alone",
            NGINX_ALONE.format(store=f"{HOST}:{store.port}", listen=f"{HOST}:{nport}"),
            nport,
        )
        nginx_decider = start_nginx(
            "nginx-decider",
            nginx_config(
                (HOST, nport2), (HOST, store.port), (HOST, authz_port), (HOST, sidecar.port)
            ),
            nport2,
        )
        plan: list[tuple[str, str, Proc | None]] = [
            ("direct", store.url, None),
            ("envoy alone", alone.url, alone),
            ("proxy", sidecar.url, sidecar),
            ("envoy+decider", with_decider.url, sidecar),
            ("envoy-grpc+dec", with_grpc.url, sidecar),
            ("nginx alone", nginx_alone.url, nginx_alone),
            ("nginx+decider", nginx_decider.url, sidecar),
            ("decider alone", authz_url + "/envoy", sidecar),
        ]
        for round_no in range(args.rounds):
            for name, base, watched in plan:
                for conc in (args.concurrency, 1):
                    seconds = args.seconds if conc > 1 else min(args.seconds, 3.0)
                    tag = f"{name.replace(' ', '_').replace('+', '_')}-{round_no}-{conc}"
                    run_wrk(
                        stack.work, base, "GET", PATH, min(1.0, seconds), conc, "w" + tag, TOKEN
                    )
                    cpu0 = cpu_seconds(watched.proc.pid) if watched is not None else 0.0
                    wall0 = time.monotonic()
                    rps, p50, p99, _n, errs = run_wrk(
                        stack.work, base, "GET", PATH, seconds, conc, tag, TOKEN
                    )
                    wall = time.monotonic() - wall0
                    cores = (
                        (cpu_seconds(watched.proc.pid) - cpu0) / wall
                        if watched is not None
                        else 0.0
                    )
                    rows.setdefault((name, "c1" if conc == 1 else f"c{conc}"), []).append(
                        (rps, p50, p99, errs, cores)
                    )
                    print(
                        f"round {round_no + 1} {name:14} c{conc:<3} {rps:9.0f} req/s "
                        f"p50 {p50:6.2f} ms p99 {p99:6.2f} ms errors {errs} "
                        f"sidecar/front cores {cores:4.2f}",
                        flush=True,
                    )
    text, met = summary(rows, args, time.monotonic() - started)
    (out / "bench-fronts.txt").write_text(text)
    print(text)
    return 1 if args.check and not all(met) else 0


def summary(
    rows: dict[tuple[str, str], list[tuple[float, float, float, int, float]]],
    args: argparse.Namespace,
    elapsed: float,
) -> tuple[str, list[bool]]:
    def med(name: str, load: str, i: int) -> float:
        return statistics.median(r[i] for r in rows[(name, load)])

    load = f"c{args.concurrency}"
    lines = [
        f"decision service benchmark{' (static upstream)' if args.static_upstream else ''}: "
        f"wrk, {args.rounds} rounds x {args.seconds:g} s, "
        f"{args.concurrency} connections (c1: one), medians; {elapsed:.0f} s",
        f"{'path':16} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'c1 p50':>7} {'cores':>6} "
        f"{'us/req':>6} errors",
    ]
    names = sorted(
        {n for n, _ in rows}, key=lambda n: list(dict.fromkeys(n for n, _ in rows)).index(n)
    )
    for name in names:
        errs = sum(r[3] for r in rows[(name, load)]) + sum(r[3] for r in rows[(name, "c1")])
        lines.append(
            f"{name:16} {med(name, load, 0):9.0f} {med(name, load, 1):7.2f} "
            f"{med(name, load, 2):7.2f} {med(name, 'c1', 1):7.2f} {med(name, load, 4):6.2f} "
            f"{med(name, load, 4) * 1e6 / max(med(name, load, 0), 1):6.0f} {errs}"
        )
    ratio = med("envoy+decider", load, 0) / med("proxy", load, 0)
    p50_ratio = med("envoy+decider", "c1", 1) / med("envoy alone", "c1", 1)
    decider_cores = med("decider alone", load, 4)
    per_core = med("decider alone", load, 0) / max(decider_cores, 1e-9)
    met = [ratio >= 2.0, p50_ratio <= 1.5, per_core >= 15000]
    lines += [
        "",
        f"[{'met' if met[0] else 'MISSED'}] envoy+decider reads / proxy reads = {ratio:.2f} (>= 2)",
        f"[{'met' if met[1] else 'MISSED'}] envoy+decider c1 p50 / envoy alone c1 p50 = "
        f"{p50_ratio:.2f} (<= 1.5)",
        f"[{'met' if met[2] else 'MISSED'}] decider alone: {per_core:.0f} cached decisions/s per "
        f"core ({med('decider alone', load, 0):.0f}/s on {decider_cores:.2f} cores) (>= 15000)",
        f"nginx+decider reads / proxy reads = "
        f"{med('nginx+decider', load, 0) / med('proxy', load, 0):.2f}",
    ]
    return "\n".join(lines) + "\n", met
