"""The package list for setuptools, found rather than written by hand: every package under rope_ext/, evals/ and
hydra_plugins/ (a new one ships without a line anywhere), plus conf/ as ``evals.conf`` and its groups
(pyproject.toml maps the directory, ``[tool.setuptools.package-dir]``, and names the YAMLs they ship).

Everything else is in pyproject.toml. Its own ``[tool.setuptools.packages.find]`` cannot do this: it finds
packages by their directories, so it cannot find ``evals.conf``, whose directory package-dir moves to conf/
(and a list there replaces, rather than extends, the one found).
"""

from setuptools import find_namespace_packages, setup

CODE = find_namespace_packages(include=["rope_ext*", "evals*", "hydra_plugins*"], exclude=["*__pycache__"])
CONF = ["evals.conf", *(f"evals.conf.{group}" for group in find_namespace_packages("conf", exclude=["*__pycache__"]))]

setup(packages=CODE + CONF)
