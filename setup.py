"""Build the Cython wire engine (qrouter/_fast). Metadata lives in pyproject.toml."""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("QROUTER_DEBUG") == "1"
# Opt-in fuzzing build (tests/fuzz/README in tests/README.md): clang with libFuzzer's coverage
# instrumentation, so atheris sees which C branches of the engine an input reached.
# QROUTER_FUZZ=1: coverage only; QROUTER_FUZZ=asan: coverage + AddressSanitizer (run with the
# ASan runtime preloaded, see tests/fuzz/run.py). Unset: the normal build, unchanged.
FUZZ = os.environ.get("QROUTER_FUZZ", "")
if FUZZ not in ("", "0", "1", "asan"):
    raise SystemExit(f"QROUTER_FUZZ must be 1 or asan, not {FUZZ!r}")
FUZZ = "" if FUZZ == "0" else FUZZ
fuzz_flags: list[str] = []
if FUZZ:
    os.environ["CC"] = "clang"
    os.environ["LDSHARED"] = "clang -shared"
    sanitizers = "fuzzer-no-link,address" if FUZZ == "asan" else "fuzzer-no-link"
    fuzz_flags = [f"-fsanitize={sanitizers}", "-g", "-fno-omit-frame-pointer"]

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
        f"qrouter._fast.{name}",
        [f"qrouter/_fast/{name}.pyx"],
        extra_compile_args=(["-O2"] if not DEBUG else ["-O0", "-g"]) + fuzz_flags,
        extra_link_args=fuzz_flags,
        define_macros=macros,
    )
    for name in ("codec", "engine", "eo_core")
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        compile_time_env={"QROUTER_DEBUG": DEBUG},
        annotate=DEBUG,
    ),
)
