"""The package's layering, read from its import graph (``ast``; nothing is imported).

Data flows up the layers (docs/architecture.md): a module may import its own
layer and any layer below it, never one above. The graph is parsed from the
source, so lazy imports inside functions count too. Below them, which modules
of the bundled trainer (reference_train) mlxcluster may import: those that
import no mlx.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlxcluster"

# Lowest first, one package (or top-level module) per layer. A name stands for
# that module and everything under it; the bare package ("mlxcluster", for
# __version__) only for itself.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("mlxcluster", "mlxcluster.errors", "mlxcluster.outputs", "mlxcluster.interrupts")),
    ("ssh", ("mlxcluster.ssh",)),
    # Files to and from hosts (over ssh, or the doctor's connections): below
    # doctor (its fixes send wheels) and jobs (a rank host's link).
    ("transfer", ("mlxcluster.transfer",)),
    ("inventory", ("mlxcluster.inventory",)),
    ("facts", ("mlxcluster.facts",)),
    ("topology", ("mlxcluster.topology",)),
    ("hostfile", ("mlxcluster.hostfile",)),
    # Will this model fit these hosts, split this way (the model folder, the
    # families, the tensor/pipeline verdict, train's stages by memory): read
    # from facts; below doctor (its model-split check), launch (train's stage
    # placement) and serve.
    ("fit", ("mlxcluster.fit",)),
    # Above hostfile: doctor's checks compare a hostfile with the cabling and
    # print the IP plan as a fix.
    ("doctor", ("mlxcluster.doctor",)),
    # One program on every rank: plan, start, watch, stop, restart.
    ("jobs", ("mlxcluster.jobs",)),
    # The smoke worker's runs, through jobs.
    ("smoke", ("mlxcluster.smoke",)),
    # tune measures candidates with smoke's benchmark.
    ("tune", ("mlxcluster.tune",)),
    # What run, train and serve add around a job: the job from the launch
    # flags, the launch session, preflight (doctor, smoke's all_sum), the
    # trainer hand-off, the record, data on every host.
    ("launch", ("mlxcluster.launch",)),
    # A model served on every rank, through the launch session: the request,
    # the supervision (probe, tunnel, the one address here).
    ("serve", ("mlxcluster.serve",)),
    ("report", ("mlxcluster.report",)),
    # Above report: the demo runs every command, then writes the HTML report.
    ("demo", ("mlxcluster.demo",)),
    ("cli", ("mlxcluster.cli", "mlxcluster.__main__")),
]


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the most specific name that covers ``module``."""
    best: tuple[int, int] | None = None  # (length of the name, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if name == "mlxcluster":
                covers = module == name
            else:
                covers = module == name or module.startswith(name + ".")
            if covers and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(module: str, source: str, is_package: bool, known: set[str],
                     root: str = "mlxcluster") -> set[str]:
    """The modules under ``root`` that ``module`` imports (``from X import
    name`` counts as X.name when that is a module, else as X)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m == root or m.startswith(root + ".")}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = module_files(package)
    known = set(files)
    return {m: imported_modules(m, path.read_text(encoding="utf-8"), path.name == "__init__.py", known)
            for m, path in files.items()}


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a higher layer, and every module no layer covers."""
    problems = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        if mine is None:
            problems.append(f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)")
            continue
        for target in sorted(targets):
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                problems.append(f"{module} ({LAYERS[mine][0]}) imports {target} "
                                f"({LAYERS[theirs][0]}, a higher layer)")
    return problems


def test_no_module_imports_a_higher_layer():
    assert violations(import_graph()) == []


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    # Edges known to exist, of each import form the package uses.
    assert "mlxcluster.doctor.doctor" in graph["mlxcluster.cli.doctor"]  # from X.Y import name
    assert "mlxcluster.interrupts" in graph["mlxcluster.cli"]  # from mlxcluster import module
    assert "mlxcluster" in graph["mlxcluster.cli"]  # from mlxcluster import __version__
    assert "mlxcluster.topology.topology" in graph["mlxcluster.report"]  # inside a function
    assert len(graph) > 80


def test_a_higher_import_is_caught():
    graph = {"mlxcluster.facts.facts": {"mlxcluster.doctor.doctor", "mlxcluster.errors"},
             "mlxcluster.doctor.doctor": {"mlxcluster.facts.facts"}}
    assert violations(graph) == ["mlxcluster.facts.facts (facts) imports mlxcluster.doctor.doctor "
                                 "(doctor, a higher layer)"]


def test_a_module_in_no_layer_is_caught():
    assert violations({"mlxcluster.newthing": set()}) == [
        "mlxcluster.newthing is in no layer: add it to LAYERS (and docs/architecture.md)"]


