"""A sample issue as a real PDF, for the reader's tests, its benchmark and trying it out.

Page 1 is a cover (the title on a coloured ground), then a few text pages; with
``pad_to_bytes`` a last page carries an image of random pixels, which Flate cannot
compress, so the file reaches about that size (a 50 MB issue for the benchmark) while
page 1 stays quick to draw.
"""

from __future__ import annotations

import random
from pathlib import Path

#: A5 in inches
PAGE_SIZE_IN = (5.83, 8.27)


def write_sample_pdf(
    path: Path, *, title: str, pages: int = 4, pad_to_bytes: int = 0, seed: int = 47
) -> int:
    """Write the sample PDF to ``path``; return its size in bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.backends.backend_pdf import PdfPages

    rng = random.Random(seed)
    # fonts embedded as TrueType, as publications embed theirs (matplotlib's default,
    # Type 3, draws every glyph from a content stream of its own)
    with matplotlib.rc_context({"pdf.fonttype": 42}), PdfPages(path) as pdf:
        fig = plt.figure(figsize=PAGE_SIZE_IN)
        fig.patch.set_facecolor("#1d3557")
        fig.text(0.5, 0.62, title, ha="center", va="center", fontsize=26, color="white", wrap=True)
        fig.text(0.5, 0.4, "pressrun sample issue", ha="center", fontsize=14, color="#f1faee")
        pdf.savefig(fig, facecolor=fig.get_facecolor())
        plt.close(fig)
        for number in range(2, pages + 1):
            fig = plt.figure(figsize=PAGE_SIZE_IN)
            fig.text(0.1, 0.9, f"Page {number}", fontsize=20)
            words = " ".join(
                rng.choice(["press", "run", "issue", "reader", "piece"]) for _ in range(60)
            )
            fig.text(0.1, 0.8, words, fontsize=10, va="top", wrap=True)
            pdf.savefig(fig)
            plt.close(fig)
        if pad_to_bytes > 0:
            side = max(1, int((pad_to_bytes / 3) ** 0.5))
            pixels = np.frombuffer(rng.randbytes(side * side * 3), dtype=np.uint8)
            fig = plt.figure(figsize=PAGE_SIZE_IN)
            ax = fig.add_axes((0.05, 0.05, 0.9, 0.9))
            ax.imshow(pixels.reshape(side, side, 3), interpolation="none")
            ax.set_axis_off()
            pdf.savefig(fig)
            plt.close(fig)
    return path.stat().st_size
