"""The metric library stays pure: importing every module loads neither torch nor Dagster."""

import subprocess
import sys

MODULES = ["answers", "seper", "erag", "mirage", "consens", "utility", "ranking", "stats"]


def test_metrics_import_without_torch_or_dagster() -> None:
    code = (
        "import sys\n"
        + "".join(f"import ragutil_dagster.metrics.{m}\n" for m in MODULES)
        + "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'dagster', 'transformers'})\n"
        + "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_public_function_cites_its_source() -> None:
    import importlib
    import inspect

    for name in MODULES:
        module = importlib.import_module(f"ragutil_dagster.metrics.{name}")
        assert module.__doc__, f"{name} has no module docstring"
        for attr, value in vars(module).items():
            if (
                inspect.isfunction(value)
                and not attr.startswith("_")
                and value.__module__ == module.__name__
            ):
                assert value.__doc__, f"{name}.{attr} has no docstring"
