"""PNG bytes and files: the generator's only image format (lossless, with text metadata).

Owns :func:`encode_png` (uint8 (3, H, W) -> PNG bytes with iTXt chunks), :func:`write_image_file`
(temp file + ``os.replace``, no per-file fsync: see :mod:`pcpo_eval.generate`), and the readers
:func:`png_is_readable`, :func:`read_png_text`, :func:`read_png_pixels`, :func:`pixel_sha256`.
Knows nothing of settings or set directories (that is :mod:`.setdir`).
"""

import contextlib
import hashlib
import io
import os
from pathlib import Path

import numpy as np
import torch


def encode_png(image_chw: torch.Tensor | np.ndarray, text: dict[str, str]) -> bytes:
    """Lossless PNG bytes of one uint8 (3, H, W) image with tEXt/iTXt chunks ``text``."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    arr = image_chw.numpy() if isinstance(image_chw, torch.Tensor) else np.asarray(image_chw)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[0] != 3:
        raise ValueError(f"expected uint8 (3, H, W), got {arr.dtype} {arr.shape}")
    info = PngInfo()
    for k, v in text.items():
        info.add_itxt(k, v)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr.transpose(1, 2, 0)), "RGB").save(
        buf, format="PNG", pnginfo=info, compress_level=6
    )
    return buf.getvalue()


def write_image_file(path: Path, data: bytes) -> None:
    """Temp file in the same folder, then ``os.replace``: never a partial file at ``path``.

    No fsync per file (see the module docstring); the records flush syncs in groups. The file
    ends with mode ``0666 & ~umask`` like any other output (``mkstemp`` creates ``0600``).
    """
    from pcpo_eval.io import file_mode, temp_beside

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_beside(path)
    try:
        os.chmod(tmp, file_mode())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def png_is_readable(path: Path) -> bool:
    """The PNG decodes completely (guards against files cut short by a power loss)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
        return True
    except (OSError, SyntaxError, ValueError):
        return False


def read_png_text(path: str | Path) -> dict[str, str]:
    """The text chunks of a PNG written by :func:`encode_png`."""
    from PIL import Image

    with Image.open(path) as im:
        return dict(getattr(im, "text", {}))


def pixel_sha256(image_chw: np.ndarray) -> str:
    """SHA-256 of the raw uint8 pixels in (H, W, 3) order (independent of PNG metadata)."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(image_chw).transpose(1, 2, 0)).tobytes()).hexdigest()


def read_png_pixels(path: Path) -> np.ndarray:
    """The uint8 (3, H, W) RGB pixels of a PNG (the layout :func:`encode_png` takes)."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)
