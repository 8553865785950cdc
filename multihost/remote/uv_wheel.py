"""The uv binary out of a uv wheel (stdlib only; run with the host's ``python3 -c``).

``python3 -c SOURCE DIR DEST``: the one ``*.whl`` that ``pip download`` left in DIR, its
``uv-<version>.data/scripts/uv`` (where the uv wheels keep the binary) written to DEST.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import zipfile


def main(argv: list[str]) -> int:
    wheels = glob.glob(os.path.join(argv[1], "*.whl"))
    if len(wheels) != 1:
        print(f"expected one uv wheel from pip, found {len(wheels)}", file=sys.stderr)
        return 4
    with zipfile.ZipFile(wheels[0]) as z:
        names = [n for n in z.namelist() if n.endswith(".data/scripts/uv")]
        if not names:
            print(f"{os.path.basename(wheels[0])} holds no uv binary", file=sys.stderr)
            return 4
        with z.open(names[0]) as src, open(argv[2], "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
