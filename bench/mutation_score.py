"""Mutation score of each core module: mutmut mutates the module, runs the module's own tests against
each mutant, and a mutant counts as killed when a test fails. Run through `scripts/mutation.sh`.

    scripts/mutation.sh                  # every module below, then the table
    scripts/mutation.sh rolling removal  # just these
    scripts/mutation.sh --report         # the table from the last runs, running nothing
    scripts/mutation.sh --survivors render  # after new tests or a change: see `retest`
    scripts/mutation.sh --report --diffs settings  # each survivor's changed lines (`mutmut show` is slow)

mutmut tests each mutant in a process forked from its own, which has run the tests once: gRPC does
not survive a fork (the child hangs, or exits 64 with fork support on), so for the modules whose tests
start gRPC channels or servers each forked child runs the mutant's tests in a fresh `python -m pytest`
instead (`_fresh_test_processes`). The others (IN_FORK) keep mutmut's own forked runner, which spends
milliseconds per mutant where a fresh pytest spends seconds importing.

Each module runs in its own work directory, `.mutation/<module>/` (git-ignored), so runs of different
modules never share mutmut's state. mutmut itself forgets every result when it runs again, so a plain
run is a full run; `--survivors` retests the last survivors, timeouts and mutants not reached, plus
every mutant of a function changed since, and keeps the other results (`retest`). The score
is killed / (checked - equivalent), where equivalent mutants are the ones `tests/data/
equivalent_mutants.txt` lists, each with why no test can tell it from the original and a stamp of the
mutation so judged (`--stamp` writes missing ones; a renumbered mutant no longer matches). Survivors are
printed with `mutmut show`'s name, to read with `(cd .mutation/<module> && mutmut show <name>)`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
EQUIVALENT = ROOT / "tests" / "data" / "equivalent_mutants.txt"
TARGET = 0.90
# What the tests import or run besides the mutated files (mutmut copies these into its `mutants/` tree).
PROJECT_PATHS = ["talos_proxmox", "providers", "components", "schematics", "stacks", "tests", ".tools", "__main__.py",
                 "Pulumi.yaml", "pytest.ini"]

# module -> (files mutated, the tests that are that module's own)
MODULES = {
    "settings": ([f"talos_proxmox/settings/{module}.py" for module in (
                      "stack", "model", "values", "cluster", "network", "proxmox", "image", "nodes", "addons",
                      "lifecycle", "stack_config", "credentials")],
                 ["tests/unit/settings/test_stack.py", "tests/unit/settings/test_values.py", "tests/program/test_credentials.py",
                  "tests/program/test_bad_stacks.py", "tests/unit/commands/test_render.py"]),
    "render": (["talos_proxmox/talos_config/machine_config.py", "talos_proxmox/talos_config/merge.py"],
               ["tests/unit/talos_config/test_machine_config.py", "tests/unit/talos_config/test_patches.py", "tests/unit/talos_config/test_gen_config_fixtures.py",
                "tests/unit/cluster_plan/test_node_patches.py",
                "tests/unit/cluster_plan/test_addon_machine_config.py", "tests/unit/cluster_plan/test_addon_values.py", "tests/unit/talos_config/test_json_schema.py",
                "tests/unit/talos_config/test_talos_oracle.py", "tests/unit/commands/test_render.py", "tests/program/test_first_boot_variants.py"]),
    "redaction": (["talos_proxmox/talos_config/redaction.py"], ["tests/unit/talos_config/test_redaction.py"]),
    "operations": (["talos_proxmox/talos_api/operations.py"], ["tests/providers/test_talos_operations.py"]),
    "rolling": (["talos_proxmox/day_two/rolling.py"],
                ["tests/unit/day_two/test_rolling.py", "tests/unit/day_two/test_talos_health.py", "tests/providers/test_node_lifecycle.py"]),
    "removal": (["talos_proxmox/day_two/node_removal.py"], ["tests/unit/day_two/test_node_removal.py"]),
    "drain": (["talos_proxmox/day_two/node_drain.py"], ["tests/unit/day_two/test_node_drain.py", "tests/unit/day_two/test_rolling.py"]),
    "changes": (["talos_proxmox/day_two/node_changes.py"], ["tests/unit/day_two/test_node_changes.py"]),
}
# Modules whose tests start no gRPC channel or server (Pulumi's mocks run in process), safe to fork.
IN_FORK = {"settings", "render", "redaction", "changes"}
STARTUP_SECONDS = 30  # a fresh pytest's imports and collection, on a loaded 2-core machine
TIMED_OUT = 36  # mutmut's exit code for a timeout
TIMEOUTS = {-24, 24, 36, 152}  # mutmut's codes for a mutant stopped at its time limit (SIGXCPU)
KILLED = {1, 3, 255} | TIMEOUTS  # a failing test, an internal pytest error, or a timeout
SURVIVED = 0
USAGE_ERROR = 4  # pytest could not select a mutant's tests by their ids: counted as a survivor, and reported


def equivalent_mutants() -> dict[str, tuple[str, str]]:
    """mutant name -> (stamp, why it is equivalent), from the `name [stamp]: reason` lines of EQUIVALENT.

    mutmut numbers a function's mutants afresh when the function changes, so a name can come to mean
    another mutation; the stamp (`mutation_stamp`) is of the mutation that was judged equivalent, and
    an entry whose mutant no longer has it is stale: it counts as any other mutant until judged again."""
    if not EQUIVALENT.exists():
        return {}
    found = {}
    for line in EQUIVALENT.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            head, _, reason = line.partition(": ")
            name, _, stamp = head.partition(" ")
            found[name.strip()] = (stamp.strip("[] "), reason.strip())
    return found


def mutation_stamp(changed_lines: list[str]) -> str:
    """A short fingerprint of a mutant's changed lines (survivor_diffs), whatever its number."""
    import hashlib

    return hashlib.sha256("\n".join(changed_lines).encode()).hexdigest()[:10]