def test_relative_imports_resolve_like_python():
    known = {"mlxcluster.errors", "mlxcluster.ssh.remote", "mlxcluster.ssh.openssh",
             "mlxcluster.doctor.checks.base"}
    source = "from ... import errors\nfrom ...ssh.openssh import ssh_argv\nfrom .base import x\n"
    assert imported_modules("mlxcluster.doctor.checks.jaccl", source, False, known) == {
        "mlxcluster.errors", "mlxcluster.ssh.openssh", "mlxcluster.doctor.checks.base"}
    assert imported_modules("mlxcluster.ssh", "from . import remote\n", True, known) == {
        "mlxcluster.ssh.remote"}


def test_every_name_in_the_layers_is_a_module_that_exists():
    modules = set(module_files())
    missing = [name for _, names in LAYERS for name in names if name not in modules]
    assert missing == []


def test_no_circle_between_modules():
    """No two modules import each other, however far round (lazy imports
    inside functions count: they only hide a circle)."""
    graph = import_graph()
    assert circles(graph) == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of the import graph, by its strongly connected components
    (Tarjan's algorithm); a package's ``__init__`` importing its own modules
    is no cycle unless they import it back."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in graph or target == node:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_a_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded into mlxcluster's packages (and loose top
    modules): ``mlxcluster.serve.front`` counts as ``serve``."""
    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]
    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(package(module), set()).update(
            package(t) for t in targets if package(t) != package(module))
    return folded


def test_no_package_imports_another_in_a_loop():
    """Packages, not only modules: a package that imports another which
    imports it back, however far round, holds knowledge in the wrong room
    (a TYPE_CHECKING import counts: it is knowledge too)."""
    assert circles(package_graph(import_graph())) == []


def test_a_package_loop_is_found_through_different_modules():
    graph = {"mlxcluster.doctor.checks.model_split": {"mlxcluster.serve.split"},
             "mlxcluster.serve.serving": {"mlxcluster.launch.program"},
             "mlxcluster.launch.preflight": {"mlxcluster.doctor.doctor"},
             "mlxcluster.serve.split": set(), "mlxcluster.launch.program": set(),
             "mlxcluster.doctor.doctor": set()}
    assert circles(graph) == []  # no module loop ...
    assert circles(package_graph(graph)) == [["doctor", "launch", "serve"]]  # ... a package loop


def test_the_cli_only_renders():
    """The command line parses, calls the library and renders what it
    returns: no cli module opens an SSH connection of its own or diagnoses
    output itself (the outcome carries its known errors)."""
    graph = import_graph()
    reaching = sorted(f"{module} imports {target}" for module, targets in graph.items()
                      if module.startswith("mlxcluster.cli") for target in targets
                      if target.startswith(("mlxcluster.ssh", "mlxcluster.doctor.known_errors",
                                            # libmpi found, the IP plan applied: the library's
                                            "mlxcluster.facts.mpi", "mlxcluster.hostfile.ipplan")))
    assert reaching == []


TESTS = Path(__file__).resolve().parent


def imports_of_test_modules(files: dict[str, Path]) -> list[str]:
    """Every import, by any module under tests/, of a test module (one named
    ``test_*.py``) other than itself; conftest and ``*_support`` are for sharing."""
    known = set(files)
    offenders = []
    for module, path in sorted(files.items()):
        targets = imported_modules(module, path.read_text(encoding="utf-8"),
                                   path.name == "__init__.py", known, root="tests")
        offenders.extend(f"{module} imports {target}" for target in sorted(targets)
                         if target != module and target.split(".")[-1].startswith("test_"))
    return offenders


def test_modules_imported_between_tests():
    """No test module imports another: what tests share lives in a
    ``*_support.py`` module (or conftest), so that running one test file
    never runs, nor depends on, another's module."""
    assert imports_of_test_modules(module_files(TESTS)) == []


def test_a_test_module_imported_by_another_is_caught(tmp_path):
    tests = tmp_path / "tests"
    (tests / "lab").mkdir(parents=True)
    for name in ("__init__.py", "lab/__init__.py", "train_support.py", "conftest.py"):
        (tests / name).write_text("")
    sources = {
        "test_train_launch.py": "from .train_support import x\nimport tests.conftest\n",
        "test_train_pipeline_launch.py": "from tests.test_train_launch import launched\n",
        "test_resplit.py": "def f():\n    from . import test_pipeline\n",
        "test_pipeline.py": "",
        "lab/test_model_split_lab.py": "from tests.lab import test_fix_macos_lab\n",
        "lab/test_fix_macos_lab.py": "",
        "lab/macos_support.py": "from ..test_pipeline import helper\n",
    }
    for name, source in sources.items():
        (tests / name).write_text(source)
    assert imports_of_test_modules(module_files(tests)) == [
        "tests.lab.macos_support imports tests.test_pipeline",
        "tests.lab.test_model_split_lab imports tests.lab.test_fix_macos_lab",
        "tests.test_resplit imports tests.test_pipeline",
        "tests.test_train_pipeline_launch imports tests.test_train_launch",
    ]


