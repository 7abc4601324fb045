"""How the command line shows what the control plane answers: tables (rich), JSON, live usage."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from rich.console import Console

    from .client import LimiterClient, UsageSample, Written


def print_changes(written: Written, title: str, args: argparse.Namespace) -> None:
    """A write's changes: a table, or JSON with --json."""
    from rich.table import Table
    from rich.text import Text

    from .client import as_dict

    if args.json:
        doc = as_dict(written)
        doc["generation"] = written.generation
        print(json.dumps({"dry_run": args.dry_run, **doc}, indent=2))
        return
    t = Table("change", "kind", "name", "detail", title=title)
    colour = {"create": "green", "update": "yellow", "unchanged": "dim", "delete": "red"}
    for ch in written.changes:
        detail = f"{ch.before} -> {ch.after}" if ch.verb == "update" else ch.after or ch.before
        t.add_row(Text(ch.verb, style=colour.get(ch.verb, "")), ch.kind, ch.name, detail)
    terminal().print(t)


def terminal() -> Console:
    """Rich's console; piped, as wide as the table needs (no 80-column cut of names and addresses)."""
    from rich.console import Console

    # No markup: names and addresses ("[fe80::1]:9559") are printed as they are.
    return Console(markup=False) if sys.stdout.isatty() else Console(markup=False, width=400)


async def get_objects(c: LimiterClient, args: argparse.Namespace) -> int:
    """Stored objects as manifest entries: `get all --json` is a file `apply -f` takes back."""
    from rich.table import Table

    from .manifest import cap_entry, dpu_entry, pod_entry, router_entry

    pods = await c.list_pods()
    doc: dict[str, list[dict[str, object]]] = {}
    if args.kind in ("pods", "all"):
        doc["pods"] = [pod_entry(p) for p in pods]
    if args.kind in ("dpus", "all"):
        doc["dpus"] = [dpu_entry(d) for d in await c.list_dpus()]
    if args.kind in ("caps", "all"):
        doc["caps"] = []
        for p in pods:
            try:
                cap = (await c.get_pod_cap(p.name)).cap
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                continue
            doc["caps"].append(cap_entry(p.name, cap))
    if args.kind in ("routers", "all"):
        doc["routers"] = [router_entry(r) for r in await c.list_routers()]
    if args.json:
        print(json.dumps(doc if args.kind == "all" else doc[args.kind], indent=2))
        return 0
    for kind, rows in doc.items():
        # Every row under the first row's columns, by name.
        columns = list(rows[0]) if rows else ["(none)"]
        t = Table(*columns, title=kind if args.kind == "all" else None)
        for r in rows:
            t.add_row(*(cell(k, r.get(k, "")) for k in columns))
        terminal().print(t)
    return 0


def cell(column: str, v: object) -> str:
    """A table cell: lists joined, rates as the files write them (1G)."""
    from .units import format_rate

    if isinstance(v, list):
        return ", ".join(map(str, v))
    if column in ("egress", "ingress") and isinstance(v, float):
        return format_rate(v)
    return str(v)


async def watch_usage(c: LimiterClient, args: argparse.Namespace) -> int:
    """Live rates from WatchUsage: a table that updates in place, or one JSON line per sample."""
    from contextlib import nullcontext

    from rich.live import Live
    from rich.table import Table

    from .client import as_dict

    prev: dict[tuple[str, str, str], tuple[float, dict[str, int]]] = {}
    fields = ("metered_bytes", "green_bytes", "red_bytes", "window_bytes", "lease_bytes", "intra_bytes", "arp_bytes")

    def rates(sample: UsageSample) -> list[tuple[str, str, str, dict[str, float]]]:
        out = []
        for u in sample.usage:
            key = (u.pod, u.dpu, u.direction)
            now = {f: getattr(u, f) for f in fields}
            if u.error or u.dpus_unread:  # not all read: no rate now, and the next one starts afresh
                prev.pop(key, None)
                out.append((u.pod, u.dpu, u.direction, dict.fromkeys(fields, 0.0)))
                continue
            t0, before = prev.get(key, (sample.time, now))
            dt = max(sample.time - t0, 1e-9)
            out.append((u.pod, u.dpu, u.direction, {f: (now[f] - before[f]) * 8 / dt for f in fields}))
            prev[key] = (sample.time, now)
        return out

    try:
        if args.json:
            async for sample in c.watch_usage(args.pod, args.interval, args.per_dpu):
                doc = as_dict(sample, all_fields=False)
                doc["rates_bps"] = [{"pod": p, "dpu": n, "direction": d, **r} for p, n, d, r in rates(sample)]
                print(json.dumps(doc), flush=True)
        else:
            console = terminal()
            # On a terminal one table updated in place; piped, one table per sample as it arrives.
            live_or_not = Live(console=console, auto_refresh=False) if console.is_terminal else nullcontext()
            with live_or_not as live:
                async for sample in c.watch_usage(args.pod, args.interval, args.per_dpu):
                    t = Table(
                        "pod",
                        "dpu",
                        "direction",
                        "metered",
                        "passed (green)",
                        "dropped (red)",
                        "dropped (window)",
                        "dropped (no lease)",
                        "intra-pod",
                        "ARP",
                        "not read",
                        title="bit/s across each pod's boundary (Ctrl-C to stop)",
                    )
                    notes = [unread(as_dict(u, all_fields=False)) for u in sample.usage]
                    for (pod, dpu, direction, r), note in zip(rates(sample), notes, strict=True):
                        t.add_row(pod, dpu or "(all)", direction, *(f"{r[f] / 1e6:,.2f} M" for f in fields), note)
                    if live is not None:
                        live.update(t, refresh=True)
                    else:
                        console.print(t)
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    return 0