def judged_equivalent(module: str, equivalent: dict[str, tuple[str, str]]) -> tuple[set[str], list[str]]:
    """(the module's listed mutants that are still the mutation judged, the stale ones) of its last run."""
    names = [name for name in equivalent if name in results(module)]
    if not names:  # not run here, or nothing listed
        return set(), []
    diffs = survivor_diffs(module, names)
    still = {name for name in names if equivalent[name][0] == mutation_stamp(diffs[name])}
    return still, sorted(set(names) - still)


def stamp_equivalents(modules: list[str]) -> None:
    """Write the stamp of every listed mutant of `modules` that has none yet, printing what each one
    changes, so the judgement and the stamp are of the same mutation."""
    equivalent = equivalent_mutants()
    lines = EQUIVALENT.read_text().splitlines()
    for module in modules:
        names = [name for name in equivalent if name in results(module) and not equivalent[name][0]]
        diffs = survivor_diffs(module, names) if names else {}  # a module not run here has no mutants
        for index, line in enumerate(lines):
            name = line.partition(": ")[0].strip()
            if name in diffs:
                lines[index] = f"{name} [{mutation_stamp(diffs[name])}]: {equivalent[name][1]}"
                print(f"stamped {name}: {' / '.join(diffs[name])}")
    EQUIVALENT.write_text("\n".join(lines) + "\n")


def _setup_cfg(files: list[str], tests: list[str]) -> str:
    def listed(values):
        return "".join(f"\n    {value}" for value in values)

    return (f"[mutmut]\npaths_to_mutate ={listed(files)}\ntests_dir ={listed(tests)}\n"
            f"also_copy ={listed(PROJECT_PATHS)}\n"
            # -x: the first failing test kills the mutant; -p no:cacheprovider keeps the work tree clean
            "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n")


