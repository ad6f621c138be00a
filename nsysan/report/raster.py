"""PNG pictures drawn with numpy + Pillow: the timeline and the per-layer bars.

Why not matplotlib: importing it takes about a second on the 2-core reference machine, more
than a whole analysis of a 20k-kernel trace, and its artists cost per gap and step line. The
pictures here are rasterised directly: every panel is a numpy image whose pixel columns map
to the timeline's fixed bins (so the cost is bounded by the image size, never by the number
of events), and Pillow adds only the text and the two step curves.
"""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
import polars as pl
from PIL import Image, ImageDraw, ImageFont

# The format plugins that Pillow loads on the first save (~15 ms): at import, which
# `nsysan analyze` does while the trace loads, instead of inside the first picture.
Image.preinit()

WHITE = (255, 255, 255)
INK = (33, 33, 33)
GRID = (224, 224, 224)


def rgb(color: str) -> tuple[int, int, int]:
    c = color.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


@lru_cache(maxsize=4)
def font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError):  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def plain(text: str) -> str:
    """Characters Pillow's bundled font lacks, spelled in ASCII."""
    return text.replace("≥", ">=").replace("≤", "<=").replace("…", "...")


def blend(img: np.ndarray, mask: np.ndarray, color: str, alpha: float) -> None:
    """Paint ``color`` at ``alpha`` over ``img`` where ``mask`` (in place).

    The blend of a channel depends on its value alone: it is computed once for all 256
    values (a lookup table) and the pixels look it up, instead of float arithmetic on every
    masked pixel."""
    c = np.array(rgb(color), dtype=np.float32)
    lut = (np.arange(256, dtype=np.uint8)[:, None] * (1 - alpha) + c * alpha).astype(np.uint8)
    for k in range(3):
        channel = img[..., k]
        np.copyto(channel, lut[:, k].take(channel), where=mask)


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)  # fast zlib; files a few % larger
    return buf.getvalue()


