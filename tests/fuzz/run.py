"""Run a coverage-guided fuzzing campaign on one target (tests/fuzz/targets.py) with atheris.

    python -m tests.fuzz.run --target connection --minutes 60 [--asan] [-- LIBFUZZER_FLAGS]

What it does (tests/README.md, "Fuzzing"):

1. builds the engine with clang's coverage instrumentation into ``build/fuzz-cov`` (or
   ``build/fuzz-asan`` with ``--asan``): ``QROUTER_FUZZ=1 python setup.py build_ext`` with a
   separate build dir, so the in-place (normal) build is untouched; and a shared libFuzzer
   runtime (``libfuzzer.so``, from clang's ``libclang_rt.fuzzer_no_main``) that atheris uses
   when it is preloaded, so the instrumented extension's coverage hooks resolve to it;
2. runs the target under atheris in a child process (``LD_PRELOAD``, the instrumented
   ``qrouter._fast`` first on its package path, the Python modules of ``router`` instrumented
   too), over the committed corpus ``tests/fuzz/corpus/<target>`` plus a working corpus
   ``build/fuzz-work/<target>`` where new inputs go;
3. when the child stops on a finding (an exception, a crash, a timeout, an out-of-memory), the
   input is kept as ``build/fuzz-work/<target>-artifacts/crash-*`` and a new child carries on,
   until the time is up; then it prints the campaign's figures (executions, exec/s, cov / ft as
   libFuzzer counts them, corpus size, findings).

A finding becomes a regression: copy the artifact to ``tests/fuzz/regressions/<target>/`` with a
name that says what it is; ``tests/fuzz/test_corpus.py`` replays it. To minimise a corpus for
committing, ``--merge`` adds to ``tests/fuzz/corpus/<target>`` the working corpus's inputs that
reach features the seeds do not (libFuzzer's ``-merge=1``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"
WORK = ROOT / "build" / "fuzz-work"
MAX_LEN = {"connection": 32768, "session": 32768, "interrouter": 16384}
STATUS = re.compile(r"#(\d+)\s+(\w+)\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+).*?exec/s: (\d+)")


def build(asan: bool) -> Path:
    """The instrumented extension and the libFuzzer runtime, in build/fuzz-{cov,asan}."""
    out = ROOT / "build" / ("fuzz-asan" if asan else "fuzz-cov")
    env = dict(os.environ, QROUTER_FUZZ="asan" if asan else "1")
    cmd = [sys.executable, "setup.py", "-q", "build_ext"]
    cmd += ["--build-lib", str(out), "--build-temp", str(out) + "-tmp"]
    # other builds of this checkout write the generated .c files too: take the build lock
    if shutil.which("flock"):
        cmd = ["flock", "/tmp/qrouter-build.lock", *cmd]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    runtime = out / "libfuzzer.so"
    if not runtime.exists():
        rt = subprocess.run(
            ["clang", "-print-resource-dir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        archive = Path(rt) / "lib" / "linux" / "libclang_rt.fuzzer_no_main-x86_64.a"
        link = ["clang++", "-shared", "-o", str(runtime), "-Wl,--whole-archive", str(archive)]
        subprocess.run([*link, "-Wl,--no-whole-archive", "-lpthread"], check=True)
    return out


def preload(out: Path, asan: bool) -> str:
    libs = [str(out / "libfuzzer.so")]
    if asan:
        asan_rt = subprocess.run(
            ["clang", "-print-file-name=libclang_rt.asan-x86_64.so"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        # after libFuzzer: the ASan runtime's own (weak) coverage hooks would otherwise take
        # the instrumented extension's counters (ASAN_OPTIONS lets it not come first)
        libs.append(asan_rt)
    return " ".join(libs)


def child(target: str, out: Path, libfuzzer_args: list[str]) -> None:
    """Inside the preloaded process: instrument, set up atheris, fuzz."""
    import atheris

    import qrouter._fast

    qrouter._fast.__path__.insert(0, str(out / "qrouter" / "_fast"))
    with atheris.instrument_imports(include=["qrouter"]):
        import qrouter.core  # noqa: F401 - instrumented for coverage
        import qrouter.eo  # noqa: F401
        import qrouter.management  # noqa: F401
        import qrouter.mesh  # noqa: F401
        import qrouter.message  # noqa: F401
    from qrouter._fast import codec

    assert codec.__file__ is not None and codec.__file__.startswith(str(out)), codec.__file__
    from tests.fuzz.targets import TARGETS

    # libFuzzer re-runs argv[0] through the shell for -merge and -fork: make it this command
    argv0 = f"{sys.executable} -m tests.fuzz.run --child --target {target} --build-dir {out} --"
    atheris.Setup([argv0, *libfuzzer_args], TARGETS[target])
    atheris.Fuzz()


def campaign(args: argparse.Namespace) -> int:
    out = build(args.asan)
    work = WORK / args.target  # shared by a plain and an --asan campaign (libFuzzer -reload)
    name = args.target + ("-asan" if args.asan else "")
    artifacts = WORK / f"{name}-artifacts"
    work.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    seeds = CORPUS / args.target
    env = dict(os.environ, LD_PRELOAD=preload(out, args.asan), PYTHONPATH=str(ROOT))
    if args.asan:
        env["ASAN_OPTIONS"] = "detect_leaks=0:allocator_may_return_null=1:verify_asan_link_order=0"
    deadline = time.monotonic() + args.minutes * 60
    log_path = WORK / f"{name}.log"
    totals = {"execs": 0, "runs": 0, "findings": 0}
    last: tuple[int, int, int, str] = (0, 0, 0, "")
    started = time.monotonic()
    with open(log_path, "a") as log:
        while (left := int(deadline - time.monotonic())) > 5:
            lf_args = [
                str(work),
                str(seeds),
                f"-max_total_time={left}",
                f"-max_len={MAX_LEN.get(args.target, 8192)}",
                "-timeout=10",
                "-rss_limit_mb=2048",
                "-print_final_stats=1",
                f"-artifact_prefix={artifacts}/",
                *args.libfuzzer,
            ]
            cmd = [sys.executable, "-m", "tests.fuzz.run", "--child", "--target", args.target]
            cmd += ["--build-dir", str(out), "--", *lf_args]
            if args.nice:
                cmd = ["nice", "-n", str(args.nice), *cmd]
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, stdout=log, text=True
            )
            assert proc.stderr is not None
            execs = 0
            for line in proc.stderr:
                log.write(line)
                m = STATUS.search(line)
                if m:
                    execs = int(m.group(1))
                    last = (int(m.group(3)), int(m.group(4)), int(m.group(5)), m.group(6))
                if "Test unit written to" in line or "ERROR: libFuzzer" in line:
                    print(line.rstrip(), flush=True)
                    if "Test unit written to" in line:
                        totals["findings"] += 1
            proc.wait()
            totals["execs"] += execs
            totals["runs"] += 1
            log.flush()
            if proc.returncode == 0:
                break
    elapsed = time.monotonic() - started
    files = list(work.iterdir())
    summary = (
        f"target {name}: {elapsed / 60:.1f} min, {totals['execs']} executions "
        f"({totals['execs'] / max(elapsed, 1):.0f}/s), cov {last[0]} ft {last[1]}, "
        f"corpus {last[2]} inputs / {last[3]} (working dir {len(files)} files), "
        f"{totals['findings']} findings in {totals['runs']} run(s); log {log_path}"
    )
    print(summary)
    with open(log_path, "a") as log:
        log.write(summary + "\n")
    return 1 if totals["findings"] else 0


def merge(args: argparse.Namespace) -> int:
    """Fold a campaign into the committed corpus: libFuzzer's -merge=1 of the working corpus
    into a copy of the seeds keeps only the inputs that reach features the seeds do not; they
    are added as ``campaign-<sha1>.bin`` (the seeds themselves all stay)."""
    out = build(args.asan)
    env = dict(os.environ, LD_PRELOAD=preload(out, args.asan), PYTHONPATH=str(ROOT))
    if args.asan:
        env["ASAN_OPTIONS"] = "detect_leaks=0:verify_asan_link_order=0"
    seeds = CORPUS / args.target
    fresh = WORK / f"{args.target}-merged"
    shutil.rmtree(fresh, ignore_errors=True)
    shutil.copytree(seeds, fresh)
    before = {p.name for p in fresh.iterdir()}
    cmd = [sys.executable, "-m", "tests.fuzz.run", "--child", "--target", args.target]
    cmd += ["--build-dir", str(out), "--", "-merge=1", f"-max_len={MAX_LEN.get(args.target, 8192)}"]
    cmd += [*args.libfuzzer, str(fresh), str(WORK / args.target)]
    subprocess.run(["nice", "-n", str(args.nice), *cmd], cwd=ROOT, env=env, check=True)
    added = [p for p in fresh.iterdir() if p.name not in before]
    for p in added:
        shutil.copy(p, seeds / f"campaign-{p.name}.bin")
    size = sum(p.stat().st_size for p in added)
    print(f"{args.target}: {len(added)} campaign inputs ({size} bytes) added to {seeds}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", required=True, help="connection, session, message, ...")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--asan", action="store_true", help="also AddressSanitizer")
    p.add_argument("--nice", type=int, default=19, help="niceness of the fuzzing process")
    p.add_argument("--merge", action="store_true", help="fold the campaign into the corpus")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--build-dir", help=argparse.SUPPRESS)
    p.add_argument("libfuzzer", nargs="*", help="extra libFuzzer flags, after --")
    args = p.parse_args(argv)
    if args.child:
        child(args.target, Path(args.build_dir), args.libfuzzer)
        return 0
    from tests.fuzz.targets import TARGETS

    if args.target not in TARGETS:
        p.error(f"--target is one of {', '.join(TARGETS)}")
    return merge(args) if args.merge else campaign(args)


if __name__ == "__main__":
    sys.exit(main())
