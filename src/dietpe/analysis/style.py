"""One colour and marker per method, shared by every figure of a comparison.

Colours come from matplotlib's 20-colour `tab20` cycle and markers from a 9-marker cycle; since 20 and 9 are
coprime, the first 180 methods of a list all get a distinct (colour, marker) pair, and the first 20 distinct
colours.
"""

from __future__ import annotations

TAB20 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
         "#dbdb8d", "#9edae5")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<")


def method_styles(names: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (colour, marker) for the methods of one comparison, in their order (a pure function of the
    list, so every figure of a report agrees)."""
    out: dict[str, tuple[str, str]] = {}
    for name in names:
        if name not in out:
            i = len(out)
            out[name] = (TAB20[i % len(TAB20)], MARKERS[i % len(MARKERS)])
    return out
