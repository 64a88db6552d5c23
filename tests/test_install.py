"""The project installs as one namespace, `mbrl`: a wheel built from the source tree goes into a fresh venv beside
another package whose top-level module is `envs`, and both import (the folders agents/, envs/ and world_models/
install as mbrl.agents, mbrl.envs and mbrl.world_models; pyproject.toml lists every package folder)."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns(".venv*", ".git", "runs", "build", "results", "*.egg-info", "__pycache__", ".pytest_cache")

OTHER_PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "other-envs"
version = "1.0"

[tool.setuptools]
packages = ["envs"]
"""


def build_wheel(source: Path, out: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                           "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = [w for w in out.glob("*.whl") if w.name.startswith(source.name.replace("-", "_"))]
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv (its dependencies read from this environment's site-packages) holding both wheels."""
    tmp = tmp_path_factory.mktemp("install")
    project = tmp / "offline_mbrl"
    shutil.copytree(ROOT, project, ignore=IGNORED)
    other = tmp / "other_envs"
    (other / "envs").mkdir(parents=True)
    (other / "pyproject.toml").write_text(OTHER_PYPROJECT)
    (other / "envs" / "__init__.py").write_text('OWNER = "other-envs"\n')
    wheels = [build_wheel(project, tmp / "wheels"), build_wheel(other, tmp / "wheels")]

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    (own_site,) = [Path(p) for p in subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                                                    capture_output=True, text=True, check=True).stdout.split()]
    # The dependencies (jax, mujoco, ...) and pip come from this environment, after the venv's own packages.
    (own_site / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *map(str, wheels)],
                          capture_output=True, text=True, timeout=300, cwd=tmp)
    assert done.returncode == 0, done.stderr
    return {"python": python, "site": own_site, "wheel": wheels[0], "cwd": tmp}


@pytest.mark.slow
def test_the_wheel_puts_nothing_but_mbrl_at_the_top_and_holds_every_module(installed):
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = wheel.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"mbrl"}
    shipped = {name for name in names if name.endswith(".py")}
    expected = {f"mbrl/{p.relative_to(ROOT)}" if p.parts[len(ROOT.parts)] != "mbrl" else str(p.relative_to(ROOT))
                for folder in ("mbrl", "agents", "envs", "world_models") for p in (ROOT / folder).rglob("*.py")}
    assert shipped == expected
    assert "mbrl/envs/behaviour/hopper_medium.json" in names  # package data travels with its folder


@pytest.mark.slow
def test_the_project_and_another_top_level_envs_package_both_import(installed):
    script = (
        "import envs, mbrl.envs.tasks, mbrl.agents.registry, mbrl.world_models.fit, mbrl.cli\n"
        "print(envs.OWNER, mbrl.envs.tasks.__file__.startswith(%r))\n" % str(installed["site"])
    )
    done = subprocess.run([installed["python"], "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=installed["cwd"], env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["other-envs", "True"]
    listing = subprocess.run([installed["python"].parent / "mbrl", "data", "list"], capture_output=True, text=True,
                             timeout=300, cwd=installed["cwd"], env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu",
                                                                     "MBRL_DATA_DIR": str(installed["cwd"] / "data")})
    assert listing.returncode == 0, listing.stderr
    assert "hopper" in listing.stdout