def test_each_package_has_its_own_layer():
    assert layer_of("mlxcluster.launch.trainer") > layer_of("mlxcluster.jobs.run")
    assert layer_of("mlxcluster.launch.preflight") > layer_of("mlxcluster.smoke.run")
    assert layer_of("mlxcluster.smoke.run") > layer_of("mlxcluster.jobs.run")
    assert layer_of("mlxcluster.serve.serving") > layer_of("mlxcluster.launch.session")
    assert layer_of("mlxcluster.fit.split_check") < layer_of("mlxcluster.doctor.checks.model_split")
    assert layer_of("mlxcluster.cli.train") == len(LAYERS) - 1
    assert layer_of("mlxcluster.errors") == 0
    assert layer_of("mlxcluster.errors_extra") is None


def test_only_shared_modules_are_loose_at_the_top_of_the_package():
    """Every stage lives in its package; the top holds what all share."""
    loose = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__", "__main__", "demo", "errors", "interrupts", "outputs"]


# ---------------------------------------------------------------- reference_train

# The trainer's modules mlxcluster may import, on the machine that runs it (where
# MLX may be missing, or slow to load): the trainer's settings (config: `mlxcluster
# train` parses the trainer's arguments before it launches), the record and
# heartbeat protocols (metrics), the token files (data), and what those rest on.
# None of them imports mlx, however far down (checked below).
TRAINER_MODULES_FOR_MLXCLUSTER = frozenset({
    "reference_train.config", "reference_train.metrics", "reference_train.data",
    "reference_train.errors", "reference_train.files", "reference_train.storage",
    # what config imports (stages: --pipeline's split, planned from the safetensors headers)
    "reference_train.choices", "reference_train.shape", "reference_train.fine_tune",
    "reference_train.stages",
})
TRAINER = PACKAGE.parent / "reference_train"


