"""The ``precompile-executor`` command: ``warm``, ``demo``, and one-line errors for bad input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from precompile_executor import stop_idle_workers
from precompile_executor.cli import EXIT_BAD_INPUT, EXIT_COMPILE_FAILED, EXIT_OK, main

REPO_ROOT = Path(__file__).resolve().parent.parent
COMMAND_TIMEOUT_S = 240.0
"""Longest a test waits for a ``precompile-executor`` subprocess."""

_GOOD_MODULE = """
import triton
import triton.language as tl
from precompile_executor.triton import TensorSpec, launch


@triton.autotune(
    configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 4), (256, 4), (512, 8))],
    key=["n"],
)
@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


x = TensorSpec("fp32", (4096,))
PRECOMPILE_SPECS = {"double_kernel": [launch(x, x, 4096)]}
"""

_FAILING_MODULE = """
import triton
import triton.language as tl
from precompile_executor.triton import TensorSpec, launch


@triton.autotune(configs=[triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 100})], key=[])
@triton.jit
def odd_block_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), 1.0)


PRECOMPILE_SPECS = {"odd_block_kernel": [launch(TensorSpec("fp32", (128,)))]}
"""

_NO_SPECS_MODULE = """
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=[])
@triton.jit
def unlisted_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), 1.0)
"""


@pytest.fixture(scope="module", autouse=True)
def _release_workers() -> Iterator[None]:
    yield
    stop_idle_workers()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _command(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-m", "precompile_executor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env=env,
    )


def _cache_groups(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.rglob("__grp__*.json"))


@pytest.mark.timeout(240)
def test_warm_compiles_every_config_of_a_file_into_the_cache_dir(tmp_path: Path) -> None:
    module = _write(tmp_path, "good_kernels.py", _GOOD_MODULE)
    cache_dir = tmp_path / "cache"
    result = _command(
        "warm",
        str(module),
        "--target",
        "cuda:90",
        "--jobs",
        "2",
        "--cache-dir",
        str(cache_dir),
        cwd=tmp_path,
    )
    assert result.returncode == EXIT_OK, result.stderr
    table = result.stdout
    assert "double_kernel" in table and "precompiled for cuda:90:32" in table
    row = next(line for line in table.splitlines() if "double_kernel" in line)
    assert [cell.strip() for cell in row.strip("│ ").split("│")][1:6] == ["3", "3", "0", "0", "0"]
    assert "speed-up over sequential" in table
    assert len(_cache_groups(cache_dir)) == 3
    assert "Traceback" not in result.stderr

    again = _command(
        "warm",
        str(module),
        "--target",
        "cuda:90",
        "--jobs",
        "2",
        "--cache-dir",
        str(cache_dir),
        cwd=tmp_path,
    )
    row = next(line for line in again.stdout.splitlines() if "double_kernel" in line)
    assert [cell.strip() for cell in row.strip("│ ").split("│")][1:4] == ["3", "0", "3"]


@pytest.mark.timeout(240)
def test_warm_imports_a_file_of_a_package_as_that_package_imports_it(tmp_path: Path) -> None:
    # kernels.py does `from .sizes import ...`: by path it is still `mylib.ops.kernels`, as
    # `python -m mylib.ops.kernels` would import it from the package's parent directory.
    package = tmp_path / "src" / "mylib"
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "sizes.py").write_text("N = 4096\n")
    relative = _GOOD_MODULE.replace(
        "from precompile_executor.triton import TensorSpec, launch",
        "from precompile_executor.triton import TensorSpec, launch\n\nfrom .sizes import N",
    ).replace("launch(x, x, 4096)", "launch(x, x, N)")
    module = _write(package / "ops", "kernels.py", relative)
    cache_dir = tmp_path / "cache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = _command(
        "warm", str(module), "--target", "cuda:90", "--jobs", "2", "--cache-dir", str(cache_dir),
        cwd=elsewhere,
    )  # fmt: skip
    assert result.returncode == EXIT_OK, result.stderr
    assert "double_kernel" in result.stdout
    assert len(_cache_groups(cache_dir)) == 3


@pytest.mark.timeout(30)
def test_a_package_file_shadowed_by_a_module_already_imported_is_named(tmp_path: Path) -> None:
    from precompile_executor.triton._discover import SpecsError, load_module

    shadow = tmp_path / "json"  # `json.decoder` is imported in this process already
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    (shadow / "decoder.py").write_text("")
    saved = list(sys.path)
    try:
        with pytest.raises(SpecsError, match=r"is the module json\.decoder, but json\.decoder"):
            load_module(str(shadow / "decoder.py"))
    finally:
        sys.path[:] = saved


@pytest.mark.timeout(120)
def test_warm_exits_1_and_names_an_unexpected_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _write(tmp_path, "failing_kernels.py", _FAILING_MODULE)
    status = main(
        [
            "warm",
            str(module),
            "--target",
            "cuda:90",
            "--jobs",
            "1",
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    out = capsys.readouterr().out
    assert status == EXIT_COMPILE_FAILED
    assert "FAILED (raise) odd_block_kernel[BLOCK=100" in out
    assert "CompilationError" in out and "power of 2" in out


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["warm", "no/such/file.py", "--target", "cuda:90"], "no such file: no/such/file.py"),
        (["warm", "no_such_module_xyz", "--target", "cuda:90"], "no such file or module"),
        (["warm", "json", "--target", "cuda:90"], "no @triton.autotune kernels found"),
        (
            ["warm", "precompile_executor.examples.kernels", "--target", "cuda:9x"],
            "unknown target 'cuda:9x'",
        ),
        (["demo", "--target", "metal:3"], "unknown target 'metal:3'"),
        (["demo", "--jobs", "0"], "--jobs must be at least 1"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(argv)
    captured = capsys.readouterr()
    assert status == EXIT_BAD_INPUT
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err
    assert lines[0].startswith("precompile-executor: error: ")
    assert captured.out == ""


@pytest.mark.timeout(60)
def test_a_module_with_autotuned_kernels_but_no_specs_is_told_what_to_add(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _write(tmp_path, "unlisted_kernels.py", _NO_SPECS_MODULE)
    assert main(["warm", str(module), "--target", "cuda:90"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "unlisted_kernel" in err and "PRECOMPILE_SPECS" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.timeout(60)
def test_bad_input_through_python_m_prints_no_traceback(tmp_path: Path) -> None:
    result = _command("warm", "missing.py", "--target", "cuda:90", cwd=tmp_path)
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip() == "precompile-executor: error: no such file: missing.py"
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(60)
def test_the_console_script_is_the_same_command(tmp_path: Path) -> None:
    script = shutil.which("precompile-executor") or str(
        Path(sys.executable).with_name("precompile-executor")
    )
    if not Path(script).exists():
        pytest.skip("the package is not installed, so its console script is not either")
    result = subprocess.run(
        [script, "warm", "--help"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert result.returncode == 0 and "PRECOMPILE_SPECS" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_compiles_every_bundled_config_without_a_gpu(tmp_path: Path) -> None:
    from precompile_executor.examples import kernels

    expected = sum(
        len(getattr(kernels, name).configs) * len(launches)
        for name, launches in kernels.PRECOMPILE_SPECS.items()
    )
    cache_dir = tmp_path / "demo-cache"
    result = _command("demo", "--jobs", "2", "--cache-dir", str(cache_dir), cwd=tmp_path)
    assert result.returncode == EXIT_OK, result.stderr
    total = next(line for line in result.stdout.splitlines() if "total" in line)
    cells = [cell.strip() for cell in total.strip("│ ").split("│")]
    assert cells[1:6] == [str(expected), str(expected), "0", "0", "0"]
    assert len(_cache_groups(cache_dir)) == expected
    assert {"matmul_kernel", "softmax_kernel", "layer_norm_kernel", "add_gelu_kernel"} <= {
        line.split("│")[1].strip() for line in result.stdout.splitlines() if line.count("│") > 5
    }
