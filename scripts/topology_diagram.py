"""Draw docs/topology.png: the fleet topology of docs/topology.md (what runs where, ports, auth).

    python scripts/topology_diagram.py            # writes docs/topology.png
    python scripts/topology_diagram.py --out x.png

The picture is data in this file (boxes and arrows), so a change to the topology is a change here
and a re-run, not an edit in a drawing tool. Needs matplotlib (the ``test`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

ROOT = Path(__file__).resolve().parents[1]

# name: (x, y, width, height, title, detail lines, colour)
BOXES: dict[str, tuple[float, float, float, float, str, str, str]] = {
    "vllm": (0.3, 7.6, 4.4, 1.5, "vLLM / LMDeploy replicas",
             "GPU nodes · /metrics on :8000\n(thousands of pods)", "#dbeafe"),
    "node": (6.2, 7.6, 5.0, 1.5, "node agents  (DaemonSet, :9400)",
             "one per GPU node: NVML (dcgm names),\nnccl-tests, OOM lines in pod logs", "#dcfce7"),
    "shards": (0.3, 5.2, 4.4, 1.5, "scrape shards  (StatefulSet, :9400)",
               "shard i keeps md5(address) % N == i\n(Prometheus hashmod); pod ordinal = i", "#dcfce7"),
    "tsdb": (0.3, 2.7, 4.4, 1.6, "TSDB",
             "VictoriaMetrics :8428 · Prometheus :9090\nMimir · Thanos Receive\n/api/v1/write · /api/v1/query",
             "#fef9c3"),
    "central": (6.2, 2.7, 5.0, 1.6, "central agent pair  (×2, :9400)",
                "Prometheus mode: evaluates rules/, scales,\ndiagnoses, findings intake; SQLite state each",
                "#fde68a"),
    "am": (12.4, 2.7, 3.9, 1.6, "Alertmanager cluster",
           ":9093 API · :9094 gossip\nde-duplicates the pair's alerts", "#fee2e2"),
    "receivers": (12.4, 0.3, 3.9, 1.5, "pager · Slack · webhooks",
                  "from Alertmanager, or from the\ncentral leader (direct receivers)", "#f3f4f6"),
    "scaler": (6.2, 0.3, 5.0, 1.5, "scale-out",
               "signed webhook with a deterministic key,\nor HPA/KEDA on sre_agent_desired_replicas", "#f3f4f6"),
}

Point = tuple[float, float]
# (from, to, label, label position, start and end points: None = the facing sides' midpoints)
ARROWS: list[tuple[str, str, str, Point, tuple[Point, Point] | None]] = [
    ("vllm", "shards", "scrape (pull) :8000/metrics", (2.5, 7.15), None),
    ("node", "tsdb", "remote write:\nNVML series", (5.75, 5.9), ((6.9, 7.6), (4.7, 4.0))),
    ("shards", "tsdb", "remote write: scraped samples\n(durable queue per shard)", (2.5, 4.75), None),
    ("node", "central", "POST /api/v1/findings\nBearer token · outbox, retried", (9.3, 5.95),
     ((9.3, 7.6), (9.3, 4.3))),
    ("central", "tsdb", "PromQL /api/v1/query;\nremote write: recording, ALERTS", (5.45, 2.3),
     ((6.2, 3.1), (4.7, 3.1))),
    ("central", "am", "POST /api/v2/alerts\nboth replicas, every AM", (11.8, 4.75), None),
    ("am", "receivers", "routes, grouping,\nsilences", (14.35, 2.25), None),
    ("central", "scaler", "leader only", (8.7, 2.25), None),
]


def _anchor(box: tuple[float, float, float, float, str, str, str], toward: tuple[float, float]) -> tuple[float, float]:
    """The midpoint of the side of ``box`` that faces ``toward``."""
    x, y, w, h = box[:4]
    cx, cy = x + w / 2, y + h / 2
    dx, dy = toward[0] - cx, toward[1] - cy
    if abs(dx) * h > abs(dy) * w:
        return (x + w if dx > 0 else x, cy)
    return (cx, y + h if dy > 0 else y)


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(16.5, 9.6), dpi=110)
    ax.set_xlim(0, 16.5)
    ax.set_ylim(0, 10)
    ax.axis("off")
    ax.text(0.3, 9.55, "sre-agent beyond one machine: collect → store → evaluate → de-duplicate",
            fontsize=15, weight="bold", va="center")
    for x, y, w, h, title, detail, colour in BOXES.values():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05,rounding_size=0.15",
                                    fc=colour, ec="#374151", lw=1.4))
        ax.text(x + w / 2, y + h - 0.3, title, ha="center", va="center", fontsize=11.5, weight="bold")
        ax.text(x + w / 2, y + (h - 0.45) / 2, detail, ha="center", va="center", fontsize=9.6, linespacing=1.35)
    for src, dst, label, (lx, ly), given in ARROWS:
        a, b = BOXES[src], BOXES[dst]
        points = given or (_anchor(a, (b[0] + b[2] / 2, b[1] + b[3] / 2)),
                           _anchor(b, (a[0] + a[2] / 2, a[1] + a[3] / 2)))
        ax.add_patch(FancyArrowPatch(*points, arrowstyle="-|>", mutation_scale=16, lw=1.5, color="#1f2937",
                                     shrinkA=4, shrinkB=4))
        ax.text(lx, ly, label, ha="center", va="center", fontsize=9, color="#111827", linespacing=1.3,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.9})
    ax.text(12.2, 9.1, "Auth: one bearer token (Secret sre-agent-token)\n"
            "guards every agent's API; node agents send it\nwith each finding. Probes /healthz, /readyz open.\n"
            "HA: both central replicas send identical alerts;\nSlack, webhooks, scale requests: leader only.",
            fontsize=9.4, va="top", linespacing=1.4,
            bbox={"boxstyle": "round,pad=0.4", "fc": "#f9fafb", "ec": "#9ca3af"})
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "topology.png")
    args = ap.parse_args()
    draw(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