def _ticks(lo: float, hi: float, n: int = 6) -> np.ndarray:
    span = max(hi - lo, 1e-12)
    raw = span / n
    mag = 10 ** np.floor(np.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return np.arange(np.ceil(lo / step) * step, hi + step * 1e-9, step)


def timeline(edges: np.ndarray, busy: np.ndarray, lanes: dict[str, np.ndarray],
             gaps: pl.DataFrame, steps: list[int], window: tuple[int, int] | None,
             colors: dict[str, str], title: str,
             host: tuple[dict[str, np.ndarray], list[tuple[str, str]]] | None = None) -> bytes:
    """Utilisation panel (busy area, compute and exposed-NCCL curves, gaps shaded red, step
    lines dotted, analysed window dashed) above one heat-strip lane per class.

    ``host``: the lanes whose bins are coloured by a category, ``{lane: index per bin}``, and
    the categories ``[(name, colour)]`` (index -1: the last one); those lanes shade from white
    to their bin's colour by share, and a legend of the categories drawn is added."""
    w, left, right, top = 1200, 90, 20, 28
    ph = 230  # utilisation panel height (0..105 %)
    lane_h = 18
    names = list(lanes)
    lanes_top = top + ph + 24
    categorical, categories = host if host is not None else ({}, [])
    legend_h = 18 if categorical else 0
    h = lanes_top + lane_h * len(names) + 46 + legend_h
    pw = w - left - right
    img = np.full((h, w, 3), 255, dtype=np.uint8)
    t0, t1 = float(edges[0]), float(edges[-1])
    n_bins = edges.size - 1
    # pixel column -> bin (edges are equally spaced)
    col_bin = np.minimum((np.arange(pw) * n_bins) // pw, n_bins - 1)

    def x_of(t: np.ndarray) -> np.ndarray:
        return np.clip(((t - t0) / max(t1 - t0, 1) * pw).astype(np.int64), 0, pw - 1)

    panel = img[top:top + ph, left:left + pw]
    for pct in range(0, 101, 20):  # light grid lines
        panel[ph - 1 - int(pct / 105 * (ph - 1))] = GRID
    heights = (np.clip(busy[col_bin], 0, 1) * 100 / 105 * (ph - 1)).astype(np.int64)
    rows = np.arange(ph)[:, None]
    blend(panel, rows >= (ph - 1 - heights)[None, :], colors["compute"], 0.35)
    if gaps.height:
        cover = np.zeros(pw + 1, dtype=np.int64)
        xs = x_of(gaps["start_ns"].to_numpy().astype(float))
        xe = np.maximum(x_of(gaps["end_ns"].to_numpy().astype(float)), xs) + 1
        np.add.at(cover, xs, 1)
        np.add.at(cover, xe, -1)
        shaded = np.cumsum(cover)[:pw] > 0
        blend(panel, np.broadcast_to(shaded[None, :], panel.shape[:2]), "#e53935", 0.25)
    dotted = (np.arange(ph) % 3 == 0)[:, None]
    if steps:
        cols = np.zeros(pw, dtype=bool)
        cols[x_of(np.asarray(steps, dtype=float))] = True
        blend(panel, dotted & cols[None, :], "#9e9e9e", 0.8)
    if window is not None:
        cols = np.zeros(pw, dtype=bool)
        cols[x_of(np.asarray(window, dtype=float))] = True
        panel[((np.arange(ph) % 8) < 5)[:, None] & cols[None, :]] = (0, 0, 0)
    # lanes: white -> dark green by share, like a Greens colour map
    lo, hi = np.array([247, 252, 245], np.float32), np.array([0, 68, 27], np.float32)
    palette = np.array([rgb(c) for _, c in categories] or [(0, 0, 0)], np.float32)
    white = np.array(WHITE, np.float32)
    for j, name in enumerate(names):
        v = np.clip(lanes[name][col_bin], 0, 1)[:, None]
        y = lanes_top + j * lane_h
        if name in categorical:  # white -> the bin's category colour by share
            top_c = palette[categorical[name][col_bin]]  # (index -1: the last category)
            strip = white + (top_c - white) * v
        else:
            strip = lo + (hi - lo) * v
        img[y + 1:y + lane_h - 1, left:left + pw] = strip.astype(np.uint8)
    # frames
    for y0, y1 in ((top, top + ph), (lanes_top, lanes_top + lane_h * len(names))):
        img[y0:y1, [left - 1, left + pw]] = INK
        img[[y0 - 1, y1], left - 1:left + pw + 1] = INK
    im = Image.fromarray(img)
    d = ImageDraw.Draw(im)
    f, small = font(12), font(10)
    xm = np.arange(pw) + left
    for key in ("compute", "exposed nccl", "memory in use"):
        if key in lanes:
            ys = top + ph - 1 - (np.clip(lanes[key][col_bin], 0, 1) * 100 / 105 * (ph - 1))
            d.line(list(zip(xm.tolist(), ys.tolist(), strict=True)), fill=rgb(colors[key]),
                   width=1)
    d.text((w // 2, 6), plain(title), fill=INK, font=f, anchor="ma")
    for pct in range(0, 101, 20):
        y = top + ph - 1 - pct / 105 * (ph - 1)
        d.text((left - 6, y), str(pct), fill=INK, font=small, anchor="rm")
    d.text((12, top + ph // 2), "% of bin", fill=INK, font=small, anchor="lm")
    legend = [("busy (any op)", colors["compute"]), ("compute", colors["compute"])]
    if "exposed nccl" in lanes:
        legend.append(("exposed nccl", colors["exposed nccl"]))
    if "memory in use" in lanes:  # (memory-usage events: % of device memory, not of bin)
        legend.append(("memory % of device", colors["memory in use"]))
    lx = left + pw - 10 - 120 * len(legend)
    for k, (label, color) in enumerate(legend):
        x = lx + 120 * k
        d.rectangle((x, top + ph - 18, x + 14, top + ph - 10), fill=rgb(color))
        d.text((x + 18, top + ph - 14), label, fill=INK, font=small, anchor="lm")
    for j, name in enumerate(names):
        d.text((left - 6, lanes_top + j * lane_h + lane_h // 2), plain(name), fill=INK,
               font=small, anchor="rm")
    axis_y = lanes_top + lane_h * len(names)
    for t in _ticks(t0 / 1e9, t1 / 1e9):
        x = left + (t * 1e9 - t0) / max(t1 - t0, 1) * pw
        d.line((x, axis_y, x, axis_y + 4), fill=INK)
        d.text((x, axis_y + 6), f"{t:g}", fill=INK, font=small, anchor="ma")
    d.text((left + pw // 2, h - 16 - legend_h), "session time (s)", fill=INK, font=f,
           anchor="ma")
    if categorical:  # the categories some bin of a categorical lane has
        drawn = np.unique(np.concatenate([categorical[n][col_bin] for n in categorical]))
        shown = [categories[int(i)] for i in sorted(drawn % len(categories))]
        x = left
        d.text((x, h - 12), "host lanes (on-CPU share; colour: layer of most samples):",
               fill=INK, font=small, anchor="lm")
        x += 300
        for label, color in shown:
            d.rectangle((x, h - 16, x + 14, h - 8), fill=rgb(color))
            d.text((x + 18, h - 12), plain(label), fill=INK, font=small, anchor="lm")
            x += 18 + int(d.textlength(plain(label), font=small)) + 14
    return png_bytes(im)


def bars(names: list[str], values_ms: list[float], labels: list[str], color: str,
         title: str, xlabel: str) -> bytes:
    """Horizontal bars, largest on top, a name on the left and a label after each bar."""
    n = len(names)
    w, left, right, top, bar_h = 1000, 330, 80, 30, 22
    h = top + bar_h * max(n, 3) + 50
    im = Image.new("RGB", (w, h), WHITE)
    d = ImageDraw.Draw(im)
    f, small = font(12), font(10)
    pw = w - left - right
    vmax = max([v for v in values_ms if v == v] + [1e-12])
    d.text((w // 2, 8), plain(title), fill=INK, font=f, anchor="ma")
    for i, (name, v, lab) in enumerate(zip(names, values_ms, labels, strict=True)):
        y = top + i * bar_h
        x1 = left + max(v, 0) / vmax * pw
        d.rectangle((left, y + 3, max(x1, left + 1), y + bar_h - 3), fill=rgb(color))
        d.text((left - 6, y + bar_h // 2), plain(name), fill=INK, font=small, anchor="rm")
        d.text((x1 + 4, y + bar_h // 2), lab, fill=INK, font=small, anchor="lm")
    axis_y = top + bar_h * max(n, 3)
    d.line((left, top, left, axis_y), fill=INK)
    d.line((left, axis_y, left + pw, axis_y), fill=INK)
    for t in _ticks(0, vmax):
        x = left + t / vmax * pw
        d.line((x, axis_y, x, axis_y + 4), fill=INK)
        d.text((x, axis_y + 6), f"{t:g}", fill=INK, font=small, anchor="ma")
    d.text((left + pw // 2, h - 18), xlabel, fill=INK, font=f, anchor="ma")
    return png_bytes(im)
