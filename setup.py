"""Build the Cython wire engine (router/_fast). Metadata lives in pyproject.toml."""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("QROUTER_DEBUG") == "1"

directives = {
    "language_level": "3",
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "cdivision": True,
    "initializedcheck": DEBUG,
    "embedsignature": True,
}

macros = [("CYTHON_TRACE_NOGIL", "1")] if DEBUG else []
if DEBUG:
    directives["linetrace"] = True

extensions = [
    Extension(
        f"router._fast.{name}",
        [f"router/_fast/{name}.pyx"],
        extra_compile_args=["-O2"] if not DEBUG else ["-O0", "-g"],
        define_macros=macros,
    )
    for name in ("codec", "engine")
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        compile_time_env={"QROUTER_DEBUG": DEBUG},
        annotate=DEBUG,
    ),
)
