"""Kept for ``python setup.py ...`` habits; the project is configured in pyproject.toml."""

from setuptools import setup

setup()
