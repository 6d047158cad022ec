"""``dispatch_cost.png``: per-step classification cost against batch size.

Drawn with Pillow (a dependency of vLLM itself, so present in every vLLM
venv): a log-log chart, one line per rule, bars for the 10th-90th percentile.
Pillow's default font has no "µ": the chart writes "us".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.summaries import CASE_LABELS

WIDTH, HEIGHT = 1000, 600
LEFT, RIGHT, TOP, BOTTOM = 80, 380, 56, 64
COLORS = {
    "v1.shape": (150, 150, 150),
    "v1.phase": (31, 119, 180),
    "v1.phase_prefill": (174, 199, 232),
    "mrv2.shape": (90, 90, 90),
    "mrv2.phase": (44, 160, 44),
    "mrv2.phase_stale": (152, 223, 138),
    "mrv2.native": (214, 39, 40),
}

Point = tuple[int, float, float, float]  # num_reqs, median, p10, p90 (µs)


def series(
    results: dict[str, Any],
) -> list[tuple[str, tuple[int, int, int], list[Point]]]:
    """The lines to draw: the first release's rules, plus the native reference."""
    summaries = results["dispatch_cost"]["summary"]
    primary = next(iter(summaries))
    lines = []
    for version, summary in summaries.items():
        for name, per_size in summary["cases"].items():
            if version != primary and name != "mrv2.native":
                continue
            if name.startswith("replay_"):
                continue  # the replay guard's cost per replay, not a dispatch rule
            points = [
                (int(size), row["us"]["median"], row["us"]["p10"], row["us"]["p90"])
                for size, row in sorted(per_size.items(), key=lambda kv: int(kv[0]))
            ]
            label = f"{CASE_LABELS.get(name, name)} ({version})"
            lines.append((label, COLORS.get(name, (0, 0, 0)), points))
    return lines


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one bitmap size
        return ImageFont.load_default()


def draw(results: dict[str, Any], path: Path) -> None:
    from PIL import Image, ImageDraw

    lines = series(results)
    points = [point for _, _, pts in lines for point in pts]
    sizes = sorted({point[0] for point in points})
    low = min(min(point[2] for point in points), 0.5)
    high = max(point[3] for point in points)
    y_min, y_max = math.floor(math.log10(low)), math.ceil(math.log10(high))
    x_min, x_max = math.log2(sizes[0]), math.log2(sizes[-1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_at(num_reqs: float) -> float:
        span = (x_max - x_min) or 1.0
        return LEFT + plot_w * (math.log2(num_reqs) - x_min) / span

    def y_at(value: float) -> float:
        fraction = (math.log10(max(value, 10.0**y_min)) - y_min) / (y_max - y_min)
        return TOP + plot_h * (1 - fraction)

    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    canvas = ImageDraw.Draw(image)
    small, normal, title = _font(12), _font(14), _font(17)
    canvas.text(
        (LEFT, 16),
        "Per-step uniform-decode classification cost (microseconds per step, log-log)",
        fill="black",
        font=title,
    )
    for exponent in range(y_min, y_max + 1):
        for mantissa in (1, 2, 5):
            value = mantissa * 10.0**exponent
            if value > 10.0**y_max:
                break
            y = y_at(value)
            shade = (205, 205, 205) if mantissa == 1 else (235, 235, 235)
            canvas.line([(LEFT, y), (LEFT + plot_w, y)], fill=shade)
            label = f"{value:g}"
            canvas.text((LEFT - 8, y), label, fill="black", font=small, anchor="rm")
    for num_reqs in sizes:
        x = x_at(num_reqs)
        canvas.line([(x, TOP), (x, TOP + plot_h)], fill=(225, 225, 225))
        canvas.text(
            (x, TOP + plot_h + 8), str(num_reqs), fill="black", font=small, anchor="mt"
        )
    canvas.rectangle([(LEFT, TOP), (LEFT + plot_w, TOP + plot_h)], outline="black")
    canvas.text(
        (LEFT + plot_w / 2, HEIGHT - 22),
        "requests in the batch (num_reqs)",
        fill="black",
        font=normal,
        anchor="mm",
    )
    canvas.text((14, TOP - 22), "us", fill="black", font=normal)

    for index, (label, color, pts) in enumerate(lines):
        xy = [(x_at(n), y_at(median)) for n, median, _, _ in pts]
        if len(xy) > 1:
            canvas.line(xy, fill=color, width=3)
        for (_, _, p10, p90), (x, y) in zip(pts, xy, strict=True):
            canvas.line([(x, y_at(p10)), (x, y_at(p90))], fill=color, width=1)
            canvas.line([(x - 4, y_at(p10)), (x + 4, y_at(p10))], fill=color)
            canvas.line([(x - 4, y_at(p90)), (x + 4, y_at(p90))], fill=color)
            canvas.ellipse([(x - 4, y - 4), (x + 4, y + 4)], fill=color)
        legend_y = TOP + 10 + index * 40
        legend_x = LEFT + plot_w + 20
        canvas.line(
            [(legend_x, legend_y + 7), (legend_x + 26, legend_y + 7)],
            fill=color,
            width=3,
        )
        words, wrapped, current = label.split(), [], ""
        for word in words:
            candidate = f"{current} {word}".strip()
            if canvas.textlength(candidate, font=small) > RIGHT - 60 and current:
                wrapped.append(current)
                current = word
            else:
                current = candidate
        wrapped.append(current)
        for line_index, text in enumerate(wrapped):
            canvas.text(
                (legend_x + 34, legend_y + line_index * 14),
                text,
                fill="black",
                font=small,
            )
    canvas.text(
        (LEFT + plot_w + 20, TOP + plot_h - 14),
        "bars: 10th-90th percentile",
        fill=(90, 90, 90),
        font=small,
    )
    image.save(path, format="PNG", optimize=True)
