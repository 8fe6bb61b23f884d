"""Figures out of load records: percentiles, CSV files, the summary, PNG charts.

Charts use matplotlib's Agg backend (no display) and are written next to the CSVs.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from loadtests.loadgen import Record


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def write_records(path: Path, records: Iterable[Record]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["t", "stream", "phase", "status", "reason", "latency_ms", "retry_after", "error"]
        )
        for r in sorted(records, key=lambda r: r.t):
            w.writerow(
                [
                    f"{r.t:.4f}",
                    r.stream,
                    r.phase,
                    r.status,
                    r.reason,
                    f"{r.latency_ms:.3f}",
                    r.retry_after,
                    r.error,
                ]
            )


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        path.write_text("")
        return
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        for row in rows:
            w.writerow({k: _fmt(v) for k, v in row.items()})


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.4g}"
    return v


def per_second(records: Iterable[Record], ok: bool | None = None) -> dict[str, dict[int, int]]:
    """stream → second → count (ok=True: 2xx only; False: non-2xx only)."""
    out: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        good = 200 <= r.status < 300
        if ok is None or ok == good:
            out[r.stream][int(r.t)] += 1
    return out


def write_summary(path: Path, title: str, lines: list[str]) -> str:
    text = "\n".join([title, "=" * len(title), *lines, ""])
    path.write_text(text)
    return text


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart_rates(
    path: Path, records: list[Record], title: str, limits: dict[str, float] | None = None
) -> None:
    """Admitted (2xx) and rejected requests per second, per stream, over time."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    admitted = per_second(records, ok=True)
    rejected = per_second(records, ok=False)
    for stream in sorted({r.stream for r in records}):
        xs = sorted(set(admitted[stream]) | set(rejected[stream]))
        line = ax.plot(xs, [admitted[stream].get(x, 0) for x in xs], label=f"{stream} admitted")
        ax.plot(
            xs,
            [rejected[stream].get(x, 0) for x in xs],
            linestyle=":",
            color=line[0].get_color(),
            label=f"{stream} rejected",
        )
        if limits and stream in limits:
            ax.axhline(limits[stream], linestyle="--", color=line[0].get_color(), alpha=0.5)
    ax.set_xlabel("seconds")
    ax.set_ylabel("requests / s")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def chart_latency(path: Path, records: list[Record], title: str, streams: list[str]) -> None:
    """p50 (solid) and p99 (dotted) per second of each stream's successful requests."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for stream in streams:
        by_sec: dict[int, list[float]] = defaultdict(list)
        for r in records:
            if r.stream == stream and 200 <= r.status < 300:
                by_sec[int(r.t)].append(r.latency_ms)
        xs = sorted(by_sec)
        line = ax.plot(xs, [percentile(by_sec[x], 50) for x in xs], label=f"{stream} p50")
        ax.plot(
            xs,
            [percentile(by_sec[x], 99) for x in xs],
            linestyle=":",
            color=line[0].get_color(),
            label=f"{stream} p99",
        )
    ax.set_xlabel("seconds")
    ax.set_ylabel("latency of admitted requests (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def chart_bars(
    path: Path, labels: list[str], series: dict[str, list[float]], title: str, ylabel: str
) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(labels) + 2), 4.5))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [j + i * width for j in range(len(labels))]
        ax.bar(xs, [0 if math.isnan(v) else v for v in values], width, label=name)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=8, rotation=15)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def meets(value: float, op: str, target: float, spec: str) -> bool:
    """Whether `value` meets `target` as both are printed: the value formatted with
    `spec` (".2f"), the target with "g". The verdict then always agrees with the line
    a reader sees: "2.00 (target <= 2)" passes, "2.01 (target <= 2)" fails, whatever
    digits rounding hid. NaN (nothing measured) never meets a target."""
    shown = float(format(value, spec))
    limit = float(format(target, "g"))
    if math.isnan(shown):
        return False
    if op == "<=":
        return shown <= limit
    if op == ">=":
        return shown >= limit
    raise ValueError(f"unknown comparison {op!r}")