def prepare(module: str) -> Path:
    """The module's work directory: links to the project and a setup.cfg scoping mutmut to it."""
    files, tests = MODULES[module]
    work = WORK / module
    work.mkdir(parents=True, exist_ok=True)
    for path in PROJECT_PATHS:
        link = work / path
        if not link.is_symlink():
            if link.exists():
                shutil.rmtree(link) if link.is_dir() else link.unlink()
            link.symlink_to(ROOT / path)
    (work / "setup.cfg").write_text(_setup_cfg(files, tests))
    return work


def run(module: str, children: int, only: list[str] | None = None) -> None:
    """mutmut over the module; `only` names the mutants to retest (names or fnmatch patterns)."""
    work = prepare(module)
    started = time.monotonic()
    print(f"mutation: {module}: mutating {', '.join(MODULES[module][0])}"
          + (f", retesting {len(only)} survivors, timeouts and changed functions" if only is not None else ""),
          flush=True)
    if only == []:
        return
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    runner = "--as-mutmut-in-fork" if module in IN_FORK else "--as-mutmut"
    subprocess.run([sys.executable, str(Path(__file__).resolve()), runner, "run", "--max-children",
                    str(children), *(only or [])], cwd=work, env=env, check=False)
    print(f"mutation: {module}: done in {time.monotonic() - started:.0f}s", flush=True)


def _functions(source: str, suffix: str = "") -> dict[str, Any]:
    """mutmut's name of each function or method (x_<name>, xǁ<class>ǁ<name>) -> its ast node; with
    `suffix`, only the functions so named (their name without it). In a mutated file the names are
    mutmut's already: the original is `<name>__mutmut_orig`, each mutant `<name>__mutmut_<n>`."""
    import ast

    found = {}
    for node in ast.parse(source).body:
        methods = [(f"xǁ{node.name}ǁ", item) for item in node.body] if isinstance(node, ast.ClassDef) else []
        for prefix, item in [("x_", node), *methods]:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) or not item.name.endswith(suffix):
                continue
            name = item.name[:len(item.name) - len(suffix)] if suffix else item.name
            found[name if name.startswith(("x_", "xǁ")) else prefix + name] = item
    return found


def _code(node: Any) -> str:
    """A function's arguments and body, whatever its name and layout."""
    import ast

    return ast.dump(node.args) + ast.dump(ast.Module(body=node.body, type_ignores=[]))


def _function_changes(module: str) -> tuple[set[str], set[str]]:
    """(functions unchanged since the last run, functions changed or new), as `<module path>.<mangled>`."""
    unchanged, changed = set(), set()
    for path in MODULES[module][0]:
        dotted = path.removesuffix(".py").replace("/", ".")
        mutated = WORK / module / "mutants" / path
        before = ({name: _code(node) for name, node in _functions(mutated.read_text(), "__mutmut_orig").items()}
                  if mutated.exists() else {})
        for name, node in _functions((ROOT / path).read_text()).items():
            (unchanged if before.get(name) == _code(node) else changed).add(f"{dotted}.{name}")
    return unchanged, changed


