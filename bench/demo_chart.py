"""A small PNG line chart for the demos, with no plotting library: numpy pixels + zlib.

``write_chart(path, samples)`` draws, over time, the throughput of messages written and
resharded (messages/s between samples, top half) and the resharding lag (messages, bottom
half). Colours: written blue, resharded green, lag red; no text (the demo prints the same
figures as a table).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence

import numpy as np

WIDTH, HEIGHT, MARGIN = 900, 500, 20
BLUE, GREEN, RED, GREY = (40, 90, 200), (30, 150, 60), (200, 40, 40), (200, 200, 200)


def _line(pixels: np.ndarray, points: list[tuple[int, int]], colour: tuple[int, int, int]) -> None:
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for t in np.linspace(0.0, 1.0, steps + 1):
            x, y = round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t)
            pixels[max(0, y - 1):y + 2, max(0, x - 1):x + 2] = colour


def _panel(pixels: np.ndarray, top: int, bottom: int, times: Sequence[float],
           series: list[tuple[Sequence[float], tuple[int, int, int]]]) -> None:  # fmt: skip
    pixels[bottom, MARGIN:WIDTH - MARGIN] = GREY
    pixels[top:bottom, MARGIN] = GREY
    span = max(times[-1] - times[0], 1e-9)
    peak = max([max(values) for values, _ in series] + [1])
    for values, colour in series:
        points = [(MARGIN + round((t - times[0]) / span * (WIDTH - 2 * MARGIN)),
                   bottom - round(v / peak * (bottom - top))) for t, v in zip(times, values,
                                                                              strict=True)]
        _line(pixels, points, colour)


def write_chart(path: str, samples: Sequence[tuple[float, int, int, int]]) -> None:
    """``samples``: (seconds, messages written, messages resharded, lag) over time."""
    pixels = np.full((HEIGHT, WIDTH, 3), 255, dtype=np.uint8)
    if len(samples) >= 2:
        times = [s[0] for s in samples]
        rates = []
        for index in (1, 2):
            rate = [0.0] + [max(0.0, (b[index] - a[index]) / max(b[0] - a[0], 1e-9))
                            for a, b in itertools.pairwise(samples)]  # fmt: skip
            rates.append(rate)
        middle = HEIGHT // 2
        _panel(pixels, MARGIN, middle - MARGIN, times, [(rates[0], BLUE), (rates[1], GREEN)])
        _panel(pixels, middle + MARGIN, HEIGHT - MARGIN, times, [([s[3] for s in samples], RED)])
    raw = b"".join(b"\0" + pixels[row].tobytes() for row in range(HEIGHT))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))  # fmt: skip

    header = struct.pack(">IIBBBBB", WIDTH, HEIGHT, 8, 2, 0, 0, 0)
    with open(path, "wb") as handle:
        handle.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                     + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
