"""Render lines of text into a PNG with a Debian font (fonts-dejavu-core), so that the expected text is known.

    python examples/ocr/render.py OUT.png "first line" "second line" ...

Used by the tests and the benchmark, and to make the bundled sample.png.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def render(lines: list[str], size: int = 32, width: int | None = None) -> bytes:
    """PNG bytes: black text on white, one line under the other, with margins."""
    if not FONT.is_file():  # Pillow's default font reads differently: the expectations are for this one
        raise FileNotFoundError(
            f"{FONT} is missing: install Debian's fonts-dejavu-core (make system-packages)"
        )
    font = ImageFont.truetype(str(FONT), size)
    boxes = [font.getbbox(line) for line in lines]
    line_height = int(size * 1.8)
    text_width = max(box[2] for box in boxes)
    image = Image.new("RGB", (width or text_width + 2 * size, line_height * len(lines) + size), "white")
    draw = ImageDraw.Draw(image)
    for index, line in enumerate(lines):
        draw.text((size, size // 2 + index * line_height), line, fill="black", font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


if __name__ == "__main__":
    Path(sys.argv[1]).write_bytes(render(sys.argv[2:]))