def retest(module: str, children: int, equivalent: dict[str, tuple[str, str]]) -> None:
    """Retest the last run's survivors, timeouts (on a loaded machine a mutant's tests can pass the
    time limit without the mutant looping, so a timeout counts as a kill only once a quiet rerun
    confirms it) and mutants it did not reach (a run stopped part-way resumes), and every mutant of a
    function changed since, whose mutants mutmut numbers afresh; every other mutant keeps its last
    result, which mutmut's rerun would otherwise forget."""
    before = results(module)
    unchanged, changed = _function_changes(module)

    def function(name: str) -> str:
        return name.rsplit("__mutmut_", 1)[0]

    doubtful = [name for name in score(module, equivalent)[4]
                + [n for n, code in before.items() if code is None or code in TIMEOUTS]
                if function(name) in unchanged]
    # mutmut keeps which tests cover which function from its last run; new tests and new functions
    # would be missing from it (a new function's mutants then "have no tests"), so it is collected again.
    (WORK / module / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    run(module, children, doubtful + [f"{name}__mutmut_*" for name in sorted(changed)])
    for path in MODULES[module][0]:
        meta = WORK / module / "mutants" / (path + ".meta")
        data = json.loads(meta.read_text())
        for name, code in data["exit_code_by_key"].items():
            if code is None and function(name) in unchanged:
                data["exit_code_by_key"][name] = before.get(name)
        meta.write_text(json.dumps(data, indent=4))


def _fresh_test_processes() -> None:
    """mutmut's command line, with each mutant's tests run in a new pytest process (see the module doc).

    mutmut's wall-clock limit for a mutant is 15 times its tests' own time plus one second, made for
    tests run in the forked process itself; a fresh pytest first spends seconds importing, so the limit
    here also allows STARTUP_SECONDS. At the limit mutmut signals the forked process (SIGXCPU); it then
    ends its pytest's whole process group, which would otherwise run on and slow every later mutant."""
    from mutmut import __main__ as mutmut_main

    def run_tests(self, *, mutant_name, tests):
        args = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                *(tests or self._pytest_add_cli_args_test_selection)]
        env = {**os.environ, "MUTANT_UNDER_TEST": mutant_name or ""}
        child = subprocess.Popen(args, cwd="mutants", env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)

        def timed_out(_signum, _frame):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            os._exit(TIMED_OUT)

        signal.signal(signal.SIGXCPU, timed_out)
        return child.wait()

    def timeout_checker(mutants):
        def check_every_second():
            while True:
                time.sleep(1)
                now = datetime.now()
                for data, name, _result in mutants:
                    with mutmut_main.START_TIMES_BY_PID_LOCK:
                        started = dict(data.start_time_by_pid)
                    limit = (data.estimated_time_of_tests_by_mutant[name] + 1) * 15 + STARTUP_SECONDS
                    for pid, start in started.items():
                        if (now - start).total_seconds() > limit:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGXCPU)
        return check_every_second

    mutmut_main.PytestRunner.run_tests = run_tests
    mutmut_main.timeout_checker = timeout_checker
    sys.argv = ["mutmut", *sys.argv[2:]]
    mutmut_main.cli()


def _forked_test_runs() -> None:
    """mutmut's command line with its own forked runner, each child on a new asyncio event loop: the
    loop inherited from the parent (which ran Pulumi's mocked programs) waits on executor threads
    that do not exist after a fork."""
    import asyncio

    from mutmut import __main__ as mutmut_main

    run_in_fork = mutmut_main.PytestRunner.run_tests

    def run_tests(self, *, mutant_name, tests):
        asyncio.set_event_loop(asyncio.new_event_loop())
        try:
            return run_in_fork(self, mutant_name=mutant_name, tests=tests)
        except mutmut_main.BadTestExecutionCommandsException:
            # Left alone, the exception ends the child with 1, a "kill" no test made.
            return USAGE_ERROR

    mutmut_main.PytestRunner.run_tests = run_tests
    sys.argv = ["mutmut", *sys.argv[2:]]
    mutmut_main.cli()


def results(module: str) -> dict[str, int | None]:
    """mutant name -> mutmut's exit code (None: not run) from the module's last run."""
    exit_codes: dict[str, int | None] = {}
    for path in MODULES[module][0]:
        meta = WORK / module / "mutants" / (path + ".meta")
        if meta.exists():
            exit_codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return exit_codes


def score(module: str, equivalent: dict[str, tuple[str, str]]) -> tuple[int, int, int, int, list[str], list[str]]:
    """(mutants, checked, equivalent, killed, survivors, stale equivalents) of the module's last run; a run
    stopped part-way leaves mutants not checked, which count neither way."""
    exit_codes = results(module)
    still, stale = judged_equivalent(module, equivalent)
    checked = {name: code for name, code in exit_codes.items() if code is not None}
    same = [name for name in checked if name in still]
    counted = {name: code for name, code in checked.items() if name not in still}
    survivors = sorted(name for name, code in counted.items() if code not in KILLED)
    return len(exit_codes), len(checked), len(same), len(counted) - len(survivors), survivors, stale