def trainer_imports(path: Path) -> set[str]:
    """Every module ``path`` (a file of reference_train) imports, by its full name,
    lazy imports inside functions too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "reference_train" if node.level == 1 else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if (TRAINER / f"{alias.name}.py").is_file() and not node.module
                          else target)
    return found


def trainer_modules_imported_by_mlxcluster() -> dict[str, set[str]]:
    """reference_train module -> the mlxcluster modules that import it."""
    users: dict[str, set[str]] = {}
    for module, path in module_files().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [])
            for name in names:
                if name == "reference_train" or name.startswith("reference_train."):
                    users.setdefault(name, set()).add(module)
    return users


def test_mlxcluster_imports_only_the_trainer_modules_named_here():
    imported = trainer_modules_imported_by_mlxcluster()
    assert imported, "the scan found no import of reference_train"
    others = {m: sorted(users) for m, users in imported.items()
              if m not in TRAINER_MODULES_FOR_MLXCLUSTER}
    assert others == {}, ("mlxcluster imports trainer modules that may load mlx; add one to "
                          "TRAINER_MODULES_FOR_MLXCLUSTER only when it imports no mlx")


def test_the_trainer_modules_mlxcluster_imports_import_no_mlx():
    """Read from the source, the whole closure: each named module's imports within
    reference_train are named here too, and none is mlx or mlx_lm."""
    for module in sorted(TRAINER_MODULES_FOR_MLXCLUSTER):
        imports = trainer_imports(TRAINER / f"{module.split('.')[-1]}.py")
        assert not {m for m in imports if m.split(".")[0] in ("mlx", "mlx_lm")}, module
        inner = {m for m in imports if m.startswith("reference_train.")}
        assert inner <= TRAINER_MODULES_FOR_MLXCLUSTER, (module, inner - TRAINER_MODULES_FOR_MLXCLUSTER)


def test_a_trainer_module_that_imports_mlx_is_caught():
    assert "mlx.core" in trainer_imports(TRAINER / "model.py")
    assert "reference_train.shape" in trainer_imports(TRAINER / "model.py")
    assert "reference_train.fine_tune" in trainer_imports(TRAINER / "config.py")


def test_parsing_the_trainers_arguments_loads_no_mlx():
    """`mlxcluster train` parses the trainer's arguments (the config every rank
    builds) without loading MLX: in a fresh interpreter, by what lands in sys.modules."""
    probe = (
        "import sys\n"
        "import reference_train.config\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'mlx'], 'config imports mlx'\n"
        "from mlxcluster.launch.trainer import parse_trainer_args\n"
        "args = parse_trainer_args(('--config', 'tiny', '--fine_tune', 'dora', '--init_from', 'x',"
        " '--dtype', 'bfloat16', '--kernels', 'mlx'))\n"
        "assert args.config.fine_tune == 'dora' and args.config.dtype == 'bfloat16'\n"
        f"for name in {sorted(TRAINER_MODULES_FOR_MLXCLUSTER)!r}:\n"
        "    __import__(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm'))\n"
        "assert not loaded, loaded\n"
        "print('no mlx')\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=PACKAGE.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["no", "mlx"]


def code_strings(source: str) -> list[str]:
    """The string constants of ``source`` that are not docstrings (what the
    code says or matches, not what its prose explains)."""
    tree = ast.parse(source)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs]


# What only a program, or the commands above jobs/, know: the trainer's
# module, its --out and --progress, and the launching commands' run-id prefixes (each
# registers its own: jobs/running.py register_run_kind).
PROGRAM_WORDS = ("reference_train.train", "--out", "--progress", "mlxtrain", "mlxrun", "mlxserve")


def test_jobs_knows_no_program():
    """The jobs layer runs one program on every rank, whichever it is: no
    string in its code names the trainer, its --out, or a command's run ids
    (attach's record-following lives in launch/attach.py)."""
    found = sorted(f"{path.relative_to(PACKAGE.parent)}: {text!r}"
                   for path in sorted((PACKAGE / "jobs").rglob("*.py"))
                   for text in code_strings(path.read_text(encoding="utf-8"))
                   if any(word in text for word in PROGRAM_WORDS))
    assert found == []


def test_a_program_word_in_code_is_found_and_one_in_a_docstring_is_not():
    source = '"""Runs -m reference_train.train."""\nX = "mlxtrain"\n'
    assert code_strings(source) == ["mlxtrain"]


# A job's outcome, read to decide what to say (launch/supervisor.py ``ending``
# reads them once, for run, train, serve and attach).
OUTCOME_LADDER = ("asked_to_stop", "refusal", "lost_host", "failed_rank", "refused_at_start",
                  "signalled_host", "usage_words")


def test_no_cli_module_says_a_job_outcome_itself():
    """One function says any job's end (launch/supervisor.py ``ending``) and
    one renders it (cli/job_launch.py ``render_ending``): no cli module reads
    the outcome's ladder or names the exit code of a stop asked for."""
    found = []
    for path in sorted((PACKAGE / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = node.attr if isinstance(node, ast.Attribute) else \
                node.id if isinstance(node, ast.Name) else None
            if name in OUTCOME_LADDER or name == "EXIT_STOPPED_WHEN_ASKED":
                found.append(f"{path.name}:{node.lineno} {name}")
    assert found == []


# The most parameters a library function may take (*rest and **flags count as one
# each): today's worst (serve/serving.py's _serve, jobs/plan.py's planners, run_doctor).
# A CLI command takes what its flags are (click), and hands the library one request
# (doctor/request.py's DoctorRequest) or a few values: what the library takes is bounded.
MOST_PARAMETERS = 11


def parameter_counts(source: str) -> list[tuple[str, int]]:
    """(function name, how many parameters it takes) for every function in ``source``."""
    counts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            named = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
            counts.append((node.name, named + bool(a.vararg) + bool(a.kwarg)))
    return counts


def test_no_library_function_takes_more_parameters_than_the_bound():
    """serve_until_stopped took 12 parameters because the CLI assembled its front,
    address and journal (issue 45): the CLI was deciding. A library function past the
    bound fails here; cli/ is not bounded (a command takes its flags)."""
    over = []
    for module, path in sorted(module_files().items()):
        if layer_of(module) == len(LAYERS) - 1:
            continue
        over += [f"{module}.{name} takes {n} > {MOST_PARAMETERS}"
                 for name, n in parameter_counts(path.read_text(encoding="utf-8"))
                 if n > MOST_PARAMETERS]
    assert over == []


def test_a_function_past_its_bound_is_counted():
    source = ("def command(a, b, /, c, *rest, d=1, **flags):\n    pass\n"
              "class Probe:\n    def __init__(self, x):\n        pass\n")
    assert parameter_counts(source) == [("command", 6), ("__init__", 2)]
