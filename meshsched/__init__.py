"""meshsched: a scheduler for deep-learning training on clusters of GPU servers."""

from os.path import dirname as _dirname

# In a checkout, cli/, daemon/ and profiles/ sit beside this folder and install as meshsched.cli, .daemon and
# .profiles (pyproject's package-dir). Searching the folder above this one as well lets the checkout alone on
# sys.path find them: an editable install in compat mode (one plain .pth line: see .ci/run), or `python -m
# meshsched.daemon.main` run in the checkout. setuptools' default editable install instead loads a path finder at
# every interpreter start (pathlib, re, urllib: ~15 ms CPU, half of `python -c pass`, paid by every `mesh`).
# Installed from a wheel they sit inside this folder, which is searched first: the folder above (site-packages)
# answers only for a name meshsched does not have.
__path__.append(_dirname(__path__[0]))  # noqa: F821 (a package's __path__)
