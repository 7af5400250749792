"""Compile the engine-side modules with mypyc, in place (``make native``).

The same source runs interpreted when nothing is compiled; compiled it is about twice as fast
(docs/performance.md). The group name puts mypyc's shared runtime inside the package, so the
extensions import from any working directory.
"""

from __future__ import annotations

import sys

from mypyc.build import mypycify
from setuptools import setup  # type: ignore[import-untyped]

from eva.native import GROUP, MODULES

if __name__ == "__main__":
    sys.argv[1:] = ["build_ext", "--inplace", "--build-temp", "build/native"]
    setup(
        name="evamed-native",
        ext_modules=mypycify([f"eva/{name}.py" for name in MODULES],
                             group_name=GROUP, opt_level="3"),
        script_args=sys.argv[1:],
    )