def survivor_diffs(module: str, names: list[str]) -> dict[str, list[str]]:
    """mutant name -> its changed lines against the original function, read from mutmut's mutated files
    (each holds the original function and every mutant of it, named `x_<function>__mutmut_<n>`)."""
    import difflib

    functions: dict[str, str] = {}
    for path in MODULES[module][0]:
        source = (WORK / module / "mutants" / path).read_text()
        lines = source.splitlines()
        for name, node in _functions(source).items():
            functions[name] = "\n".join(lines[node.lineno - 1:node.end_lineno])
    diffs = {}
    for name in names:
        mutant = name.rsplit(".", 1)[1]
        function = mutant.rsplit("__mutmut_", 1)[0]
        original = functions.get(f"{function}__mutmut_orig", "").replace(f"{function}__mutmut_orig", function)
        changed = functions.get(mutant, "").replace(mutant, function)
        diffs[name] = [line.strip() for line in difflib.unified_diff(original.splitlines(), changed.splitlines(),
                                                                      lineterm="", n=0)
                       if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return diffs


def report(modules: list[str], diffs: bool = False) -> bool:
    equivalent = equivalent_mutants()
    print(f"{'module':<12}{'mutants':>9}{'checked':>9}{'equivalent':>12}{'killed':>8}{'score':>8}"
          f"{'timed out':>11}")
    ok = True
    for module in modules:
        total, checked, same, killed, survivors, stale = score(module, equivalent)
        if not checked:
            print(f"{module:<12}{'not run':>9}")
            ok = False
            continue
        ratio = killed / (checked - same)
        timeouts = sum(1 for code in results(module).values() if code in TIMEOUTS)
        ok = ok and ratio >= TARGET and checked == total
        print(f"{module:<12}{total:>9}{checked:>9}{same:>12}{killed:>8}{ratio:>8.1%}{timeouts:>11}")
        for name in stale:
            ok = False
            print(f"    stale equivalent: {name} (not the mutation judged equivalent, or not yet stamped: judge "
                  "it again, drop its stamp and run --stamp)")
        unselectable = sum(1 for code in results(module).values() if code == USAGE_ERROR)
        if unselectable:
            ok = False
            print(f"    {unselectable} mutants' tests could not be selected by their ids (pytest exit 4); they "
                  "count as survivors: give those tests ids pytest can select")
        changed = survivor_diffs(module, survivors) if diffs else {}
        for name in survivors:
            print(f"    survived: {name}")
            for line in changed.get(name, []):
                print(f"        {line}")
    return ok


def main(argv: list[str] | None = None) -> int:
    if sys.argv[1:2] == ["--as-mutmut"]:
        _fresh_test_processes()
        return 0
    if sys.argv[1:2] == ["--as-mutmut-in-fork"]:
        _forked_test_runs()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", metavar="module", help=f"of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--report", action="store_true", help="print the scores of the last runs only")
    parser.add_argument("--diffs", action="store_true", help="with each survivor, the lines its mutation changed")
    parser.add_argument("--survivors", action="store_true",
                        help="retest the last run's survivors and timeouts, and changed functions; keep the rest")
    parser.add_argument("--stamp", action="store_true",
                        help="stamp the listed equivalent mutants that have no stamp with their mutation, then report")
    parser.add_argument("--children", type=int, default=os.cpu_count() or 1, help="mutants tested at once")
    args = parser.parse_args(argv)
    unknown = [module for module in args.modules if module not in MODULES]
    if unknown:
        parser.error(f"no module {', '.join(unknown)}; expected one of {', '.join(MODULES)}")
    modules = args.modules or list(MODULES)
    if args.stamp:
        stamp_equivalents(modules)
    elif not args.report:
        equivalent = equivalent_mutants()
        for module in modules:
            if args.survivors:
                retest(module, args.children, equivalent)
            else:
                run(module, args.children)
    return 0 if report(modules, args.diffs) else 1


if __name__ == "__main__":
    sys.exit(main())