def unread(u: dict) -> str:  # type: ignore[type-arg]
    """A usage row's note: the DPUs a pod's totals leave out, or why a DPU's row is empty."""
    n = int(u.get("dpus_unread", 0))
    return u.get("error", "") or (f"{n} DPU{'s' if n > 1 else ''}" if n else "")


# Usage table columns: the last three are what the DPU dropped (meter red, window budget, no lease).
USAGE_COLUMNS = (
    "intra_bytes",
    "arp_bytes",
    "metered_bytes",
    "green_bytes",
    "yellow_bytes",
    "red_bytes",
    "window_bytes",
    "lease_bytes",
    "spoofed_bytes",
    "arp_dropped_bytes",
)


def print_table(cmd: str, doc: dict, held_here: bool = False) -> None:  # type: ignore[type-arg]
    """`usage`, `status` (`held_here`: a replica's own DPUs only) or `cap get` as a table."""
    from rich.table import Table

    console = terminal()
    if cmd == "usage":
        t = Table(
            "pod",
            "dpu",
            "direction",
            "intra-pod B",
            "ARP B",
            "metered B",
            "green B",
            "yellow B",
            "red B",
            "window B",
            "no lease B",
            "spoofed B",
            "ARP over B",
            "not read",
        )
        for u in doc.get("usage", []):
            t.add_row(
                u["pod"],
                u.get("dpu", "") or "(all)",
                u["direction"],
                *(str(u.get(k, 0)) for k in USAGE_COLUMNS),
                unread(u),
            )
        console.print(t)
    elif cmd == "status":
        t = Table("dpu", "connected", "primary", "converged", "generation", "lease", "drift corrected", "last error")
        for d in doc.get("dpus", []):
            lease = d.get("lease_state", "")
            if lease in ("held", "renewing"):
                lease += f" ({d.get('lease_age_s', 0):.0f} of {d.get('lease_lifetime_s', 0):.0f} s)"
            t.add_row(
                d["name"],
                str(d.get("connected", False)),
                str(d.get("primary", False)),
                str(d.get("converged", False)),
                f"{d.get('generation_applied', 0)}/{doc.get('generation', 0)}",
                lease,
                f"{d.get('drift_corrections', 0)} {d.get('last_drift', '')}".strip(),
                d.get("last_error", ""),
            )
        console.print(t)
        if not doc.get("dpus"):
            # An empty table alone reads as a fault: say why it is empty.
            console.print(
                "this replica holds no DPU (the other replicas hold them; without --held-here, every DPU)"
                if held_here
                else "no DPU is registered"
            )
    else:
        cap = doc.get("cap", {})
        console.print(
            f"pod {doc.get('pod')}: egress {float(cap.get('egress_bps', 0)) / 1e6:g} Mbit/s, "
            f"ingress {float(cap.get('ingress_bps', 0)) / 1e6:g} Mbit/s, window {cap.get('window_s')} s, "
            f"burst {cap.get('burst_bytes', 0)} B, "
            f"{'window' if cap.get('mode') == 'CAP_MODE_WINDOW' else 'rate'} mode"
            f"{', rebalance' if cap.get('rebalance') else ''}"
        )
